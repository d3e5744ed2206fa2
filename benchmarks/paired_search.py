"""Paired seeds: is a change to the search better than the code before it, beyond the seed-to-seed noise?

    python benchmarks/paired_search.py run --label new --out new.jsonl [--spaces convolution_A100,gemm_RTX_3090]
                                           [--seeds 0-29] [--budgets 20,50,100] [--jobs 2]
    python benchmarks/paired_search.py pair old.jsonl new.jsonl

`run` searches each recorded space once per seed with the installed kernelscout, through the benchmark's own
runner (`agent.bench.kernelscout_trace`, the search of `kscout optimize --space NAME --budget B --seed S`), and
appends one JSON line per run: the fraction of the optimum after each budget, candidates considered per
measurement, CPU seconds. A file that already holds a run of that label, space and seed skips it, so a run cut
short goes on where it stopped. To compare two commits, install each in turn (`pip install -e WORKTREE`) and
run both with the same spaces and seeds.

`pair` matches runs by space and seed and prints each space's means, the mean over spaces, and the mean
paired difference with its standard error. Why paired: one run of a search on a space ends anywhere between
0.6 and 1.0 of the optimum depending on its seed, so two arms on different seeds differ by more than most
changes do; the same seed removes that part of the spread (docs/search_experiments.md, which reports every
change tried this way).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

HARD = "convolution_A100,convolution_A4000,convolution_MI250X,gemm_RTX_3090"


def seed_range(text: str) -> list[int]:
    """`0-29` or `0,5,7` (or both, comma-separated)."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


def one_run(label: str, space_path: str, seed: int, budgets: list[int]) -> dict:
    import numpy as np

    # the benchmark's own cached loader (kernelscout_trace reads the same object) and its optimum
    from kernelscout.agent.bench import _space, best_after, frac_of_opt, kernelscout_trace

    space = _space(space_path)
    optimum = float(np.nanmin(space.times))
    with tempfile.TemporaryDirectory(prefix="kscout-paired-") as tmp:
        t0 = time.process_time()
        trace = kernelscout_trace(space_path, "learned", seed, max(budgets), str(Path(tmp) / "run"))
        cpu = time.process_time() - t0
    considered = [c for c in trace.considered if c is not None]
    return {"label": label, "space": space.name, "seed": seed, "budgets": budgets,
            "frac_of_opt": [round(frac_of_opt(optimum, best_after(trace.times, b)), 6) for b in budgets],
            "considered_per_measurement": round(considered[-1] / len(trace.times), 3) if considered and trace.times else None,
            "cpu_s": round(cpu, 1)}


def run(args: argparse.Namespace) -> None:
    from kernelscout.sandbox.replay import resolve_space, space_hint, space_name

    budgets = sorted({int(b) for b in args.budgets.split(",")})
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            if r["label"] == args.label:
                done.add((r["space"], r["seed"]))
    tasks = []
    for name in args.spaces.split(","):
        path = str(resolve_space(name.strip()))
        if not Path(path).is_file():  # before any worker starts, as `kscout bench search` says it
            raise SystemExit(f"{name.strip()}: no such recorded space{space_hint(name.strip())}")
        tasks += [(path, s) for s in seed_range(args.seeds) if (space_name(path), s) not in done]
    print(f"{len(tasks)} runs to do ({len(done)} already in {out})", file=sys.stderr)
    # spawned, as the benchmark's own pool does: a forked process can run a search another way (docs/search_experiments.md)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(one_run, args.label, p, s, budgets) for p, s in tasks]
        for i, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{i}/{len(tasks)} {r['space']} seed {r['seed']}: " + " / ".join(f"{x:.3f}" for x in r["frac_of_opt"]),
                  file=sys.stderr)


def load(path: str) -> tuple[str, list[int], dict[tuple[str, int], list[float]]]:
    runs, labels, budgets = {}, set(), None
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such file; give the JSON-lines files that `run --out` wrote")
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        labels.add(r["label"])
        budgets = budgets or r["budgets"]
        if r["budgets"] != budgets:
            raise SystemExit(f"{path}: runs with budgets {r['budgets']} and {budgets}; pair files of one budget list")
        runs[(r["space"], r["seed"])] = r["frac_of_opt"]
    return "+".join(sorted(labels)), budgets or [], runs


def pair(args: argparse.Namespace) -> str:
    la, ba, a = load(args.base)
    lb, bb, b = load(args.new)
    if ba != bb:
        raise SystemExit(f"budgets differ: {ba} in {args.base}, {bb} in {args.new}")
    keys = sorted(set(a) & set(b))
    if not keys:
        raise SystemExit("no space and seed is in both files; run both arms on the same spaces and seeds")
    fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    lines = [f"budgets {' / '.join(map(str, ba))}; {la} ({args.base}) against {lb} ({args.new})"]
    by_space: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for k in keys:
        by_space[k[0]].append(k)

    def mean(rows: list[list[float]]) -> list[float]:
        return [sum(col) / len(col) for col in zip(*rows)]

    for space, ks in by_space.items():
        lines.append(f"{space:22s} n={len(ks):3d}  {fmt(mean([a[k] for k in ks]))}  ->  {fmt(mean([b[k] for k in ks]))}")
    over_a = mean([mean([a[k] for k in ks]) for ks in by_space.values()])
    over_b = mean([mean([b[k] for k in ks]) for ks in by_space.values()])
    lines.append(f"{'mean over spaces':22s} n={len(keys):3d}  {fmt(over_a)}  ->  {fmt(over_b)}")
    diffs = [[y - x for x, y in zip(a[k], b[k])] for k in keys]
    cells = []
    for col in zip(*diffs):
        m = sum(col) / len(col)
        se = math.sqrt(sum((d - m) ** 2 for d in col) / (len(col) - 1) / len(col)) if len(col) > 1 else float("nan")
        cells.append(f"{m:+.3f} ({se:.3f})")
    lines.append("paired difference (standard error): " + " / ".join(cells))
    missing = len(set(a) ^ set(b))
    if missing:
        lines.append(f"note: {missing} run(s) are in one file only and were left out")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="search each space once per seed and append the results to --out")
    r.add_argument("--label", required=True, help="what this arm is (a commit, a variant's name)")
    r.add_argument("--out", required=True, help="a JSON-lines file; runs already in it are skipped")
    r.add_argument("--spaces", default=HARD, help=f"recorded space names or files, comma-separated (default: {HARD})")
    r.add_argument("--seeds", default="0-29")
    r.add_argument("--budgets", default="20,50,100")
    r.add_argument("--jobs", type=int, default=2)
    p = sub.add_parser("pair", help="paired difference between two files of runs")
    p.add_argument("base")
    p.add_argument("new")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run(args)
    else:
        print(pair(args))


if __name__ == "__main__":
    main()
