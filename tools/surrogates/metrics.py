"""Scores for surrogate forecasts: ranking, probabilistic accuracy, calibration, selective risk.

Pure functions over arrays, so that they can be checked on hand-made cases and reused by any
evaluation. Conventions: lower log-time is faster; a pair is (parent i, child j); ties in the truth are
dropped from ranking scores and ties in the prediction score half a hit, so that a constant forecaster
gets exactly 0.5 rather than an arbitrary number.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def sample_pairs(n: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` random ordered pairs (i, j) of distinct indices below `n`."""
    if n < 2:
        return np.empty(0, dtype=int), np.empty(0, dtype=int)
    i = rng.integers(0, n, count)
    j = (i + rng.integers(1, n, count)) % n
    return i, j


def pairwise_accuracy(score: np.ndarray, truth: np.ndarray, i: np.ndarray, j: np.ndarray) -> float:
    """Share of pairs that `score` orders as `truth` does (both: lower = faster)."""
    keep = truth[i] != truth[j]
    if not keep.any():
        return float("nan")
    s = np.sign(score[i] - score[j])[keep]
    t = np.sign(truth[i] - truth[j])[keep]
    return float(np.mean(np.where(s == 0, 0.5, (s == t).astype(float))))


def direction_accuracy(p_faster: np.ndarray, faster: np.ndarray) -> float:
    """Share of (parent, child) pairs where P(faster) falls on the right side of 1/2."""
    call = np.sign(np.asarray(p_faster) - 0.5)
    truth = np.where(np.asarray(faster, dtype=bool), 1.0, -1.0)
    return float(np.mean(np.where(call == 0, 0.5, (call == truth).astype(float))))


def average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of the ranks they span (scipy.stats.rankdata's "average")."""
    _, inverse, counts = np.unique(np.asarray(a, dtype=float), return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # ranks before each distinct value
    return (first + (counts + 1) / 2.0)[inverse.ravel()]


def spearman(score: np.ndarray, truth: np.ndarray) -> float:
    """Spearman's rank correlation, 0 when either side is constant.

    Computed here rather than with scipy.stats.spearmanr: importing scipy.stats costs about half a second,
    more than the rest of `kscout show`, which reports this number for every run it reads.
    """
    if np.ptp(score) == 0 or np.ptp(truth) == 0:
        return 0.0
    return float(np.corrcoef(average_ranks(score), average_ranks(truth))[0, 1])


def brier_multiclass(probs: np.ndarray, outcome: np.ndarray) -> float:
    """Mean over forecasts of sum_k (p_k - 1[k = outcome])^2, in [0, 2]."""
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(outcome)), outcome] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def ranked_probability_score(probs: np.ndarray, outcome: np.ndarray) -> float:
    """Mean RPS over ordinal bins, normalised by (K - 1) to lie in [0, 1]; near misses cost less."""
    k = probs.shape[1]
    cum_p = np.cumsum(probs, axis=1)[:, :-1]
    cum_o = (np.arange(k - 1)[None, :] >= outcome[:, None]).astype(float)
    return float(np.mean(np.sum((cum_p - cum_o) ** 2, axis=1) / (k - 1)))


def reliability_bins(p: np.ndarray, outcome: np.ndarray, n_bins: int = 10) -> list[tuple[float, float, int]]:
    """(mean forecast, observed frequency, count) per equal-width probability bin that has forecasts."""
    p = np.asarray(p, dtype=float)
    outcome = np.asarray(outcome, dtype=float)
    which = np.minimum((p * n_bins).astype(int), n_bins - 1)
    out = []
    for b in range(n_bins):
        m = which == b
        if m.any():
            out.append((float(p[m].mean()), float(outcome[m].mean()), int(m.sum())))
    return out


def expected_calibration_error(p: np.ndarray, outcome: np.ndarray, n_bins: int = 10) -> float:
    """Count-weighted mean |forecast - frequency| over equal-width bins (10 by default)."""
    bins = reliability_bins(p, outcome, n_bins)
    total = sum(c for _, _, c in bins)
    return float(sum(c * abs(mp - fo) for mp, fo, c in bins) / total) if total else float("nan")


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Error rate among the most confident k forecasts, for k = 1..n (ties broken by order)."""
    order = np.argsort(-np.asarray(confidence, dtype=float), kind="stable")
    errors = 1.0 - np.asarray(correct, dtype=float)[order]
    k = np.arange(1, errors.size + 1)
    return k / errors.size, np.cumsum(errors) / k


def aurc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk-coverage curve (lower is better; equals the error rate if confidence is useless)."""
    _, risk = risk_coverage(confidence, correct)
    return float(risk.mean()) if risk.size else float("nan")


def curve_at(coverage: np.ndarray, risk: np.ndarray, grid: Sequence[float]) -> list[float]:
    """Risk at fixed coverages, to average curves across seeds and spaces."""
    return [float(np.interp(g, coverage, risk)) for g in grid]


def top_fraction_recovery(score: np.ndarray, times: np.ndarray, fraction: float = 0.1) -> float:
    """Measure the `fraction` with the lowest score: best time in the pool over best time found (<= 1).

    `times` may hold NaN for configurations that fail; picking those finds nothing.
    """
    times = np.asarray(times, dtype=float)
    k = max(1, int(round(fraction * times.size)))
    chosen = np.argsort(score, kind="stable")[:k]
    found = np.nanmin(times[chosen]) if np.isfinite(times[chosen]).any() else np.inf
    return float(np.nanmin(times) / found)
