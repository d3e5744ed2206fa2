"""Searches with and without the prior from earlier runs, problem by problem (leave one problem out).

    python benchmarks/history_prior_search.py RUNS_DIR [--budget 10] [--problems softmax,layernorm]
        [--device cpu] [--out FILE] [--keep DIR]

RUNS_DIR holds earlier runs of the examples on this device (benchmarks/optimize_examples.py --keep DIR,
or plain `kscout optimize` runs). For each example problem, two fresh searches at the same budget and
seed: one whose learned surrogate reads the runs of the *other* problems in RUNS_DIR (`--history`),
one with `--history none`. Per search: the best speedup (re-measured, as `kscout optimize` reports it),
the best the search had measured after 3 and 5 measurements, how many measured candidates came out
slower than their parent, and how many of its forecasts were informative. The two arms run one after
the other on the same machine, which one first alternating from problem to problem, so their ratios are
comparable; on a CPU a re-measured speedup moves by
several per cent between runs, so read the table over problems, not row by row.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import time
from pathlib import Path

from kernelscout.agent.runner import start_search
from kernelscout.tools.archive import Archive
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.surrogates.history import device_class, find_runs, run_spec

REPO = Path(__file__).resolve().parents[1]


def trajectory(run_dir: str) -> dict:
    """Best measured speedup after k measurements, slower-than-parent count, informative forecasts."""
    archive = Archive(RunDir(run_dir))
    measured = sorted((r for r in archive.all() if r.measurement_id is not None), key=lambda r: r.measurement_id)
    speed = {r.id: r.speedup for r in measured}
    best, curve, slower = 1.0, [], 0
    for r in measured:
        if r.state == "measured" and r.speedup:
            best = max(best, r.speedup)
            parent = speed.get(r.parent_id, 1.0) or 1.0
            slower += r.speedup < parent
        curve.append(best)
    forecasts = archive.forecasts()
    at = lambda k: curve[min(k, len(curve)) - 1] if curve else 1.0  # noqa: E731
    return {"best_at_3": at(3), "best_at_5": at(5), "slower_than_parent": slower, "measured": len(measured),
            "informative": sum(f["forecast"]["informative"] for f in forecasts), "forecasts": sum(1 + f["repeats"] for f in forecasts)}


def summary(lines: list[str]) -> str:
    """Geometric means over problems per arm, and the ratio prior / none, from the table's rows."""
    arms: dict[str, dict[str, tuple[float, ...]]] = {}
    for line in lines:
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) < 8 or c[0] == "problem" or c[0].startswith("---") or "none" in (c[2],):
            continue
        arm = "none" if c[1] == "none" else "prior"
        arms.setdefault(arm, {})[c[0]] = (float(c[2].rstrip("x")), float(c[3].rstrip("x")), float(c[4].rstrip("x")), int(c[5].split()[0]))
    both = sorted(set(arms.get("prior", {})) & set(arms.get("none", {})))
    if not both:
        return ""
    geo = lambda arm, k: math.exp(sum(math.log(arms[arm][p][k]) for p in both) / len(both))  # noqa: E731
    out = [f"geometric mean over {len(both)} problems, with the prior / without:"]
    for k, what in ((0, "best (re-measured)"), (1, "best after 3"), (2, "best after 5")):
        out.append(f"  {what}: {geo('prior', k):.3f}x / {geo('none', k):.3f}x (ratio {geo('prior', k) / geo('none', k):.3f})")
    out.append(f"  measured candidates slower than their parent: {sum(arms['prior'][p][3] for p in both)} / "
               f"{sum(arms['none'][p][3] for p in both)}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", help="folder of earlier runs; with --summary-of, unused (give any)")
    ap.add_argument("--summary-of", default="", help="only print the summary of a table this script wrote (--out FILE)")
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--problems", default="")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    ap.add_argument("--keep", default="", help="keep the new run directories here")
    ap.add_argument("--same-order", action="store_true", help="run the arm with the prior first on every problem "
                    "(default: alternate which arm runs first, so that a drift of the machine does not favour one)")
    args = ap.parse_args()
    if args.summary_of:
        print(summary(Path(args.summary_of).read_text().splitlines()))
        return
    problems = sorted(p.parent for p in (REPO / "examples").glob("*/problem.py"))
    if args.problems:
        problems = [p for p in problems if p.name in args.problems.split(",")]
    earlier = find_runs([args.runs], device_class(args.device, None))
    lines = ["| problem | prior | best (re-measured) | best after 3 | best after 5 | slower than parent | informative forecasts | wall |",
             "|---|---|---|---|---|---|---|---|"]
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()) as tmp:
        for i, problem in enumerate(problems):
            mine = (problem / "problem.py").resolve()
            others = [r for r in earlier if Path(run_spec(r)[0]["path"]).resolve() != mine]
            arms = [("earlier runs", others or ["none"]), ("none", ["none"])]
            for arm, history in (arms if i % 2 == 0 or args.same_order else arms[::-1]):
                run_dir = f"{tmp}/{problem.name}-{'prior' if arm != 'none' else 'cold'}"
                t0 = time.monotonic()
                r = start_search(problem=str(problem), space=None, budget=args.budget, device=args.device, run_dir=run_dir,
                                 quiet=True, history=history)
                t = trajectory(run_dir)
                label = f"{len(others)} runs of other problems" if arm != "none" else "none"
                best = f"{r.best_speedup:.2f}x" if r.best_speedup else "none"
                line = (f"| {problem.name} | {label} | {best} | {t['best_at_3']:.2f}x | {t['best_at_5']:.2f}x | "
                        f"{t['slower_than_parent']} of {t['measured']} | {t['informative']} of {t['forecasts']} | "
                        f"{(time.monotonic() - t0) / 60:.1f} min |")
                lines.append(line)
                print(line, flush=True)
                if args.out:
                    Path(args.out).write_text("\n".join(lines) + "\n")
    print(summary(lines))


if __name__ == "__main__":
    main()
