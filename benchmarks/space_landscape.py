"""Where a search can get stuck on a recorded space: its local optima under one-parameter changes.

    python benchmarks/space_landscape.py [SPACE ...] [--top 8] [--json]

A configuration is a local optimum here when no valid configuration that differs from it in exactly one
parameter (any other value of that parameter, not only the next one) is faster. For each space the script
prints how many there are and, for the fastest few, how far they are from the optimum and what the best
configuration one and two changes away reaches. Why it exists: runs of the search on the hard spaces end
at a handful of exact values (0.679 and 0.931 of the optimum on convolution_A100, 0.806 and 0.875 on
convolution_A4000, 0.984 on convolution_MI250X), and this says which of them a local step can leave and
which need a jump (docs/search_experiments.md, thirty-first session). It also counts the configurations within
1 %, 5 % and 10 % of the optimum and gives the runner-up's fraction: a space where one configuration is within 10 %
(a needle) is rarely solved in 20 measurements by a search that does not already know where to look, and these
counts say which spaces those are (docs/benchmarks.md, "How hard each recorded space is"). Reads the recorded times
only; nothing is searched or measured.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

NEAR = (0.99, 0.95, 0.9)  # fractions of the optimum the counts are taken at
DEFAULT_SPACES = ("convolution_A100", "convolution_A4000", "convolution_MI250X", "gemm_RTX_3090", "dedispersion_A100",
                  "dedispersion_MI250X", "pnpoly_RTX_2080_Ti", "pnpoly_RTX_3090")


def landscape(times: np.ndarray, values: np.ndarray, top: int = 8) -> dict:
    """`times`: one per configuration (nan for a failed one); `values`: the configurations, one row each.

    Returns the number of local optima and, for the `top` fastest, their fraction of the optimum with the best
    fraction reached one and two parameter changes away (None where no valid configuration is that far)."""
    # integer codes per column: comparing object arrays row by row is a hundred times slower
    values = np.stack([np.unique(col.astype(str), return_inverse=True)[1] for col in np.asarray(values, dtype=object).T], axis=1)
    ok = np.isfinite(times)
    if not ok.any():
        raise ValueError("no configuration of this space has a time")
    optimum = float(np.min(times[ok]))
    frac = np.where(ok, optimum / np.where(ok, times, 1.0), 0.0)
    local = []
    for i in np.flatnonzero(ok):
        changed = (values != values[i]).sum(axis=1)
        one = changed == 1
        if not np.any(frac[one] > frac[i]):
            local.append(int(i))
    local.sort(key=lambda i: -frac[i])
    rows = []
    for i in local[:top]:
        changed = (values != values[i]).sum(axis=1)
        best = {k: (float(np.max(frac[changed == k])) if np.any((changed == k) & ok) else None) for k in (1, 2)}
        rows.append({"frac_of_opt": round(float(frac[i]), 4), "best_one_change": _r(best[1]), "best_two_changes": _r(best[2]),
                     "neighbours_one": int(np.sum((changed == 1) & ok)), "neighbours_two": int(np.sum((changed == 2) & ok))})
    ranked = np.sort(frac[ok])[::-1]
    near = {str(f): int(np.sum(frac >= f)) for f in NEAR}
    return {"configurations": len(times), "timed": int(ok.sum()), "within": near,
            "runner_up": _r(float(ranked[1])) if ranked.size > 1 else None, "local_optima": len(local), "fastest": rows}


def _r(x):
    return None if x is None else round(x, 4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spaces", nargs="*", default=list(DEFAULT_SPACES), help="recorded space names or cache files")
    parser.add_argument("--top", type=int, default=8, help="local optima listed per space, fastest first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from kernelscout.sandbox.replay import ReplaySpace, resolve_space, space_hint

    out = {}
    for name in args.spaces:
        path = resolve_space(name)
        if not path.is_file():
            raise SystemExit(f"{name}: no such recorded space{space_hint(name)}")
        space = ReplaySpace.load(str(path))
        out[space.name] = landscape(np.asarray(space.times, dtype=float), np.array(space.configs, dtype=object), args.top)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for name, r in out.items():
        print(f"{name}: {r['configurations']} configurations, {r['local_optima']} local optima under one-parameter changes")
        within = ", ".join(f"{n} at {float(f):.2f} or better" for f, n in r["within"].items())
        runner = "-" if r["runner_up"] is None else f"{r['runner_up']:.3f}"
        print(f"  {r['timed']} timed; fraction of the optimum: {within} (the optimum included); the runner-up is at {runner}")
        print("  fraction of optimum | best one change away (n) | best two changes away (n)")
        for row in r["fastest"]:
            one = "-" if row["best_one_change"] is None else f"{row['best_one_change']:.3f}"
            two = "-" if row["best_two_changes"] is None else f"{row['best_two_changes']:.3f}"
            print(f"  {row['frac_of_opt']:.3f} | {one} ({row['neighbours_one']}) | {two} ({row['neighbours_two']})")


if __name__ == "__main__":
    main()
