"""Small synthetic Kernel Tuner cache files, for tests and demos that must not depend on real data.

The synthetic kernel has what real spaces have: a warp-alignment effect, a sweet spot in a tile size,
a flag that interacts with the block size, a string-valued parameter, a constant parameter, configs
excluded by a restriction (absent from the file), and both failure markers. `device_skew` makes a
second "GPU" whose landscape is correlated with, but not equal to, the first, for warm-start tests.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
from pathlib import Path

import numpy as np

TUNE_PARAMS: dict[str, list] = {
    "block_size_x": [16 * k for k in range(1, 17)],
    "tile_size": [1, 2, 3, 4],
    "use_shmem": [0, 1],
    "variant": ["plain", "unrolled"],
    "filter": [15],
}


def synthetic_time(config: dict, device_skew: float = 0.0) -> float:
    """Noise-free time in ms of one configuration on a device with the given skew."""
    bx, tile, shmem, variant = config["block_size_x"], config["tile_size"], config["use_shmem"], config["variant"]
    t = 1.0
    t *= 1.6 if bx % 32 else 1.0  # partial warps waste lanes
    t *= 1.0 + 0.25 * abs(math.log2(bx / (128 * (1 + device_skew))))  # sweet spot moves across devices
    t *= {1: 1.5, 2: 1.0, 3: 1.3, 4: 1.1 + device_skew}[tile]
    t *= 0.7 if shmem and bx >= 64 else 1.05
    t *= 0.9 if variant == "unrolled" and tile >= 2 else 1.0
    return t * (2.0 + 3.0 * device_skew)


def _outcome(config: dict) -> str | None:
    if config["block_size_x"] * config["tile_size"] > 640:
        return "RuntimeFailedConfig"
    if config["block_size_x"] == 16 and config["tile_size"] == 4 and config["use_shmem"]:
        return "CompilationFailedConfig"
    return None


def _allowed(config: dict) -> bool:
    return not (config["use_shmem"] and config["tile_size"] == 3 and config["block_size_x"] % 64 == 0)


def write_synthetic_cache(
    path: str | Path,
    device_name: str = "Synthetic GPU A",
    device_skew: float = 0.0,
    seed: int = 0,
    repeats: int = 7,
    noise: float = 0.01,
    unterminated: bool = False,
) -> Path:
    """Write a brute-forced synthetic space as a Kernel Tuner cache (.json or .json.gz)."""
    rng = np.random.default_rng(seed)
    names = list(TUNE_PARAMS)
    cache = {}
    for values in itertools.product(*TUNE_PARAMS.values()):
        config = dict(zip(names, values))
        if not _allowed(config):
            continue
        key = ",".join(str(v) for v in values)
        failure = _outcome(config)
        if failure:
            cache[key] = {**config, "time": failure, "times": []}
            continue
        base = synthetic_time(config, device_skew)
        times = (base * np.exp(rng.normal(0.0, noise, repeats))).tolist()
        cache[key] = {**config, "time": float(np.mean(times)), "times": times}
    doc = {
        "device_name": device_name,
        "kernel_name": "synthetic_kernel",
        "problem_size": [4096],
        "tune_params_keys": names,
        "tune_params": TUNE_PARAMS,
        "objective": "time",
        "cache": cache,
    }
    text = json.dumps(doc)
    if unterminated:  # as an interrupted Kernel Tuner run leaves it
        text = text[:-2] + ",\n"
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path
