"""Time the learned surrogate's online update, and check that cheap updates keep it calibrated.

    python benchmarks/surrogate_update_speed.py                          # convolution_A100, 100 measurements
    python benchmarks/surrogate_update_speed.py --growth 1.0             # cross-fit after every measurement
    python benchmarks/surrogate_update_speed.py --spaces convolution_A100 gemm_RTX_3090 pnpoly_RTX_3090

A stream of random configurations is measured on the replay device, one at a time, as a search would.
After each measurement the surrogate learns it and forecasts a batch of candidates (what the search
loop asks next); that step is timed, in wall-clock and in CPU seconds of this process (the CPU time is
the steadier figure on a shared machine). Before each measurement the surrogate also forecasts the
configuration about to be measured (untimed), which gives an online calibration check: how often the
measured time falls in the central 80 % interval, and the expected calibration error of P(faster than a
random earlier measurement).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace, recorded_spaces_dir
from kernelscout.tools.schema import MeasureStatus
from kernelscout.tools.surrogates import metrics as M
from kernelscout.tools.surrogates.learned import LearnedSurrogate

DEFAULT_DATA = recorded_spaces_dir()


def stream(space: ReplaySpace, points: int, growth: float, candidates: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    device = ReplayDevice(space)
    surrogate = LearnedSurrogate(space.param_values, seed=seed, refit_growth=growth)
    order = rng.permutation(len(space))
    batch = np.asarray(space.configs, dtype=object)[order[points : points + candidates]]
    wall, cpu, pit, p_faster, faster, seen, kind = [], [], [], [], [], [], []
    for k in range(points):
        config = space.config(int(order[k]))
        m = device.measure(config, rng)
        if m.status == MeasureStatus.ok and seen:
            dist = surrogate.predictive([config])  # forecast before learning it: an honest test
            if dist is not None:
                y = float(np.log(m.runtime_ms))
                pit.append(float(dist.cdf(np.array([y]))[0]))
                parent = seen[int(rng.integers(len(seen)))]
                p_faster.append(float(dist.p_faster_than(parent)[0]))
                faster.append(y < parent)
        if m.status == MeasureStatus.ok:
            seen.append(float(np.log(m.runtime_ms)))
        w0, c0 = time.perf_counter(), time.process_time()
        surrogate.update(config, m)
        dist = surrogate.predictive(batch)
        surrogate.p_fail(batch)
        if dist is not None:
            dist.speedup_bin_probs(np.zeros(len(batch)))
        wall.append(time.perf_counter() - w0)
        fit = surrogate.last_fit
        fitted = fit is not None and fit.fitted and fit.n_timed == surrogate.n_timed
        kind.append("crossfit" if fitted and fit.crossfit else "refresh" if fitted else "cold")
        cpu.append(time.process_time() - c0)
    return {
        "wall": np.array(wall),
        "kind": np.array(kind),
        "cpu": np.array(cpu),
        "pit": np.array(pit),
        "p_faster": np.array(p_faster),
        "faster": np.array(faster, dtype=float),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--spaces", nargs="+", default=["convolution_A100"])
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--growth", type=float, default=1.25, help="cross-fit when the data grew by this factor")
    ap.add_argument("--candidates", type=int, default=20, help="forecast after each update")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pit, pf, fa = [], [], []
    for name in args.spaces:
        space = ReplaySpace.load(args.data / f"{name}.json.gz")
        r = stream(space, args.points, args.growth, args.candidates, args.seed)
        w, c = r["wall"], r["cpu"]
        x, f = r["kind"] == "crossfit", r["kind"] == "refresh"
        print(
            f"{name}: {args.points} updates, growth {args.growth}: per update wall mean {w.mean() * 1e3:.0f} ms "
            f"(median {np.median(w) * 1e3:.0f}, max {w.max() * 1e3:.0f}), CPU mean {c.mean() * 1e3:.0f} ms "
            f"(median {np.median(c) * 1e3:.0f}, max {c.max() * 1e3:.0f}); total wall {w.sum():.1f} s; "
            f"{x.sum()} full cross-fits at CPU mean {c[x].mean() * 1e3:.0f} ms, {f.sum()} refreshes at "
            f"{c[f].mean() * 1e3 if f.any() else 0:.0f} ms, {(~x & ~f).sum()} cold-start updates",
            flush=True,
        )
        pit.append(r["pit"])
        pf.append(r["p_faster"])
        fa.append(r["faster"])
    pit_all, pf_all, fa_all = np.concatenate(pit), np.concatenate(pf), np.concatenate(fa)
    inside = np.mean((pit_all >= 0.1) & (pit_all <= 0.9))
    ece = M.expected_calibration_error(pf_all, fa_all.astype(bool))
    print(
        f"online calibration over {pit_all.size} next-measurement forecasts: 80% interval holds {inside:.1%}, "
        f"ECE of P(faster than a random earlier measurement) {ece:.3f}"
    )


if __name__ == "__main__":
    main()
