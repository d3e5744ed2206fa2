"""`predict`: forecast a candidate's speedup over its measured parent before spending a measurement.

A forecast is a probability over ordinal speedup bins (parent time / child time, as in GPU
Forecasters) plus what a search needs to decide: P(faster than the parent), P(beats the incumbent
best), the expected speedup, an interval, P(fail), a confidence and a one-line rationale, and what the
forecast itself cost. The surrogate supplies a predictive distribution of the child's log-time; every
probability here is read off it the same way for every surrogate, and the parent's measured time is
the reference that turns it into a speedup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field, field_validator

from kernelscout.tools.surrogates.base import NoneSurrogate, Surrogate
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, LogTimeDistribution, bin_labels
from kernelscout.tools.surrogates.registry import make_surrogate, register_surrogate, surrogate_names

__all__ = [
    "Candidate",
    "Parent",
    "PredictContext",
    "SurrogateCost",
    "Forecast",
    "predict",
    "predict_many",
    "make_surrogate",
    "register_surrogate",
    "surrogate_names",
    "NoneSurrogate",
]

CLEAR_WIN = 0.02
"""A win counts as clear when it beats the best by this share of its time: more than a measurement's
noise. A twin of the best that differs only in a switch the model cannot tell apart has an even chance
of beating it by a hair; that chance says nothing about a gain worth a measurement, so the search ranks
by the chance of a clear win (docs/search_experiments.md, twenty-fifth session)."""


class Candidate(BaseModel):
    """Something that could be measured: a tunable-parameter config (replay), or a code file (later)."""

    config: dict[str, Any] = Field(default_factory=dict, description="tunable parameter values")
    source_path: Optional[str] = Field(None, description="kernel source, for code-level surrogates")
    name: Optional[str] = None


class Parent(Candidate):
    """The candidate's parent, already measured: its time is the reference of every speedup."""

    runtime_ms: float = Field(gt=0)


class PredictContext(BaseModel):
    incumbent_runtime_ms: Optional[float] = Field(None, gt=0, description="best time measured so far")
    sol_runtime_ms: Optional[float] = Field(
        None, gt=0, description="speed-of-light time on this device; no candidate can beat it"
    )
    device: str = ""


class SurrogateCost(BaseModel):
    latency_ms: float
    tokens_in: int = 0
    tokens_out: int = 0


class Forecast(BaseModel):
    surrogate: str
    informative: bool = Field(description="False when the surrogate had nothing to go on (cold start, none)")
    bin_edges: list[float]
    bin_labels: list[str]
    bin_probs: list[float] = Field(description="P(parent time / child time in each bin)")
    p_faster: float = Field(ge=0, le=1)
    p_beats_incumbent: Optional[float] = Field(None, ge=0, le=1)
    p_clear_win: Optional[float] = Field(None, ge=0, le=1, description="P(beats the best so far by at least "
                                         "CLEAR_WIN, 2 % of its time): what a search ranks the candidates worth measuring by")
    expected_speedup: Optional[float] = None
    speedup_interval_80: Optional[tuple[float, float]] = None
    predicted_runtime_ms: Optional[float] = Field(None, description="median of the predictive distribution")
    p_fail: Optional[float] = Field(None, ge=0, le=1, description="P(the child fails: does not build, crashes or is "
                                    "wrong); None where the surrogate does not say (an uninformative forecast, the LLM's)")
    confidence: float = Field(ge=0, le=1, description="|2 P(faster) - 1|: 0 = coin flip, 1 = certain")
    rationale: str
    cost: SurrogateCost

    @field_validator("bin_probs")
    @classmethod
    def _sums_to_one(cls, v: list[float]) -> list[float]:
        if v and abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"bin probabilities sum to {sum(v)}")
        return v


def uninformative_forecast(surrogate: str, reason: str, edges: Sequence[float], cost: SurrogateCost) -> Forecast:
    """A forecast that says nothing: uniform bins, P(faster) 1/2, confidence 0, and why (never scored)."""
    k = len(edges) + 1
    return Forecast(
        surrogate=surrogate,
        informative=False,
        bin_edges=list(edges),
        bin_labels=bin_labels(edges),
        bin_probs=[1.0 / k] * k,
        p_faster=0.5,
        confidence=0.0,
        rationale=reason,
        cost=cost,
    )


def floor_holds(context: PredictContext) -> bool:
    """Whether the speed-of-light time bounds the forecasts: not once the best measured time is under it, since a
    bound that a verified kernel beat is not a bound on this device (a floor there forecasts P(faster) 0 for every
    child of the best)."""
    sol = context.sol_runtime_ms
    return bool(sol) and (context.incumbent_runtime_ms is None or context.incumbent_runtime_ms >= sol)


