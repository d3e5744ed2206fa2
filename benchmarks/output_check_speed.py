"""How long the output check (`correctness.compare`) takes on large outputs, on this machine's CPU.

Run: python benchmarks/output_check_speed.py [--repeats 3]
Prints a markdown table for docs/benchmarks.md.

A measurement compares the candidate's output with the reference's in every correctness trial and in every
re-checked timed round (about 8·ln(n) of n rounds), so on a problem with a 16M-element output the check's own
time is a large share of a measurement's wall time. The rows cover the shorter way a finite real output takes
and the general one (complex components, non-finite values matched in kind), which an output with one NaN on
both sides takes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernelscout.sandbox.correctness import compare


def _case(kind: str, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    side = int(n ** 0.5)
    if kind == "complex64":
        r = torch.randn(side, side, dtype=torch.complex64, generator=gen)
        return r + 1e-7 * torch.randn(side, side, dtype=torch.complex64, generator=gen), r
    dtype = {"float32": torch.float32, "float16": torch.float16, "float32 with a NaN on both sides": torch.float32}[kind]
    r = torch.randn(side, side, generator=gen).to(dtype)
    c = (r.float() * (1 + 1e-6)).to(dtype)
    if "NaN" in kind:
        r[0, 0] = c[0, 0] = float("nan")
    return c, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}\n")
    print("| output | elements | compare, s |")
    print("|---|---|---|")
    for kind in ("float32", "float16", "float32 with a NaN on both sides", "complex64"):
        for n in (2**20, 2**24):
            c, r = _case(kind, n, gen)
            compare([c], [r])  # warm
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                compare([c], [r])
                times.append(time.perf_counter() - t0)
            print(f"| {kind} | {c.numel():,} | {statistics.median(times):.3f} |", flush=True)


if __name__ == "__main__":
    main()
