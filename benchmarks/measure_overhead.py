"""How much a measurement costs beyond the timed work, and how much it moves between runs.

Run: python benchmarks/measure_overhead.py [--problem P --candidate C] [--repeats 5]
Prints a markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.tools.measure import MeasureRequest, measure

REPO = Path(__file__).resolve().parents[1]

SMALL_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x * 1.5 + y) + 0.5 * x

def get_inputs():
    return [torch.randn(256, 512), torch.randn(256, 512)]

def get_init_inputs():
    return []
"""
SMALL_CANDIDATE = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(x * 1.5 + y).add_(x, alpha=0.5)
"""


def timed_work_s(m) -> float:
    """Seconds spent inside timed calls (both sides, timed rounds only)."""
    return sum(t.mean_ms * t.repeats for t in (m.candidate_timing, m.reference_timing)) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--problem", default="", help="problem file [default: a small built-in elementwise problem]")
    ap.add_argument("--candidate", default="")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timing-budget", type=float, default=HarnessConfig().timing_budget_s)
    ap.add_argument("--loop-overhead", type=float, default=HarnessConfig().loop_overhead_s, help="HarnessConfig.loop_overhead_s")
    ap.add_argument("--threads", type=int, default=None, help="worker threads [default: all cores]")
    args = ap.parse_args()
    config = HarnessConfig(timing_budget_s=args.timing_budget, loop_overhead_s=args.loop_overhead)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(threads=args.threads) as pool:
        if not args.problem:
            args.problem, args.candidate = f"{tmp}/small_problem.py", f"{tmp}/small_candidate.py"
            Path(args.problem).write_text(SMALL_PROBLEM)
            Path(args.candidate).write_text(SMALL_CANDIDATE)
        t0 = time.monotonic()
        pool.prewarm("cpu")
        cold = time.monotonic() - t0
        for i in range(args.repeats + 1):
            req = MeasureRequest(problem=args.problem, candidate=args.candidate, device="cpu", run_dir=f"{tmp}/run", again=True, harness=config)
            m = measure(req, pool=pool)
            assert m.status.value == "ok" and m.timing_valid, m.message
            if i == 0:
                continue  # first one builds/caches the problem in the worker
            rows.append((m.wall_s, timed_work_s(m), m.runtime_ms, m.ref_runtime_ms, m.speedup, m.candidate_timing.repeats))
    overhead = [w - t for w, t, *_ in rows]
    runtimes = [r[2] for r in rows]
    speedups = [r[4] for r in rows]
    med_rt = statistics.median(runtimes)
    print(f"- machine: {platform.processor() or platform.machine()}, {platform.system()}; worker start (cold, once): {cold:.2f} s")
    name = Path(args.problem).relative_to(REPO) if Path(args.problem).is_relative_to(REPO) else "built-in 256x512 elementwise problem"
    print(f"- problem: `{name}`, candidate `{Path(args.candidate).name}`, timing budget {args.timing_budget} s (both sides together)")
    print()
    print("| run | wall s | timed work s | overhead s | rounds | candidate ms | reference ms | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (w, t, rt, ref, sp, n) in enumerate(rows, 1):
        print(f"| {i} | {w:.2f} | {t:.2f} | {w - t:.2f} | {n} | {rt:.4f} | {ref:.4f} | {sp:.3f} |")
    print()
    print(f"- overhead beyond the timed work: median {statistics.median(overhead):.2f} s, max {max(overhead):.2f} s (target < 1 s)")
    spread = max(abs(r - med_rt) / med_rt for r in runtimes)
    print(f"- candidate median time across runs: {med_rt:.4f} ms, largest deviation from the median of runs {spread:.1%} (target within 3%)")
    print(f"- speedup across runs: min {min(speedups):.3f}, median {statistics.median(speedups):.3f}, max {max(speedups):.3f}")


if __name__ == "__main__":
    main()
