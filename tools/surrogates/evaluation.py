"""Held-out evaluation of a surrogate on recorded tuning spaces (what `kscout eval-surrogate` runs).

Protocol, per space and seed:

* Training: random configurations are measured on the replay device, in a random order, until
  `train` of them have a time; failures met on the way are charged and given to the surrogate too,
  as they would be in a real run. Labels are replayed measurements (bootstrap medians), so they are
  as noisy as real ones.
* Held-out pool: every other configuration of the space. The truth of a configuration is the median
  of its recorded repeats.
* "Faster" is pairwise: a pair is a random held-out parent, whose measured time is known, and a
  random held-out child, which is forecast. P(faster), the speedup bins and the confidence are the
  forecast of the child against that parent, exactly as `predict` makes them in a search.
* Pairwise ranking accuracy compares the forecasts of both configurations of a pair (no measured
  time used), i.e. how well the surrogate orders the pool; direction accuracy uses the parent's
  measured time, as the search does.
* Top-10% recovery measures the first 10% of the pool in the order a search would (`_measure_queue`)
  and compares the best time found with the best in the pool.
* Warm start: every other space of the same kernel (same kernel name and parameters) given to the
  evaluation becomes a prior; the target space itself never is.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace
from kernelscout.tools.schema import MeasureStatus
from kernelscout.tools.surrogates import metrics as M
from kernelscout.tools.surrogates.base import Surrogate
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, LogTimeDistribution
from kernelscout.tools.surrogates.registry import make_surrogate
from kernelscout.tools.surrogates.warmstart import PriorSource

COVERAGE_GRID = tuple(round(0.05 * k, 2) for k in range(1, 21))
METRIC_NAMES = (
    "pairwise_accuracy",
    "direction_accuracy",
    "spearman",
    "brier",
    "rps",
    "ece_p_faster",
    "aurc",
    "top10_recovery",
)


class EvalInputError(ValueError):
    """The settings cannot be evaluated on a space (e.g. more training configurations than it has)."""


class EvalSettings(BaseModel):
    surrogate: str = "learned"
    train: int = Field(50, ge=2, description="timed training configurations per space and seed")
    seeds: int = Field(10, ge=1)
    pairs: int = Field(20000, ge=100, description="(parent, child) pairs drawn from the held-out pool")
    warm_start: bool = False
    llm_configs: int = Field(60, ge=2, description="llm only: held-out configurations forecast per space and seed")
    top_fraction: float = 0.1
    edges: tuple[float, ...] = DEFAULT_EDGES


class ReliabilityBin(BaseModel):
    mean_forecast: float
    observed: float
    count: int


class SpaceResult(BaseModel):
    space: str
    device: str
    train_timed: int
    train_failed_mean: float = Field(description="failed configurations met while drawing the training set")
    heldout: int
    priors: list[str] = Field(default_factory=list)
    pairwise_accuracy: float
    direction_accuracy: float
    spearman: float
    brier: float
    rps: float
    ece_p_faster: float
    aurc: float
    top10_recovery: float
    std: dict[str, float] = Field(default_factory=dict, description="standard deviation across seeds")
    risk_coverage: list[tuple[float, float]] = Field(default_factory=list, description="(coverage, risk)")
    reliability: list[ReliabilityBin] = Field(default_factory=list)
    informative: Optional[float] = Field(None, description="llm only: share of forecasts that were usable, not deferrals")
    seconds: float


class EvalReport(BaseModel):
    settings: EvalSettings
    spaces: dict[str, SpaceResult]
    mean: dict[str, float]
    risk_coverage_mean: list[tuple[float, float]]
    reliability_pooled: list[ReliabilityBin]


def warm_start_priors(target: ReplaySpace, pool: Sequence[ReplaySpace], seed: int = 0) -> list[PriorSource]:
    """Other spaces of the same kernel, each as a prior for `target` (those with fewer than two timed
    configurations are left out: a prior needs at least two times to rank)."""
    return [PriorSource.from_space(s, seed=seed) for s in pool
            if s.path != target.path and s.same_kernel(target) and int(s.ok_mask.sum()) >= 2]


def train_on_replay(
    space: ReplaySpace, surrogate: Surrogate, train: int, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Measure random configurations until `train` have a time; returns the untouched pool and the
    number of failures met on the way (charged, and shown to the surrogate)."""
    device = ReplayDevice(space)
    order = rng.permutation(len(space))
    timed, used = 0, 0
    for idx in order:
        config = space.config(int(idx))
        m = device.measure(config, rng)
        surrogate.update(config, m)
        used += 1
        timed += m.status == MeasureStatus.ok
        if timed >= train:
            break
    return order[used:], used - timed