def predict_many(
    candidates: Sequence[Candidate],
    parent: Parent | Sequence[Parent],
    context: PredictContext,
    surrogate: Surrogate,
    edges: Sequence[float] = DEFAULT_EDGES,
) -> list[Forecast]:
    """Forecast several children of one parent (or each of its own parent) with a single surrogate call."""
    start = time.perf_counter()
    if not candidates:
        return []
    configs = [c.config for c in candidates]
    dist = surrogate.predictive(configs) if all(configs) else None
    p_fail = surrogate.p_fail(configs) if all(configs) else None  # a code child's chance of failing, no model here says
    tokens_in, tokens_out = getattr(surrogate, "last_tokens", (0, 0))
    if dist is None:
        reason = surrogate.status() if all(configs) else f"{surrogate.name} forecasts configurations only"
        cost = SurrogateCost(latency_ms=(time.perf_counter() - start) * 1e3 / len(candidates))
        return [uninformative_forecast(surrogate.name, reason, edges, cost) for _ in candidates]
    if floor_holds(context):
        dist.floor = np.full(len(dist), math.log(context.sol_runtime_ms))
    forecasts = _read_forecasts(dist, parent, context, surrogate, edges, p_fail)
    per = (time.perf_counter() - start) * 1e3 / len(candidates)
    for f in forecasts:
        f.cost = SurrogateCost(latency_ms=per, tokens_in=tokens_in, tokens_out=tokens_out)
    return forecasts


def _read_forecasts(
    dist: LogTimeDistribution,
    parent: Parent | Sequence[Parent],
    context: PredictContext,
    surrogate: Surrogate,
    edges: Sequence[float],
    p_fail: Optional[np.ndarray],
) -> list[Forecast]:
    parents = [parent] * len(dist) if isinstance(parent, Parent) else list(parent)
    yp = np.log([p.runtime_ms for p in parents])
    bins = dist.speedup_bin_probs(yp, edges)
    p_faster = dist.p_faster_than(yp)
    p_beats = dist.p_faster_than(math.log(context.incumbent_runtime_ms)) if context.incumbent_runtime_ms else None
    p_clear = dist.p_faster_than(math.log(context.incumbent_runtime_ms * (1 - CLEAR_WIN))) if context.incumbent_runtime_ms else None
    q10, q50, q90 = dist.quantiles([0.1, 0.5, 0.9]).T
    expected = dist.expected_speedup(yp)
    status = surrogate.status()
    out = []
    for k in range(len(dist)):
        lo, hi = float(np.exp(yp[k] - q90[k])), float(np.exp(yp[k] - q10[k]))
        pb = None if p_beats is None else float(p_beats[k])
        rationale = (
            f"{status}: child predicted {np.exp(q50[k]):.4g} ms (80%: {np.exp(q10[k]):.4g}-{np.exp(q90[k]):.4g}) "
            f"vs parent {parents[k].runtime_ms:.4g} ms; P(faster)={p_faster[k]:.2f}"
            + (f", P(beats best {context.incumbent_runtime_ms:.4g} ms)={pb:.2f}, by {CLEAR_WIN:.0%} or more {p_clear[k]:.2f}"
               if pb is not None else "")
        )
        probs = np.clip(bins[k], 0.0, 1.0)
        probs = probs / probs.sum()
        out.append(
            Forecast(
                surrogate=surrogate.name,
                informative=True,
                bin_edges=list(edges),
                bin_labels=bin_labels(edges),
                bin_probs=probs.tolist(),
                p_faster=float(p_faster[k]),
                p_beats_incumbent=pb,
                p_clear_win=None if p_clear is None else float(p_clear[k]),
                expected_speedup=float(expected[k]),
                speedup_interval_80=(lo, hi),
                predicted_runtime_ms=float(np.exp(q50[k])),
                p_fail=None if p_fail is None else float(np.clip(p_fail[k], 0.0, 1.0)),
                confidence=float(abs(2 * p_faster[k] - 1)),
                rationale=rationale,
                cost=SurrogateCost(latency_ms=0.0),
            )
        )
    return out


def predict(candidate: Candidate, parent: Parent, context: PredictContext, surrogate: Surrogate) -> Forecast:
    """Forecast one candidate's speedup over its measured parent."""
    return predict_many([candidate], parent, context, surrogate)[0]
