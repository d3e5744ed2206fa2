"""The offline policy for a recorded (replayed) tuning space: local moves plus random restarts.

Proposals are cheap because the forecaster, not the GPU, screens them: most neighbours of a good
configuration are proposed, forecast, and skipped without ever being measured.
"""

from __future__ import annotations

import random
from typing import Any, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.replay import ReplaySpace


class SpaceProposal(BaseModel):
    source: Optional[str] = None  # configurations have no source; the archive keys them by their values
    origin: str
    params: dict[str, Any]
    hypothesis: str = ""
    features: dict[str, Any] = Field(default_factory=dict)


class SpaceSearchPolicy:
    def __init__(self, space: ReplaySpace, random_fraction: float = 0.34):
        self.space = space
        self.random_fraction = random_fraction
        self._valid = [i for i in range(len(space))]

    def _neighbours(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for name in self.space.param_names:
            values = list(self.space.param_values[name])
            try:
                pos = values.index(config[name])
            except ValueError:
                continue
            for step in (-2, -1, 1, 2):
                j = pos + step
                if 0 <= j < len(values):
                    cand = dict(config, **{name: values[j]})
                    if self.space.index_of(cand) is not None:
                        out.append(cand)
        return out

    def propose(self, parent: dict[str, Any], k: int, rng: random.Random) -> list[SpaceProposal]:
        tried: set[str] = parent["tried"]
        base: Optional[dict] = parent.get("config")
        picks: list[tuple[str, dict]] = []
        seen = set()

        def add(origin: str, cfg: dict) -> None:
            key = parent["sha"](cfg)
            if key not in tried and key not in seen:
                seen.add(key)
                picks.append((origin, cfg))

        n_random = k if base is None else max(1, round(k * self.random_fraction))
        if base is not None:
            neigh = self._neighbours(base)
            rng.shuffle(neigh)
            for cfg in neigh:
                if len(picks) >= k - n_random:
                    break
                add("neighbour", cfg)
        attempts = 0
        while len(picks) < k and attempts < 50 * k:
            attempts += 1
            add("random", self.space.config(rng.choice(self._valid)))
        return [SpaceProposal(origin=o, params=c, hypothesis=f"{o} of the parent configuration" if o == "neighbour" else "random restart",
                              features=dict(c)) for o, c in picks]
