"""What a search was asked to do, as stored in its run directory: the loop's settings and the search's spec.

Kept apart from the loop (agent/graph.py) so that reading a run (`kscout show`, reports, the MCP
server's views) does not import LangGraph, which takes most of a second.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.objectives import Objective

SPEC_KEY = "search_spec"  # the run's meta key holding the SearchSpec as JSON
SOLVED_CHANCE = 0.05  # a recorded space's search stops once what is left has less chance than this of a clear win


class SearchSettings(BaseModel):
    """Knobs of the loop; stored in the run directory so `kscout resume` continues with the same ones."""

    budget: int = Field(10, ge=1, description="hard cap on measurements")
    proposals_per_iteration: int = Field(6, ge=1)
    measure_per_iteration: int = Field(1, ge=1, description="at most this many measurements per iteration")
    pending_limit: int = Field(32, ge=0, description="unmeasured, not-skipped candidates kept for later iterations")
    patience: int = Field(0, ge=0, description="stop after this many measurements without a new best (0: never)")
    max_wall_s: Optional[float] = Field(None, description="stop after this many seconds")
    sol_margin: float = Field(1.05, description="stop when the best time is within this factor of speed-of-light")
    near_sol: float = Field(1.5, description="within this factor of speed-of-light, spend at most half the budget")
    max_device_s: Optional[float] = Field(None, description="stop after this many seconds of measurement time on the device")
    max_usd: Optional[float] = Field(None, description="stop when LLM calls have cost this much")
    max_llm_tokens: Optional[int] = Field(None, description="stop when LLM calls have used this many tokens")
    confirm: int = Field(0, ge=0, description="measurements kept back to re-measure the best candidate once the search stops")
    solved_chance: float = Field(SOLVED_CHANCE, ge=0, lt=1, description="on a recorded space, stop once the surrogate gives the "
                                 "configurations left less than this chance, together, of beating the best by more than 2 % (0: never)")
    seed: int = 0


class SearchSpec(BaseModel):
    kind: Literal["problem", "space"]
    path: str
    device: str = "cpu"
    policy: str = "tuner"
    surrogate: str = "learned"
    settings: SearchSettings = Field(default_factory=SearchSettings)
    warm_start: list[str] = Field(default_factory=list, description="recorded spaces of the same kernel on other devices")
    objective: Objective = Field("file", description="a recorded space's: the objective its file names where kscout "
                                               "can follow it, or the recorded time per call (`--objective time`)")
    start: list[str] = Field(default_factory=list, description="the user's own kernels, measured first as children of the reference")
    history: Optional[list[str]] = Field(None, description="folders of earlier runs whose measurements make the learned "
                                         "surrogate's prior (None or []: no prior)")
    rewrites: Optional[list[str]] = Field(None, description="the generic rewrites the offline tuner may try (None: every one "
                                          "that applies; []: none, so only the TUNABLE knobs of the --start kernels are tuned)")
