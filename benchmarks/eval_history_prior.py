"""How well earlier runs forecast a problem they never saw: the learned surrogate's prior across problems.

    python benchmarks/eval_history_prior.py RUNS_DIR [--device cpu] [--json]

RUNS_DIR holds finished `kscout optimize` runs of several problems on one device (benchmarks/
optimize_examples.py --keep DIR makes such a folder). For each problem, the prior
(tools/surrogates/history.py) is fitted on the other problems' runs only, and then forecasts every
candidate the held-out problem's runs measured, from its features and its parent's measured speedup,
exactly as a search on that problem would have asked before measuring it. Scored against what was
measured:

- pair acc: of two measured candidates of the held-out problem, whether the forecast puts the faster one first;
- dir acc: whether P(faster than its parent) is on the right side of 1/2;
- Brier: over the 8 ordinal speedup bins (child over parent) of GPU Forecasters;
- MAE: mean absolute error of the forecast log-speedup over the parent;
- 80% cover: share of measured speedups inside the forecast's 80 % interval (0.80 when calibrated).

With --online each candidate is forecast as the search forecast it: with what the held-out run had measured
before it, which moves the prior by this problem's misses (CrossProblemPrior.offsets).

Without a prior the cold surrogate forecasts nothing: pair and direction accuracy 0.5, Brier 0.875.
"""

from __future__ import annotations

import argparse
import json
import math
from itertools import combinations

import numpy as np

from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, LogTimeDistribution
from kernelscout.tools.surrogates.history import CrossProblemPrior, device_class, find_runs, read_outcomes


def bin_of(ratio: float) -> int:
    return int(np.searchsorted(np.asarray(DEFAULT_EDGES), ratio, side="right"))


def score(prior: CrossProblemPrior, held, online: bool = False) -> dict:
    """`online`: each candidate is forecast with the held-out run's earlier measurements (in the order the
    run measured them) as the search would have had them, so the prior's correction for this problem counts."""
    feats = [o.features for o in held]
    if online:
        offsets = np.asarray([prior.offsets([o.features], [(e.features, e.log_ratio) for e in held[:k] if e.run == o.run])[0]
                              for k, o in enumerate(held)])
    else:
        offsets = np.zeros(len(held))
    pred_ratio = prior.log_ratio(feats) + offsets
    pred_speedup = prior.log_speedup(feats) + offsets
    true_ratio = np.asarray([o.log_ratio for o in held])
    true_speedup = np.log([o.speedup for o in held])
    # the child's log-time relative to its parent's: -log ratio
    dist = LogTimeDistribution(mu=-pred_ratio, scale=np.full(len(held), prior.scale), residuals=prior.residuals,
                               bandwidth=prior.bandwidth)
    p_faster = dist.p_faster_than(np.zeros(len(held)))
    bins = dist.speedup_bin_probs(np.zeros(len(held)))
    onehot = np.zeros_like(bins)
    onehot[np.arange(len(held)), [bin_of(math.exp(r)) for r in true_ratio]] = 1.0
    q10, q90 = dist.quantiles([0.1, 0.9]).T  # of -log ratio
    pairs = [(i, j) for i, j in combinations(range(len(held)), 2) if abs(true_speedup[i] - true_speedup[j]) > 1e-9]
    right = sum((pred_speedup[i] - pred_speedup[j]) * (true_speedup[i] - true_speedup[j]) > 0 for i, j in pairs)
    return {
        "measured": len(held),
        "pair_acc": right / len(pairs) if pairs else float("nan"),
        "dir_acc": float(np.mean((p_faster > 0.5) == (true_ratio > 0))),
        "brier": float(np.mean(np.sum((bins - onehot) ** 2, axis=1))),
        "mae": float(np.mean(np.abs(pred_ratio - true_ratio))),
        "cover80": float(np.mean((-true_ratio >= q10) & (-true_ratio <= q90))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", help="folder of finished runs of several problems")
    ap.add_argument("--device", default="cpu", help="device class of the runs: cpu, cuda or cuda:<GPU key> (default cpu)")
    ap.add_argument("--online", action="store_true", help="forecast each candidate with the held-out run's earlier "
                    "measurements, as a search does (the prior corrected for the problem; default: the prior alone)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    outcomes = read_outcomes(find_runs([args.runs], device_class(args.device, None) if ":" not in args.device else args.device))
    names = {}
    for o in outcomes:  # a readable name per problem: the run folder's name up to its first '-'
        names.setdefault(o.problem, o.run.rsplit("/", 1)[-1].split("-")[0])
    rows = {}
    for problem in sorted(names, key=names.get):
        train = [o for o in outcomes if o.problem != problem]
        held = [o for o in outcomes if o.problem == problem]
        try:
            prior = CrossProblemPrior(train)
        except ValueError as exc:
            rows[names[problem]] = {"error": str(exc)}
            continue
        rows[names[problem]] = {**score(prior, held, online=args.online), "trained_on": len(train), "held_out_error": prior.scale}
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    keys = ["measured", "trained_on", "pair_acc", "dir_acc", "brier", "mae", "cover80"]
    print("| held-out problem | measured | prior fitted on | pair acc | dir acc | Brier | MAE log-speedup | 80% cover |")
    print("|---|---|---|---|---|---|---|---|")
    ok = [r for r in rows.values() if "error" not in r]
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | - | - | {r['error']} | | | | |")
            continue
        print("| " + " | ".join([name] + [f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys]) + " |")
    if ok:
        mean = {k: float(np.nanmean([r[k] for r in ok])) for k in keys[2:]}
        print("| **mean** | | | " + " | ".join(f"**{mean[k]:.3f}**" for k in keys[2:]) + " |")
    print("\nno prior (cold surrogate): pair acc 0.500, dir acc 0.500, Brier 0.875 (it forecasts nothing)")


if __name__ == "__main__":
    main()
