"""How much the measurement that makes a kernel the best overstates it, and what re-measuring it gives.

Run: python benchmarks/winners_curse.py [--budget 20] [--seeds 10] [--spaces convolution_A100,gemm_RTX_3090] [--out FILE]

Each run is `kscout optimize --space FILE --budget B --confirm 1 --seed S` on a recorded GPU space
(replayed: every measurement resamples the configuration's recorded repeats, as real hardware
varies run to run). For the kernel the search reports, three speedups over the reference:

* chosen: the measurement that made it the best (the largest of many noisy draws);
* re-measured: its fresh re-measurement, which is what kscout now reports;
* recorded: the ratio of the two configurations' median recorded times, the figure both estimate.

The table gives, per space, the mean of chosen / recorded - 1 and re-measured / recorded - 1 in percent,
and how often the chosen figure is above the recorded one. A search that reports its chosen figure
overstates by the first column on average; re-measuring should bring that to about zero.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import mean

from _replay_runs import over_spaces_and_seeds
from kernelscout.sandbox.replay import recorded_spaces_dir

HUB = recorded_spaces_dir()


def one(args: tuple[str, int, int, str]) -> dict:
    from kernelscout.agent.runner import start_search
    from kernelscout.agent.targets import ReplayTarget
    from kernelscout.sandbox.replay import ReplaySpace
    from kernelscout.tools.rundir import RunDir

    space_path, budget, seed, run_dir = args
    r = start_search(None, space_path, budget=budget, seed=seed, confirm=1, run_dir=run_dir, quiet=True, report=False)
    space = ReplaySpace.load(space_path)
    reference = ReplayTarget(space, RunDir(run_dir), seed=seed).reference
    times = space.median_times
    out = {"space": space.name, "seed": seed, "chosen": r.search_speedup, "remeasured": None, "recorded": None}
    if r.confirmed_speedups and r.best_path:
        best = json.loads(Path(r.best_path).read_text())["config"]
        out["remeasured"] = r.best_speedup
        out["recorded"] = float(times[space.index_of(reference)] / times[space.index_of(best)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--spaces", default="", help="comma-separated names (default: every recorded space)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    paths = sorted(HUB.glob("*.json.gz")) + sorted(HUB.glob("*.json"))
    if a.spaces:
        wanted = set(a.spaces.split(","))
        paths = [p for p in paths if p.name.split(".json")[0] in wanted]
    if not paths:
        raise SystemExit(f"no recorded spaces found in {HUB} (set KSCOUT_BENCHMARK_HUB)")
    t0 = time.monotonic()
    rows = over_spaces_and_seeds(one, paths, a.budget, a.seeds, a.processes)
    lines = [f"Budget {a.budget}, seeds 0-{a.seeds - 1}, confirm 1; {time.monotonic() - t0:.0f} s wall.", "",
             "| space | runs re-measured | nothing beat the reference | beat it with the last measurement | chosen vs recorded "
             "| re-measured vs recorded | chosen above recorded |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    every: list[dict] = []
    for name in sorted({r["space"] for r in rows}):
        done = [r for r in rows if r["space"] == name and r["recorded"]]
        every += done
        lines.append(_row(name, done, [r for r in rows if r["space"] == name]))
    lines.append(_row("**all**", every, rows))
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


def _row(name: str, done: list[dict], runs: list[dict]) -> str:
    """`runs` that did not re-measure either found nothing faster than the reference (no claim to check), or
    first beat it with the budget's last measurement, when no slot had been held back yet (the search keeps
    one only once something beats the reference) and says so: "not re-measured: no budget was left"."""
    nothing = sum(not r["chosen"] or r["chosen"] <= 1.0 for r in runs)
    late = len(runs) - len(done) - nothing
    if not done:
        return f"| {name} | 0 of {len(runs)} | {nothing} | {late} | - | - | - |"
    chosen = mean(r["chosen"] / r["recorded"] - 1 for r in done) * 100
    again = mean(r["remeasured"] / r["recorded"] - 1 for r in done) * 100
    above = sum(r["chosen"] > r["recorded"] for r in done) / len(done)
    return f"| {name} | {len(done)} of {len(runs)} | {nothing} | {late} | {chosen:+.2f} % | {again:+.2f} % | {above:.0%} |"


if __name__ == "__main__":
    main()