def seeded_rng(space: ReplaySpace, seed: int) -> np.random.Generator:
    """One generator per (space, seed), independent of the order spaces are evaluated in."""
    return np.random.default_rng([seed, zlib.crc32(space.name.encode())])


def _measure_queue(space: ReplaySpace, pool: np.ndarray, dist: LogTimeDistribution, p_fail: np.ndarray) -> np.ndarray:
    """Rank of each pooled config in the order a search would measure them: by the forecast chance of
    beating the best configuration measured so far (the training set's) and not failing, ties by
    predicted time. Ranking by P(beats best) rather than by predicted mean favours configurations the
    model is unsure about, which is where an unseen best hides."""
    seen = np.setdiff1d(np.arange(len(space)), pool)
    incumbent = np.nanmin(space.median_times[seen]) if np.isfinite(space.median_times[seen]).any() else np.inf
    promise = dist.p_faster_than(np.log(incumbent)) * (1.0 - p_fail) if np.isfinite(incumbent) else -dist.mu
    order = np.lexsort((dist.mu, -promise))
    rank = np.empty(order.size)
    rank[order] = np.arange(order.size)
    return rank


def _evaluate_once(
    space: ReplaySpace, settings: EvalSettings, priors: list[PriorSource], seed: int
) -> tuple[dict[str, float], dict[str, np.ndarray], int]:
    rng = seeded_rng(space, seed)
    surrogate = make_surrogate(settings.surrogate, space.param_values, priors=priors, seed=seed, valid=space.configs)
    pool, failed = train_on_replay(space, surrogate, settings.train, rng)
    values = np.asarray(space.configs, dtype=object)[pool]
    truth_all = np.log(space.median_times[pool])
    ok = np.isfinite(truth_all)
    ok_idx = np.flatnonzero(ok)
    truth = truth_all[ok_idx]

    dist = surrogate.predictive(values)
    i, j = M.sample_pairs(ok_idx.size, settings.pairs, rng)
    keep = truth[i] != truth[j]
    i, j = i[keep], j[keep]
    if i.size == 0:
        raise EvalInputError(f"{space.name}: every held-out configuration that ran has the same time, so there is "
                             "nothing to rank or forecast; leave this space out")
    faster = truth[j] < truth[i]
    speedup = np.exp(truth[i] - truth[j])
    outcome_bin = np.searchsorted(np.asarray(settings.edges), speedup, side="right")
    n_bins = len(settings.edges) + 1
    if dist is None:  # no forecast: uninformative probabilities, random order
        queue = rng.permutation(pool.size)
        p_faster = np.full(i.size, 0.5)
        bins = np.full((i.size, n_bins), 1.0 / n_bins)
        mu_ok = np.zeros(ok_idx.size)
    else:
        child = dist.subset(ok_idx[j])
        p_faster = child.p_faster_than(truth[i])
        bins = child.speedup_bin_probs(truth[i], settings.edges)
        mu_ok = dist.mu[ok_idx]
        queue = _measure_queue(space, pool, dist, surrogate.p_fail(values))
    confidence = np.abs(2 * p_faster - 1)
    correct = np.where(p_faster == 0.5, 0.5, ((p_faster > 0.5) == faster).astype(float))
    coverage, risk = M.risk_coverage(confidence, correct)
    scores = {
        "pairwise_accuracy": M.pairwise_accuracy(mu_ok, truth, i, j),
        "direction_accuracy": M.direction_accuracy(p_faster, faster),
        "spearman": M.spearman(mu_ok, truth),
        "brier": M.brier_multiclass(bins, outcome_bin),
        "rps": M.ranked_probability_score(bins, outcome_bin),
        "ece_p_faster": M.expected_calibration_error(p_faster, faster),
        "aurc": float(risk.mean()),
        "top10_recovery": M.top_fraction_recovery(queue, np.exp(truth_all), settings.top_fraction),
    }
    curves = {
        "risk": np.asarray(M.curve_at(coverage, risk, COVERAGE_GRID)),
        "p_faster": p_faster,
        "faster": faster.astype(float),
    }
    return scores, curves, failed


