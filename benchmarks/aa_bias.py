"""An A/A check of the measurement harness: a candidate whose code is the reference's own must read 1.0x.

Run: python benchmarks/aa_bias.py [--repeats 5] [--device cpu]
Prints a markdown table for docs/benchmarks.md.

Any difference in what the harness does around the two sides' timed calls (checks before one side's call
that the other's does not get, the order of the calls) shows up here as a speedup that is not real, and
most on the smallest problems, where a microsecond of cold cache is a tenth of the call. So the problems
span call times from about 20 microseconds to a few milliseconds. Each row is `repeats` separate
measurements (`measure` with again=True, a new worker each), in one process, one after the other.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from kernelscout.sandbox.pool import WorkerPool
from kernelscout.tools.measure import MeasureRequest, measure

PROBLEMS = {
    "add, 4 elements": ("x + 1", "[torch.randn(4)]"),
    "relu-add, 64 K elements": ("torch.relu(x * 1.5) + x", "[torch.randn(256, 256)]"),
    "matmul 512 x 512": ("x @ x", "[torch.randn(512, 512)]"),
}

SOURCE = """
import torch
import torch.nn as nn

class {cls}(nn.Module):
    def forward(self, x):
        return {body}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return []
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp, WorkerPool() as pool:
        for name, (body, inputs) in PROBLEMS.items():
            folder = Path(tmp) / name.replace(" ", "_").replace(",", "")
            folder.mkdir()
            (folder / "problem.py").write_text(SOURCE.format(cls="Model", body=body, inputs=inputs))
            (folder / "same.py").write_text(SOURCE.format(cls="ModelNew", body=body, inputs=inputs))
            speedups, ref_ms, valid, firsts, afters = [], [], 0, [], []
            for _ in range(args.repeats):
                m = measure(MeasureRequest(problem=str(folder / "problem.py"), candidate=str(folder / "same.py"), device=args.device,
                                           run_dir=f"{tmp}/run", again=True), pool=pool)
                if m.speedup is not None:
                    speedups.append(m.speedup)
                    ref_ms.append(m.ref_runtime_ms)
                for check in m.checks:  # the harness's speedups from each call position (sandbox/stats.py)
                    if found := re.match(r"speedup by call order: ([0-9.]+)x .*?, ([0-9.]+)x", check):
                        firsts.append(float(found[1]))
                        afters.append(float(found[2]))
                valid += bool(m.timing_valid)
            rows.append((name, statistics.median(ref_ms) if ref_ms else None, speedups, valid, firsts, afters))
            print(f"{name}: {' '.join(f'{s:.3f}' for s in speedups)}", flush=True)
    print(f"\n{started}, device {args.device}, {args.repeats} measurements per problem\n")
    print("| problem | reference call (median) | speedups of the same code | median | timing valid "
          "| median from calls first in their round / right after the other's |")
    print("|---|---|---|---|---|---|")
    for name, ms, speedups, valid, firsts, afters in rows:
        call = f"{ms * 1e3:.0f} µs" if ms is not None and ms < 1 else (f"{ms:.2f} ms" if ms is not None else "-")
        med = f"{statistics.median(speedups):.3f}x" if speedups else "-"
        positions = f"{statistics.median(firsts):.3f}x / {statistics.median(afters):.3f}x" if firsts else "-"
        print(f"| {name} | {call} | {', '.join(f'{s:.3f}' for s in speedups)} | {med} | {valid} of {args.repeats} | {positions} |")


if __name__ == "__main__":
    main()
