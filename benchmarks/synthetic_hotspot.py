"""A synthetic recorded space the size and shape of the benchmark hub's hotspot, which this checkout does not hold.

Run: python benchmarks/synthetic_hotspot.py OUT_DIR
Writes OUT_DIR/hotspot_syn.json.gz (a Kernel Tuner cache, objective GFLOP/s) and OUT_DIR/README.md (its
restrictions as strings, for Kernel Tuner in `kscout bench search`). Then, for example:

    kscout bench search OUT_DIR/hotspot_syn.json.gz --seeds 6

Why: hotspot is the hub's kernel whose space is six times the largest here (105,412 valid configurations under
HIP's shared-memory limit) and whose objective is not time: its GFLOP/s counts each of the
`temporal_tiling_factor` time steps one call computes. The parameters, their values and the restrictions are
hotspot's (`kernels/hotspot_milo.py` in the hub); the times are made up (a halo cost that temporal tiling and
tile sizes trade against, an occupancy term, 1 % failures, 32 repeats with 1 % noise), so what a search finds
here says how kernelscout copes with the size and the objective, not how it would do on the real GPU.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from pathlib import Path

import numpy as np

BLOCK_X = [1, 2, 4, 8, 16] + [32 * i for i in range(1, 33)]
BLOCK_Y = [2 ** i for i in range(6)]
ONE_TO_TEN = list(range(1, 11))
SHARED_MEMORY = 65536  # bytes per block on AMD (HIP); 49152 under CUDA gives 82,984 configurations
RESTRICTIONS = [
    "block_size_x*block_size_y >= 32",
    "temporal_tiling_factor % loop_unroll_factor_t == 0",
    "block_size_x*block_size_y <= 1024",
    f"(block_size_x*tile_size_x + temporal_tiling_factor * 2) * (block_size_y*tile_size_y + temporal_tiling_factor * 2) "
    f"* (2+sh_power) * 4 <= {SHARED_MEMORY}",
]


def made_up_time(bx: int, by: int, tx: int, ty: int, steps: int, unroll: int, sh_power: int, smem: int) -> float:
    """ms per call: `steps` time steps, each paying for the halo its tile recomputes, less per step the more steps a
    call fuses; occupancy falls away from 256 threads and with shared memory."""
    halo = ((bx * tx + 2 * steps) * (by * ty + 2 * steps)) / (bx * tx * by * ty)
    occupancy = 1 + abs(np.log2(bx * by / 256)) * 0.15 + smem / SHARED_MEMORY * 0.5
    shape = 1 + 0.03 * abs(tx - 3) + 0.03 * abs(ty - 3)
    unrolled = 1.05 if unroll == 1 and steps > 1 else 1.0
    return float(0.9 * steps * halo ** 0.8 * occupancy * shape * unrolled * (0.97 if sh_power else 1.0) / (1 + 0.6 * np.log(steps)))


def write(out: Path, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    tune_params = {"grid_width": [4096], "grid_height": [4096], "block_size_x": BLOCK_X, "block_size_y": BLOCK_Y,
                   "tile_size_x": ONE_TO_TEN, "tile_size_y": ONE_TO_TEN, "temporal_tiling_factor": ONE_TO_TEN,
                   "max_tfactor": [10], "loop_unroll_factor_t": ONE_TO_TEN, "sh_power": [0, 1]}
    cache = {}
    for bx, by, tx, ty, steps, unroll, sh in itertools.product(BLOCK_X, BLOCK_Y, ONE_TO_TEN, ONE_TO_TEN, ONE_TO_TEN,
                                                             ONE_TO_TEN, [0, 1]):
        smem = (bx * tx + 2 * steps) * (by * ty + 2 * steps) * (2 + sh) * 4
        if not 32 <= bx * by <= 1024 or steps % unroll or smem > SHARED_MEMORY:
            continue
        record = {"grid_width": 4096, "grid_height": 4096, "block_size_x": bx, "block_size_y": by, "tile_size_x": tx,
                  "tile_size_y": ty, "temporal_tiling_factor": steps, "max_tfactor": 10, "loop_unroll_factor_t": unroll,
                  "sh_power": sh}
        t = made_up_time(bx, by, tx, ty, steps, unroll, sh, smem) * np.exp(0.02 * rng.standard_normal())
        if rng.random() < 0.01:
            record["time"] = "RuntimeFailedConfig"
        else:
            repeats = (t * np.exp(0.01 * rng.standard_normal(32))).tolist()
            mean = float(np.mean(repeats))
            record.update(time=mean, times=repeats, **{"GFLOP/s": steps * 15 * 4096 * 4096 / 1e9 / (mean / 1e3)})
        cache[",".join(str(record[k]) for k in tune_params)] = record
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hotspot_syn.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"device_name": "AMD Radeon PRO W7800 (synthetic)", "kernel_name": "calculate_temp",
                   "problem_size": [4096, 4096], "tune_params_keys": list(tune_params), "tune_params": tune_params,
                   "objective": "GFLOP/s", "cache": cache}, fh)
    (out / "README.md").write_text("# A synthetic hotspot space (benchmarks/synthetic_hotspot.py)\n\n## Valid space of each kernel\n"
                                   f"- calculate_temp: {'; '.join(f'`{r}`' for r in RESTRICTIONS)}\n")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write hotspot_syn.json.gz and its README.md into")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    written = write(args.out, args.seed)
    print(f"{written}: {sum(1 for _ in json.load(gzip.open(written, 'rt'))['cache'])} configurations")
