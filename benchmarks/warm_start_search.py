"""The search with and without a warm start from the same kernel recorded on other GPUs.

Run: python benchmarks/warm_start_search.py [--seeds 5] [--cold-runs /tmp/kscout-bench-search]

For every provided space whose kernel was also recorded on another GPU, each seed runs
`kscout optimize --space FILE --budget 100 --seed S --warm-start OTHER...` (learned surrogate,
tuner policy) and reads the fraction of the optimum after 20, 50 and 100 measurements, as
benchmarks/bench_search.py does. The cold runs to compare with are read from a bench_search output
folder when `--cold-runs` is given (same seeds, same code path, no warm start), else run here.
Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from kernelscout.agent.bench import _space, best_after, frac_of_opt, kernelscout_trace, read_run
from kernelscout.sandbox.replay import recorded_spaces_dir

HUB = recorded_spaces_dir()
BUDGETS = (20, 50, 100)


def kernel_of(path: Path) -> str:
    return path.name.split("_")[0]


def fractions(space_path: Path, times: list[float]) -> list[float]:
    optimum = float(np.nanmin(_space(str(space_path)).times))
    return [frac_of_opt(optimum, best_after(times, b)) for b in BUDGETS]


def search(space_path: Path, seed: int, warm: list[str]) -> list[float]:
    run_dir = tempfile.mkdtemp(prefix="kscout-warm-")
    trace = kernelscout_trace(str(space_path), "learned", seed, max(BUDGETS), run_dir, warm_start=warm)
    return fractions(space_path, trace.times)


def cold_from(runs: Path, space_path: Path, name: str, seed: int) -> list[float]:
    """A cold run that benchmarks/bench_search.py left in its --out folder."""
    times, _ = read_run(_space(str(space_path)), str(runs / "runs" / f"{name}-learned-seed{seed}"))
    return fractions(space_path, times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HUB)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cold-runs", type=Path, default=None, help="a bench_search.py --out folder holding the cold runs")
    args = ap.parse_args()
    files = sorted(args.data.glob("*.json.gz"))
    rows, t0 = [], time.perf_counter()
    for f in files:
        others = [str(g) for g in files if g != f and kernel_of(g) == kernel_of(f)]
        if not others:
            continue
        name = f.name.removesuffix(".json.gz")
        warm = np.mean([search(f, s, others) for s in range(args.seeds)], axis=0)
        if args.cold_runs:
            cold = np.mean([cold_from(args.cold_runs, f, name, s) for s in range(args.seeds)], axis=0)
        else:
            cold = np.mean([search(f, s, []) for s in range(args.seeds)], axis=0)
        rows.append((name, cold, warm, [Path(o).name.removesuffix(".json.gz") for o in others]))
        print(f"[{time.perf_counter() - t0:5.0f} s] {name}: cold {np.round(cold, 3)}, warm {np.round(warm, 3)}", flush=True)
    print()
    print(f"{args.seeds} seeds; fraction of the optimum after 20 / 50 / 100 measurements; wall {(time.perf_counter() - t0) / 60:.1f} min")
    print()
    print("| space | warm start from | cold @20 | warm @20 | cold @50 | warm @50 | cold @100 | warm @100 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, cold, warm, others in rows:
        cells = " | ".join(f"{c:.3f} | {w:.3f}" for c, w in zip(cold, warm))
        print(f"| {name} | {', '.join(others)} | {cells} |")
    cold_m, warm_m = np.mean([r[1] for r in rows], axis=0), np.mean([r[2] for r in rows], axis=0)
    print("| **mean** | | " + " | ".join(f"**{c:.3f}** | **{w:.3f}**" for c, w in zip(cold_m, warm_m)) + " |")


if __name__ == "__main__":
    main()
