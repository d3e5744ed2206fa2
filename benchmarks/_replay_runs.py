"""Shared by the replay benchmarks: one function over every (recorded space, seed), in spawned processes.

Spawned, not forked: each run starts from a fresh interpreter, as `kscout optimize` would, so one run's
imports and random state cannot leak into the next. Each run gets its own scratch run directory, removed
at the end; `fn` receives (space path, budget, seed, run directory) and returns what it read there.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def over_spaces_and_seeds(fn: Callable[[tuple[str, int, int, str]], Any], paths: Sequence[Path], budget: int,
                          seeds: int, processes: int) -> list[Any]:
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(str(p), budget, s, f"{tmp}/{p.name}-{s}") for p in paths for s in range(seeds)]
        with mp.get_context("spawn").Pool(processes) as pool:
            return pool.map(fn, jobs)
