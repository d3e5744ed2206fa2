"""Paired seeds: is a change to the search better than the code before it, beyond the seed-to-seed noise?

    python benchmarks/paired_search.py run --label new --out new.jsonl [--spaces convolution_A100,gemm_RTX_3090]
                                           [--seeds 0-29] [--budgets 20,50,100] [--jobs 2]
                                           [--method kernelscout|kernelscout:none|kernelscout:warm|kernel_tuner:STRATEGY]
    python benchmarks/paired_search.py pair old.jsonl new.jsonl
    python benchmarks/paired_search.py compare [--plot P.png] [NAME=]ours.jsonl[,more.jsonl] [NAME=]theirs.jsonl ...

`run` searches each recorded space once per seed with the installed kernelscout, through the benchmark's own
runner (`agent.bench.kernelscout_trace`, the search of `kscout optimize --space NAME --budget B --seed S`), and
appends one JSON line per run: the fraction of the optimum after each budget, candidates considered per
measurement, CPU seconds. With `--method kernel_tuner:STRATEGY` it runs that Kernel Tuner strategy instead, as
`kscout bench search` does (`agent.bench.kernel_tuner_trace`; bayes_opt in the worker's process, where the table
gives each run a fresh one: on seeds 0-9 of the 8 recorded spaces both give the table's cells), and with `--method
kernelscout:none` the search under `--surrogate none`, so the published table's comparisons can be checked on more
seeds than its 10; `--method kernelscout:warm` runs the search with `--warm-start` from the same kernel's other
recorded spaces (the same kernel name and parameters). A file that already holds a run of that label, space and
seed skips it, so a run cut short goes on where it stopped. To compare two commits, install each in turn (`pip
install -e WORKTREE`) and run both with the same spaces and seeds.

`compare` lays several arms side by side (each arm one or more files, comma-separated), on the spaces and seeds
every arm has, and lists each cell where the first arm's mean is below another's with the paired difference's
standard error. `pair` matches runs by space and seed and prints each space's means, the mean over spaces, and the mean
paired difference with its standard error. Why paired: one run of a search on a space ends anywhere between
0.6 and 1.0 of the optimum depending on its seed, so two arms on different seeds differ by more than most
changes do; the same seed removes that part of the spread (docs/search_experiments.md, which reports every
change tried this way).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import SimpleNamespace

HARD = "convolution_A100,convolution_A4000,convolution_MI250X,gemm_RTX_3090"
KT_STRATEGIES = ("random_sample", "genetic_algorithm", "bayes_opt", "dual_annealing")


def seed_range(text: str) -> list[int]:
    """`0-29` or `0,5,7` (or both, comma-separated)."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


