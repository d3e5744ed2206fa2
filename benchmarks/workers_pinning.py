"""Timing spread of two CPU workers measuring at once (`--workers 2`), pinned to their own cores or free.

Run: python benchmarks/workers_pinning.py [--problem examples/softmax] [--rounds 6] [--mode pinned|free]

Both slots of `LocalSlots(2, "cpu")` measure the problem's `fast.py` at the same time, `--rounds` times, as a search
with two workers does. `pinned` is what `--workers 2` does (each worker on its own share of the cores, fixed
before candidate code runs); `free` caps each worker's thread count but lets it run on every core, as before the
thirty-eighth session. Prints every speedup and the spread (max - min over the median) of all of them.
"""

from __future__ import annotations

import argparse
import statistics
import threading
from pathlib import Path

from kernelscout.agent import dispatch
from kernelscout.agent.dispatch import LocalSlots
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.problem import load_candidate, load_problem
from kernelscout.sandbox.slot import CodeJob


def measure_together(slots: LocalSlots, job: CodeJob) -> list:
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, slots.call(i, job))) for i in range(len(slots.slots))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i].measurement for i in range(len(slots.slots))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="examples/softmax", help="a folder with problem.py and fast.py")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--mode", choices=["pinned", "free"], default="pinned")
    args = ap.parse_args()
    folder = Path(args.problem)
    job = CodeJob.from_files(load_problem(folder / "problem.py"), load_candidate(folder / "fast.py"), HarnessConfig())
    if args.mode == "free":
        dispatch.cpu_shares = lambda n, threads: [()] * n  # capped thread counts, no pin
    slots = LocalSlots(2, "cpu")
    print(slots.describe())
    speedups: list[list[float]] = [[], []]
    try:
        for _ in range(args.rounds):
            for i, m in enumerate(measure_together(slots, job)):
                if m.status.value != "ok" or not m.timing_valid:
                    raise SystemExit(f"slot {i}: {m.status.value} {m.message or m.timing_invalid_reason}")
                speedups[i].append(m.speedup)
    finally:
        slots.close()
    every = speedups[0] + speedups[1]
    med = statistics.median(every)
    for i, s in enumerate(speedups):
        print(f"slot {i}: " + " ".join(f"{v:.3f}x" for v in s))
    print(f"{args.mode}: median {med:.3f}x, min {min(every):.3f}x, max {max(every):.3f}x, spread {100 * (max(every) - min(every)) / med:.1f}%")


if __name__ == "__main__":
    main()
