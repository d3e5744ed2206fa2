"""The cold-start design on a recorded space: spread-out configurations, every code value seen early."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np

from kernelscout.agent.bench import _space
from kernelscout.agent.policies.space_search import SpaceSearchPolicy, maximin_design
from kernelscout.agent.targets import config_sha


def write_method_space(folder: Path) -> Path:
    """block in 16..512 x tile in 1..8 x method in 0..3; method 3 is fast, but only with large blocks."""
    cache = {}
    for b, t, m in itertools.product([16, 32, 64, 128, 256, 512], range(1, 9), range(4)):
        time = 10.0 / t + 64.0 / b + (0.5 if m == 3 and b >= 256 else 3.0 + m)
        cache[f"{b},{t},{m}"] = {"block": b, "tile": t, "method": m, "time": time, "times": [time] * 3,
                                 "compile_time": 1.0, "verification_time": 0, "benchmark_time": 1.0}
    path = folder / "method_GPU.json"
    path.write_text(json.dumps({"device_name": "Method GPU", "kernel_name": "method_kernel", "problem_size": [64],
                                "tune_params_keys": ["block", "tile", "method"],
                                "tune_params": {"block": [16, 32, 64, 128, 256, 512], "tile": list(range(1, 9)), "method": [0, 1, 2, 3]},
                                "objective": "time", "cache": cache}))
    return path


def test_maximin_design_takes_the_far_ends_first_and_never_repeats_a_point() -> None:
    line = np.arange(11, dtype=float)[:, None]
    picks = maximin_design(line, 3, first=5)
    assert picks[0] == 5 and sorted(picks[1:]) == [0, 10]
    twice = np.vstack([line, line])  # duplicates: once every distinct point is taken, the design stops
    assert len(maximin_design(twice, 30)) == 11


class ColdForecaster:
    """A surrogate still in its cold start: it cannot rank the space yet."""

    measure_all = False


def cold_start_proposals(space, seed: int, n: int) -> list[dict]:
    policy = SpaceSearchPolicy(space, forecaster=ColdForecaster())
    sha = lambda cfg: config_sha(space, cfg)  # noqa: E731
    tried: set[str] = set()
    out: list[dict] = []
    it = 0
    while len(out) < n:
        props = policy.propose({"config": None, "tried": set(tried), "sha": sha}, 3, random.Random(f"{seed}:{it}"))
        assert all(sha(p.params) not in tried for p in props)
        out += [p.params for p in props]
        tried |= {sha(p.params) for p in props}
        it += 1
    return out[:n]


def test_the_cold_start_design_reaches_both_ends_of_every_parameter(tmp_path: Path) -> None:
    space = _space(str(write_method_space(tmp_path)))
    for seed in range(5):
        first = cold_start_proposals(space, seed, 8)  # what the surrogate learns from before its first forecast
        assert len({tuple(c.values()) for c in first}) == 8
        for name, ends in (("block", {16, 512}), ("tile", {1, 8}), ("method", {0, 3})):
            assert ends <= {c[name] for c in first}, (seed, name)
        assert len({c["method"] for c in first}) >= 3
    assert cold_start_proposals(space, 1, 8) == cold_start_proposals(space, 1, 8)  # reproducible under a seed


def test_after_the_design_the_cold_start_keeps_proposing_unmeasured_configurations(tmp_path: Path) -> None:
    space = _space(str(write_method_space(tmp_path)))
    many = cold_start_proposals(space, 0, 60)  # beyond the design: random configurations, never a repeat
    assert len({tuple(c.values()) for c in many}) == 60
