"""Recalibrate threshold probabilities such as P(faster) from held-out pairs.

A conformal predictive distribution is calibrated marginally (its PIT is uniform), but P(faster) asks
a conditional question: is this child faster than that measured parent? The ensemble's spread is only
a rough guide to where it is wrong, so those probabilities come out somewhat over- or under-confident.
An isotonic map fitted on out-of-fold pairs of training points (the child's cross-validated forecast
against the parent's measured time) fixes that without touching the ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
from sklearn.isotonic import IsotonicRegression

from kernelscout.tools.surrogates.distribution import kernel_cdf

MIN_POINTS = 12  # below this the pairs are too few and too correlated to fit a map
RAW_SHARE = 0.1  # weight of the uncalibrated probability in the calibrated one
MAX_POINTS = 200  # pairs grow quadratically; 200 points give ~40k pairs, plenty


class IsotonicCalibrator:
    """A monotone map [0, 1] -> [0, 1]; identity until fitted."""

    def __init__(self) -> None:
        self._iso: Optional[IsotonicRegression] = None

    @property
    def fitted(self) -> bool:
        return self._iso is not None

    def fit(self, probs: np.ndarray, outcomes: np.ndarray) -> IsotonicCalibrator:
        probs = np.asarray(probs, dtype=float).ravel()
        outcomes = np.asarray(outcomes, dtype=float).ravel()
        # Pin the ends so that a certain forecast stays certain-ish and the map stays a CDF transform.
        x = np.concatenate([probs, [0.0, 1.0]])
        y = np.concatenate([outcomes, [0.0, 1.0]])
        w = np.concatenate([np.ones_like(probs), [1.0, 1.0]])
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y, sample_weight=w)
        self._iso = iso
        # np.interp on the fitted steps is what IsotonicRegression.predict does, minus its overhead.
        self._xs, self._ys = iso.X_thresholds_, iso.y_thresholds_
        return self

    def __call__(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        if self._iso is None:
            return p
        # Isotonic steps are flat, and the lowest is often exactly 0: every tail candidate would look
        # equally hopeless. A small share of the raw probability keeps the map strictly increasing.
        return (1.0 - RAW_SHARE) * np.interp(p, self._xs, self._ys) + RAW_SHARE * p


def out_of_fold_pair_probs(
    y: np.ndarray,
    mu: np.ndarray,
    scale: np.ndarray,
    residuals: np.ndarray,
    bandwidth: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw P(child j faster than parent i) for all pairs i != j of training points, and the outcomes.

    `mu`, `scale` are out-of-fold predictions and `residuals[j]` is point j's own normalised
    residual, which is left out of j's distribution so that no point forecasts itself.
    """
    n = y.size
    idx = rng.choice(n, size=min(n, MAX_POINTS), replace=False)
    y, mu, scale, residuals = y[idx], mu[idx], scale[idx], residuals[idx]
    m = y.size
    z = (y[:, None] - mu[None, :]) / scale[None, :]  # z[i, j]: parent i's time under child j's forecast
    total = np.zeros((m, m))
    for e in residuals:
        total += kernel_cdf((z - e) / bandwidth)
    own = kernel_cdf((z - residuals[None, :]) / bandwidth)
    probs = (total - own) / max(m - 1, 1)
    outcome = (y[None, :] < y[:, None]).astype(float)
    keep = ~np.eye(m, dtype=bool) & (y[None, :] != y[:, None])
    return probs[keep], outcome[keep]


def fit_pair_calibrator(
    y: Sequence[float] | np.ndarray,
    mu: np.ndarray,
    scale: np.ndarray,
    residuals: np.ndarray,
    bandwidth: float,
    rng: np.random.Generator,
) -> IsotonicCalibrator:
    y = np.asarray(y, dtype=float)
    cal = IsotonicCalibrator()
    if y.size < MIN_POINTS:
        return cal
    probs, outcomes = out_of_fold_pair_probs(y, mu, scale, residuals, bandwidth, rng)
    return cal.fit(probs, outcomes)