@functools.cache
def _kt_workdir() -> str:
    """One folder per process for Kernel Tuner's copies of the caches: the benchmark keeps a copy per process
    and space, and finds it again by path on the next run."""
    path = tempfile.mkdtemp(prefix="kscout-paired-kt-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def same_kernel_elsewhere(space_path: str) -> list[str]:
    """The other recorded spaces in the same folder that tune the same kernel (`ReplaySpace.same_kernel`: its name and
    parameters, as `kscout eval-surrogate --warm-start` picks them), e.g. `convolution_A4000` for `convolution_A100`."""
    from kernelscout.agent.bench import _space

    path = Path(space_path).resolve()
    target = _space(str(path))
    others = sorted(p for p in path.parent.iterdir() if p.name.endswith((".json", ".json.gz")) and p != path)
    return [str(p) for p in others if _space(str(p)).same_kernel(target)]


def one_run(label: str, space_path: str, seed: int, budgets: list[int], method: str = "kernelscout", name: str = "") -> dict:
    import numpy as np

    # the benchmark's own cached loader (kernelscout_trace reads the same object) and its optimum
    from kernelscout.agent.bench import _space, best_after, frac_of_opt, kernel_tuner_trace, kernelscout_trace

    space = _space(space_path, name)
    optimum = float(np.nanmin(space.times))
    with tempfile.TemporaryDirectory(prefix="kscout-paired-") as tmp:
        t0 = time.process_time()
        if method.startswith("kernel_tuner:"):
            trace = kernel_tuner_trace(space_path, method.partition(":")[2], seed, max(budgets), _kt_workdir())
        else:
            surrogate = "none" if method == "kernelscout:none" else "learned"
            warm = same_kernel_elsewhere(space_path) if method == "kernelscout:warm" else []
            trace = kernelscout_trace(space_path, surrogate, seed, max(budgets), str(Path(tmp) / "run"), warm_start=warm)
        cpu = time.process_time() - t0
    considered = [c for c in trace.considered if c is not None]
    return {"label": label, "space": space.name, "seed": seed, "budgets": budgets,
            "frac_of_opt": [round(frac_of_opt(optimum, best_after(trace.times, b)), 6) for b in budgets],
            "considered_per_measurement": round(considered[-1] / len(trace.times), 3) if considered and trace.times else None,
            "configurations": len(trace.times),  # the reference and the run's charged measurements (the largest budget, or fewer: it stopped)
            "cpu_s": round(cpu, 1)}


def run(args: argparse.Namespace) -> None:
    from kernelscout.sandbox.replay import resolve_space, space_hint, space_labels

    budgets = sorted({int(b) for b in args.budgets.split(",")})
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            if r["label"] == args.label:
                done.add((r["space"], r["seed"]))
    tasks = []
    paths = []
    for name in args.spaces.split(","):
        path = str(resolve_space(name.strip()))
        if not Path(path).is_file():  # before any worker starts, as `kscout bench search` says it
            raise SystemExit(f"{name.strip()}: no such recorded space{space_hint(name.strip())}")
        paths.append(path)
    for path, label in zip(paths, space_labels(paths)):  # files of the same name by their folders, as the benchmark names them
        tasks += [(path, label, s) for s in seed_range(args.seeds) if (label, s) not in done]
    print(f"{len(tasks)} runs to do ({len(done)} already in {out})", file=sys.stderr)
    # spawned, as the benchmark's own pool does: a forked process can run a search another way (docs/search_experiments.md)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(one_run, args.label, p, s, budgets, args.method, name) for p, name, s in tasks]
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


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (nan for one value)."""
    m = sum(values) / len(values)
    se = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values)) if len(values) > 1 else float("nan")
    return m, se


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
    cells = [_mean_se(list(col)) for col in zip(*diffs)]
    lines.append("paired difference (standard error): " + " / ".join(f"{m:+.3f} ({se:.3f})" for m, se in cells))
    missing = len(set(a) ^ set(b))
    if missing:
        lines.append(f"note: {missing} run(s) are in one file only and were left out")
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> str:
    """Several arms on the spaces and seeds they all have: each arm's mean (standard error over seeds) per space
    and budget, and every cell where the first arm is behind another, with the paired difference."""
    arms = []
    for spec in args.arms:
        name, _, files = spec.rpartition("=")
        label, budgets, runs = name, None, {}
        for path in files.split(","):
            lab, b, r = load(path)
            if budgets is not None and b != budgets:
                raise SystemExit(f"{path}: budgets {b}, not {budgets} as the arm's other files")
            label, budgets = label or lab, b
            runs.update(r)
        arms.append((label, budgets, runs))
    if len({tuple(b or []) for _, b, _ in arms}) != 1:
        raise SystemExit("the arms were run with different budget lists; compare runs of one budget list")
    budgets = arms[0][1] or []
    keys = sorted(set.intersection(*(set(r) for _, _, r in arms)))
    if not keys:
        raise SystemExit("no space and seed is in every arm; run the arms on the same spaces and seeds")
    spaces = sorted({s for s, _ in keys})
    width = max(len(label) for label, _, _ in arms)
    seeds = sorted({seed for _, seed in keys})
    lines = [f"budgets {' / '.join(map(str, budgets))}; {len(seeds)} seeds ({seeds[0]}-{seeds[-1]}) on each of {len(spaces)} spaces"]
    behind = []
    panels: dict[str, dict[str, dict[str, SimpleNamespace]]] = {}  # for the plot: space -> arm -> budget -> cell
    for space in spaces + ["mean over spaces"]:
        lines.append(space)
        if space == "mean over spaces":  # per seed, the mean over spaces; seeds missing a space are left out
            full = [seed for seed in seeds if all((s, seed) in keys for s in spaces)]
            rows = {label: [[sum(r[(s, seed)][j] for s in spaces) / len(spaces) for seed in full] for j in range(len(budgets))]
                    for label, _, r in arms}
        else:
            ks = [k for k in keys if k[0] == space]
            rows = {label: [[r[k][j] for k in ks] for j in range(len(budgets))] for label, _, r in arms}
        for label, _, _ in arms:
            cells = [_mean_se(col) for col in rows[label]]
            panels.setdefault(space, {})[label] = {str(b): SimpleNamespace(frac_of_opt=m, stderr=se) for b, (m, se) in zip(budgets, cells)}
            lines.append(f"  {label:{width}s}  " + " | ".join(f"{m:.3f} ±{se:.3f}" for m, se in cells))
        first = arms[0][0]
        for label, _, _ in arms[1:]:
            for j, b in enumerate(budgets):
                diff = [x - y for x, y in zip(rows[first][j], rows[label][j])]
                m, se = _mean_se(diff)
                if m < -1e-9:  # level within rounding is not behind
                    beyond = "beyond" if -m > 2 * se else "within"
                    behind.append(f"  @{b} {space}: behind {label} by {-m:.3f} (paired standard error {se:.3f}, {beyond} 2)")
    lines.append(f"where {arms[0][0]} is behind:" if behind else f"{arms[0][0]} is behind no other arm in any cell")
    if getattr(args, "plot", None):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_search import plot  # the published table's figure, drawn the same way

        mean = panels.pop("mean over spaces")
        plot(SimpleNamespace(budgets=budgets, mean=mean, spaces=panels), Path(args.plot))
        behind.append(f"plot: {args.plot}")
    return "\n".join(lines + behind)


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
    r.add_argument("--method", default="kernelscout",
                   choices=["kernelscout", "kernelscout:none", "kernelscout:warm", *(f"kernel_tuner:{s}" for s in KT_STRATEGIES)],
                   help="the installed kernelscout's search (kernelscout:none: with --surrogate none, measuring "
                        "whatever the policy proposes; kernelscout:warm: with --warm-start from the same kernel's other "
                        "recorded spaces), or a Kernel Tuner strategy as the benchmark runs it")
    p = sub.add_parser("pair", help="paired difference between two files of runs")
    p.add_argument("base")
    p.add_argument("new")
    c = sub.add_parser("compare", help="several arms side by side, and where the first is behind another")
    c.add_argument("--plot", help="also draw fraction of the optimum against budget, one panel per space, to this PNG")
    c.add_argument("arms", nargs="+", help="one arm per argument: [NAME=]its files, comma-separated (NAME: the files' label)")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run(args)
    elif args.cmd == "compare":
        print(compare(args))
    else:
        print(pair(args))


if __name__ == "__main__":
    main()
