"""How much a measurement costs beyond the timed work, and how much it moves between runs.

Run: python benchmarks/measure_overhead.py [--problem P --candidate C] [--repeats 5] [--no-floor]
Prints a markdown section for docs/benchmarks.md.

The machine's own noise floor comes last: the same reference and candidate timed in a bare loop
(interleaved, fresh inputs every round, the same thread count and round count as the harness used,
no pipes, no checks), five back-to-back runs in one fresh process. If the bare loop's medians move
as much between runs as the harness's do, the spread belongs to the machine, not to the harness, and
no harness setting can remove it. The bare loop runs the candidate in a subprocess with the same
scrubbed environment as a sandbox worker, never in this process.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool, clean_env, default_threads
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


BARE_LOOP = r"""
import importlib.util, json, statistics, sys, time
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

problem_path, candidate_path, rounds, runs, gap_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
problem, candidate = load(problem_path, "problem"), load(candidate_path, "candidate")
torch.manual_seed(0)
init = problem.get_init_inputs()
ref, cand = problem.Model(*init).eval(), candidate.ModelNew(*init).eval()
out = []
with torch.no_grad():
    for _ in range(3):
        x = problem.get_inputs(); ref(*x); cand(*x)
    for run in range(runs):
        times = {"ref": [], "cand": []}
        for r in range(rounds):
            x = problem.get_inputs()
            for side in (("ref", "cand") if r % 2 == 0 else ("cand", "ref")):
                fn = ref if side == "ref" else cand
                t0 = time.perf_counter_ns(); fn(*x); t1 = time.perf_counter_ns()
                times[side].append((t1 - t0) / 1e6)
        out.append((statistics.median(times["cand"]), statistics.median(times["ref"])))
        time.sleep(gap_s)
print(json.dumps(out))
"""


def bare_loop_floor(problem: str, candidate: str, rounds: int, runs: int, threads: int, gap_s: float) -> list[tuple[float, float]]:
    """(candidate ms, reference ms) medians of `runs` bare-loop runs in one fresh, scrubbed subprocess."""
    with tempfile.TemporaryDirectory() as work:
        env = clean_env("cpu", threads, 0, Path(work))
        proc = subprocess.run([sys.executable, "-c", BARE_LOOP, problem, candidate, str(rounds), str(runs), str(gap_s)],
                              env=env, cwd=work, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"bare loop failed:\n{proc.stderr[-2000:]}")
    return [tuple(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def spread(values: list[float]) -> float:
    """Largest deviation from the median, as a fraction of it."""
    med = statistics.median(values)
    return max(abs(v - med) / med for v in values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--problem", default="", help="problem file [default: a small built-in elementwise problem]")
    ap.add_argument("--candidate", default="")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timing-budget", type=float, default=HarnessConfig().timing_budget_s)
    ap.add_argument("--loop-overhead", type=float, default=HarnessConfig().loop_overhead_s, help="HarnessConfig.loop_overhead_s")
    ap.add_argument("--threads", type=int, default=None, help="worker threads [default: all cores]")
    ap.add_argument("--no-floor", action="store_true", help="skip the bare-loop noise floor of the machine")
    args = ap.parse_args()
    config = HarnessConfig(timing_budget_s=args.timing_budget, loop_overhead_s=args.loop_overhead)
    rows = []
    tmp_dir = tempfile.TemporaryDirectory()  # kept until the bare loop has read the files too
    tmp = tmp_dir.name
    with WorkerPool(threads=args.threads) as pool:
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
    print(f"- candidate median time across runs: {med_rt:.4f} ms, largest deviation from the median of runs {spread(runtimes):.1%} (target within 3%)")
    print(f"- speedup across runs: min {min(speedups):.3f}, median {statistics.median(speedups):.3f}, max {max(speedups):.3f}")
    if args.no_floor:
        return
    rounds = int(statistics.median(r[5] for r in rows))
    gap = statistics.median(overhead)
    floor = bare_loop_floor(args.problem, args.candidate, rounds, args.repeats, args.threads or default_threads(), gap)
    print()
    print(f"Machine noise floor: the same pair in a bare loop ({rounds} interleaved rounds with fresh inputs, "
          f"{args.threads or default_threads()} thread(s), {args.repeats} back-to-back runs {gap:.2f} s apart, one fresh process, no harness):")
    print()
    print("| run | candidate ms | reference ms | speedup |")
    print("|---|---|---|---|")
    for i, (c, r) in enumerate(floor, 1):
        print(f"| {i} | {c:.4f} | {r:.4f} | {r / c:.3f} |")
    print()
    print(f"- bare loop: candidate median moves {spread([c for c, _ in floor]):.1%} from the median of runs "
          f"(harness: {spread(runtimes):.1%}); speedup moves {spread([r / c for c, r in floor]):.1%} (harness: {spread(speedups):.1%})")


if __name__ == "__main__":
    main()
