"""How well the learned surrogate's forecasts held up inside real searches, scored as `kscout show` scores them.

Run: python benchmarks/inrun_forecasts.py [--budget 50] [--seeds 3] [--spaces convolution_A100,gemm_RTX_3090] [--out FILE]

`kscout eval-surrogate` scores the surrogate on random held-out configurations. A search asks something
harder: forecasts for the configurations it ranks highest, from a model fitted on what it measured so
far. Each run here is `kscout optimize --space FILE --budget B --seed S` on a recorded GPU space; its
archive is then scored with `tools.forecast_check.check_forecasts`, the function behind `kscout show`,
the MCP tool `forecast_check` and report.html: the Brier score of P(faster than the parent), the share of
directions right, the ranked probability score over the speedup bins, the rank correlation of expected and
measured speedup, and the 80 % interval's coverage.

Only measured candidates can be scored, and the decision rule chose them by their forecasts (mostly the
ones it thought most likely to win), so these are scores of the forecasts the search acted on, not of
the surrogate on the whole space. A space's cell is the mean of its runs' scores, each weighted by the
number of forecasts it scored.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from _replay_runs import over_spaces_and_seeds
from kernelscout.sandbox.replay import recorded_spaces_dir

HUB = recorded_spaces_dir()
FIELDS = ("brier_p_faster", "direction_accuracy", "ranked_probability_score", "spearman", "interval_80_coverage")


def one(args: tuple[str, int, int, str]) -> dict:
    from kernelscout.agent.runner import start_search
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.forecast_check import check_forecasts
    from kernelscout.tools.rundir import RunDir

    space_path, budget, seed, run_dir = args
    start_search(None, space_path, budget=budget, seed=seed, run_dir=run_dir, quiet=True, report=False)
    check = check_forecasts(Archive(RunDir(run_dir)))
    return {"space": Path(space_path).name.split(".json")[0], "seed": seed, **check.model_dump()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--spaces", default="", help="comma-separated space names (default: every recorded space)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the per-run results as JSON here")
    args = ap.parse_args()
    names = [s for s in args.spaces.split(",") if s]
    paths = sorted(HUB.glob("*.json.gz")) if not names else [HUB / f"{n}.json.gz" for n in names]
    if not paths:
        raise SystemExit(f"no recorded spaces found in {HUB}")
    t0 = time.time()
    runs = over_spaces_and_seeds(one, paths, args.budget, args.seeds, args.workers)
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))
    print(f"budget {args.budget}, seeds 0-{args.seeds - 1}, {len(runs)} runs in {(time.time() - t0) / 60:.1f} min\n")
    print("| space | scored | Brier P(faster) | direction right | RPS | Spearman | 80 % coverage |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in sorted({r["space"] for r in runs}):
        mine = [r for r in runs if r["space"] == name]
        scored = sum(r["scored"] for r in mine)
        # each run's score weighted by how many forecasts it scored
        cells = []
        for field in FIELDS:
            pairs = [(r[field], r["scored"]) for r in mine if r[field] is not None and r["scored"]]
            value = sum(v * n for v, n in pairs) / sum(n for _, n in pairs) if pairs else None
            cells.append(value)
        rows.append(cells)
        print(f"| {name} | {scored} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
    means = [np.mean([c[i] for c in rows if c[i] is not None]) for i in range(len(FIELDS))]
    print("| mean over spaces | | " + " | ".join(f"{v:.3f}" for v in means) + " |")


if __name__ == "__main__":
    main()