def evaluate_space(space: ReplaySpace, settings: EvalSettings, pool: Sequence[ReplaySpace] = (), model: Any = None) -> SpaceResult:
    """`model`: the chat model, for `settings.surrogate == "llm"` (tools/surrogates/llm_evaluation.py)."""
    start = time.perf_counter()
    ran = int(np.isfinite(space.median_times).sum())
    if ran < 4:
        raise EvalInputError(f"{space.name}: only {ran} of its configurations ran on the hardware; an evaluation needs at least "
                             "4 (2 to train on and 2 to evaluate on), so leave this space out")
    if settings.train + 2 > ran:
        raise EvalInputError(f"{space.name}: {ran} of its configurations ran on the hardware, so --train {settings.train} leaves "
                         f"fewer than 2 to evaluate on; ask for at most {max(2, ran - 2)} (half, {max(2, ran // 2)}, "
                         "leaves as many to evaluate on)")
    priors = warm_start_priors(space, pool) if settings.warm_start else []
    per_seed: list[dict[str, float]] = []
    risks, ps, outs, fails = [], [], [], []
    for seed in range(settings.seeds):
        if settings.surrogate == "llm":
            from kernelscout.tools.surrogates.llm_evaluation import evaluate_llm_once

            scores, curves, failed = evaluate_llm_once(space, settings, model, seed, priors)
        else:
            scores, curves, failed = _evaluate_once(space, settings, priors, seed)
        per_seed.append(scores)
        risks.append(curves["risk"])
        ps.append(curves["p_faster"])
        outs.append(curves["faster"])
        fails.append(failed)
    mean = {k: float(np.mean([s[k] for s in per_seed])) for k in METRIC_NAMES}
    std = {k: float(np.std([s[k] for s in per_seed])) for k in METRIC_NAMES}
    p_all, o_all = np.concatenate(ps), np.concatenate(outs)
    return SpaceResult(
        space=space.name,
        device=space.device_label,
        train_timed=settings.train,
        train_failed_mean=float(np.mean(fails)),
        heldout=(min(settings.llm_configs, ran - settings.train) if settings.surrogate == "llm"
                 else len(space) - settings.train - int(round(np.mean(fails)))),
        informative=float(np.mean([s["informative"] for s in per_seed])) if settings.surrogate == "llm" else None,
        priors=[p.name for p in priors],
        std=std,
        risk_coverage=list(zip(COVERAGE_GRID, np.mean(risks, axis=0).tolist())),
        reliability=[
            ReliabilityBin(mean_forecast=a, observed=b, count=c) for a, b, c in M.reliability_bins(p_all, o_all)
        ],
        seconds=time.perf_counter() - start,
        **mean,
    )


def evaluate(
    spaces: Sequence[ReplaySpace],
    settings: EvalSettings,
    progress: Optional[Callable[[SpaceResult], None]] = None,
    model: Any = None,
) -> EvalReport:
    """Evaluate on every space; the mean is over spaces (each weighs the same)."""
    results: dict[str, SpaceResult] = {}
    for s in spaces:
        results[s.name] = evaluate_space(s, settings, pool=spaces, model=model)
        if progress is not None:
            progress(results[s.name])
    mean = {k: float(np.mean([getattr(r, k) for r in results.values()])) for k in METRIC_NAMES}
    rc = np.mean([[r for _, r in res.risk_coverage] for res in results.values()], axis=0)
    pooled = _pool_reliability([res.reliability for res in results.values()])
    return EvalReport(
        settings=settings,
        spaces=results,
        mean=mean,
        risk_coverage_mean=list(zip(COVERAGE_GRID, rc.tolist())),
        reliability_pooled=pooled,
    )


def _pool_reliability(tables: Sequence[Sequence[ReliabilityBin]], n_bins: int = 10) -> list[ReliabilityBin]:
    acc: dict[int, list[float]] = {}
    for table in tables:
        for b in table:
            k = min(int(b.mean_forecast * n_bins), n_bins - 1)
            s = acc.setdefault(k, [0.0, 0.0, 0.0])
            s[0] += b.mean_forecast * b.count
            s[1] += b.observed * b.count
            s[2] += b.count
    return [ReliabilityBin(mean_forecast=f / c, observed=o / c, count=int(c)) for k, (f, o, c) in sorted(acc.items())]
