"""`kscout optimize` on the examples (CPU, offline), against a plain torch.compile of the reference.

Run: python benchmarks/optimize_examples.py [--budgets 5,10,20] [--problems softmax,layernorm] [--device cpu|cuda] [--start-triton]
     [--one-search] [--confirm N] [--out FILE] [--keep DIR] [--history]
Each row is one fresh search (with --history, the learned surrogate's prior is read from the runs of the
problems before it in the list, never from the same problem's); the torch.compile baseline is measured by the same harness, three
times, and its median is shown, so its speedup is a same-session ratio like every other number here.
With --one-search, each problem gets one search whose cap is raised through the budgets
(`kscout budget DIR --set N`, then resume), read after each: the rows cost the largest budget
instead of the sum, which is what fits a short GPU lease. The search reads its cap only in the
near-speed-of-light rule (stop at half the cap), with several workers to size the last batch before
the cap, and to keep the last measurement for re-measuring the best (`--confirm`, on by default from a
budget of 5). So a one-search row at N has re-measured once per row so far and searched with the rest,
where a separate run re-measures once.
Where the best was re-measured, the table shows the re-measurement and, in brackets, the measurement
that made it the best: the gap between them is the winner's curse of picking the largest of noisy draws.
The table is rewritten to --out after every row, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from statistics import median

from kernelscout.agent.policies.rewrites import REWRITES, render
from kernelscout.agent.runner import resume_search, start_search
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.tools.archive import ROOT_ID, Archive
from kernelscout.tools.budget import Budget
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]


def compile_baseline(problem: Path, run_dir: str, pool: WorkerPool, device: str, repeats: int = 3) -> str:
    """The median of `repeats` fresh measurements of a plain torch.compile: one measurement would move the
    baseline by run-to-run spread, against a search result that is itself a re-measurement."""
    path = Path(run_dir) / "torch_compile_baseline.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render("torch_compile", problem, {"MODE": "default"}, device=device))
    speedups = []
    for i in range(repeats):
        m = measure(MeasureRequest(problem=str(problem), candidate=str(path), device=device, run_dir=run_dir,
                                   repeat=f"baseline:{i}"), pool=pool)
        if m.status.value != "ok":
            return m.status.value
        if not m.timing_valid:
            return f"timing not valid ({m.timing_invalid_reason})"
        speedups.append(m.speedup)
    return f"{median(speedups):.2f}x"


# a rendered kernel records every knob it was given; the table names the mode, the layout and what differs from the default
KNOB_DEFAULTS = {name: field.default for rewrite in REWRITES.values() for name, field in rewrite.Params.model_fields.items()}
ALWAYS_SHOWN = {"MODE", "NDIM"}
_UNSET = object()


def describe_best(run_dir: str) -> str:
    """Where the best kernel came from, newest step first (`rewrite:torch_compile (MODE=max-autotune) <- user`), so a
    reader can tell a tuned start kernel from a compiler rewrite without the run directory, which is temporary here."""
    archive = Archive(RunDir(run_dir))
    rec, steps = archive.reported_best(), []
    while rec is not None and len(steps) < 4:
        params = ", ".join(f"{k}={v}" for k, v in sorted(rec.params.items()) if k in ALWAYS_SHOWN or KNOB_DEFAULTS.get(k, _UNSET) != v)
        steps.append(f"{rec.origin or '?'}" + (f" ({params})" if params else ""))
        rec = archive.get(rec.parent_id) if rec.parent_id not in (None, ROOT_ID) else None
    return " <- ".join(steps) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budgets", default="10")
    ap.add_argument("--problems", default="")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--start-triton", action="store_true", help="give each problem's triton_*.py to the search as --start (a GPU table)")
    ap.add_argument("--one-search", action="store_true", help="one search per problem, its cap raised through the budgets")
    ap.add_argument("--confirm", type=int, default=None, help="re-measurements of the best (default: kscout optimize's)")
    ap.add_argument("--out", default="")
    ap.add_argument("--keep", default="", help="put the run directories here and keep them (for `kscout show`), not in a temporary folder")
    ap.add_argument("--history", action="store_true", help="each problem's searches read the runs of the problems before it as the "
                    "learned surrogate's prior (default: every search on its own, with no prior, as in the published tables)")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    problems = sorted(p.parent for p in (REPO / "examples").glob("*/problem.py"))
    if args.problems:
        problems = [p for p in problems if p.name in args.problems.split(",")]
    lines = ["| problem | budget | best speedup | torch.compile of the reference (median of 3) | measurements | considered "
             "| per measurement | wall | best kernel |",
             "|---|---|---|---|---|---|---|---|---|"]
    unconfirmed: list[str] = []  # why a row's best was not re-measured, from the run's own message
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()) as tmp:
        earlier: list[str] = []  # run directories of the problems already done, for --history
        for problem in problems:
            mine: list[str] = []
            with WorkerPool() as pool:
                baseline = compile_baseline(problem / "problem.py", f"{tmp}/{problem.name}-baseline", pool, args.device)
            start = [str(p) for p in sorted(problem.glob("triton_*.py"))] if args.start_triton else None
            for i, budget in enumerate(budgets):
                run_dir = f"{tmp}/{problem.name}" if args.one_search else f"{tmp}/{problem.name}-{budget}"
                if args.one_search and i > 0:  # the same search goes on; its wall time keeps counting
                    Budget(RunDir(run_dir)).set_cap(budget)
                    r = resume_search(run_dir, quiet=True)
                else:
                    t0 = time.monotonic()
                    r = start_search(problem=str(problem), space=None, budget=budget, device=args.device, run_dir=run_dir,
                                     quiet=True, start=start, confirm=args.confirm, history=list(earlier) if args.history else [])
                    mine.append(run_dir)
                wall = time.monotonic() - t0
                best = f"{r.best_speedup:.2f}x" if r.best_speedup else "none"
                if r.confirmed_speedups:  # the reported figure is the re-measurement; the search chose it at this
                    best += f" (chosen at {r.search_speedup:.2f}x)"
                elif r.best_speedup and r.best_speedup > 1.0:  # measured once: the run's message says why, under the table
                    best += f" (measured once: note {len(unconfirmed) + 1})"
                    unconfirmed.append(f"{len(unconfirmed) + 1}. {problem.name} at {budget}: {r.message}")
                stopped = f" (stopped early: {r.stop_reason})" if r.stop_reason and r.measurements_used < budget else ""
                line = (f"| {problem.name} | {budget} | {best} | {baseline} | {r.measurements_used} | {r.candidates_considered} | "
                        f"{r.considered_per_measurement:.1f} | {wall / 60:.1f} min{stopped} | {describe_best(run_dir)} |")
                lines.append(line)
                print(line, flush=True)
                if args.out:
                    Path(args.out).write_text("\n".join(lines + ([""] + unconfirmed if unconfirmed else [])) + "\n")
            earlier += mine
    for note in unconfirmed:
        print(note, flush=True)


if __name__ == "__main__":
    main()
