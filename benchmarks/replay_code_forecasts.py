"""Score a code problem's P(child faster than parent) when its runs' measurements are replayed into the learned surrogate.

Run: python benchmarks/replay_code_forecasts.py RUN_DIR... (folders of `kscout optimize` on code problems, such as
those `benchmarks/optimize_examples.py --keep DIR` leaves)

Each run's measurements are fed, in the order they were made, to a fresh learned surrogate of the kind a code search
uses (agent/forecaster.py, OpenSpaceSurrogate); before each measured candidate is added, its P(faster than its
parent) is forecast, and afterwards compared with what it measured. That is done three ways, which differ only in
the speed-of-light floor under the forecast:
  none      no floor;
  bound     the problem's bound itself, always (the floor until 2026-12-06);
  search    the floor a search uses now: the suspect check's floor less its margin, and none once the best measured
            time beat it (CodeTarget.forecast_floor_ms, tools/predict.py floor_holds).
A fourth row fits the search's floor on each measurement's raw time, as the surrogate did until 2026-12-06 (it now fits
on the run's reference time over the measurement's speedup: agent/forecaster.py, on_reference_scale).
It measures nothing: the runs' recorded measurements are read, so it reruns in seconds on any machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from kernelscout.agent.forecaster import OpenSpaceSurrogate
from kernelscout.agent.search_spec import SPEC_KEY, SearchSpec
from kernelscout.agent.targets import CodeTarget, recorded_measurement
from kernelscout.tools.archive import ROOT_ID, Archive
from kernelscout.tools.predict import PredictContext, floor_holds
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.sol import SolBounds

MODES = ("none", "bound", "search")


def floors(run: RunDir, bounds: SolBounds | None) -> dict[str, float | None]:
    """Each mode's floor before the best-so-far rule: the bound itself, or what make_predictor gives the forecaster."""
    if bounds is None:
        return dict.fromkeys(MODES)
    spec = SearchSpec.model_validate_json(run.get_meta(SPEC_KEY))
    return {"none": None, "bound": bounds.time_ms, "search": CodeTarget(Path(spec.path), spec.device, run).forecast_floor_ms}


def replay(folder: Path, mode: str, raw_times: bool = False) -> list[tuple[float, bool]]:
    """(forecast P(faster than the parent), measured faster) for each measured candidate once the surrogate is warm."""
    run = RunDir(folder, read_only=True)
    stored = run.get_meta("sol_bounds")
    bounds = SolBounds.model_validate_json(stored) if stored and stored != "unavailable" else None
    records = [r for r in Archive(run).all() if r.measurement_id is not None and r.state in ("measured", "failed")]
    records.sort(key=lambda r: r.measurement_id)
    measured = {r.id: recorded_measurement(run, r.measurement_id) for r in records}
    refs = [m.ref_runtime_ms for m in measured.values() if m and m.ref_runtime_ms]
    if not refs:
        return []
    # the median of every reference timing in the run; the search forecasts against search_reference_ms (the timings
    # that counted, so far): that over the whole run in its place moves these figures by under 0.01 in Brier (24 runs,
    # 2026-12-06)
    ref = statistics.median(refs)
    speedups = {r.id: r.speedup for r in records}
    floor = floors(run, bounds)[mode]
    surrogate = OpenSpaceSurrogate("learned", seed=0, reference_ms=None if raw_times else (lambda: ref))
    out, best = [], 1.0
    for rec in records:
        parent = 1.0 if rec.parent_id in (None, ROOT_ID) else speedups.get(rec.parent_id)
        if rec.state == "measured" and rec.speedup and parent:
            dist = surrogate.predictive([dict(rec.features)])
            if dist is not None:
                holds = mode == "bound" or floor_holds(PredictContext(incumbent_runtime_ms=ref / best, sol_runtime_ms=floor))
                if floor and holds:
                    dist.floor = np.full(len(dist), math.log(floor))
                p = float(dist.p_faster_than(np.array([math.log(ref / parent)]))[0])
                out.append((p, rec.speedup > parent))
        surrogate.update(dict(rec.features), measured[rec.id])
        if rec.state == "measured" and rec.speedup:
            best = max(best, rec.speedup)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    print("| floor | forecasts | Brier of P(faster) | direction right | mean P(faster) | measured faster | P(faster) < 0.005 (of them faster) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, raw in [(m, False) for m in MODES] + [("search", True)]:
        pairs = [pair for folder in args.runs for pair in replay(folder, mode, raw)]
        mode = f"{mode}, raw times" if raw else mode
        if not pairs:
            print(f"| {mode} | 0 | - | - | - | - | - |")
            continue
        p = np.array([a for a, _ in pairs])
        y = np.array([b for _, b in pairs], dtype=float)
        zero = p < 0.005
        of_them = f"{y[zero].mean():.0%}" if zero.any() else "-"
        print(f"| {mode} | {len(p)} | {np.mean((p - y) ** 2):.3f} | {np.mean((p > 0.5) == (y > 0.5)):.0%} | {p.mean():.2f} | "
              f"{y.mean():.0%} | {int(zero.sum())} ({of_them}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
