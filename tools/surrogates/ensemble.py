"""A small, diverse regression ensemble for log-time, with a per-point spread.

Why three members: with ~50 measured configurations no single learner is best on every space
(extra-trees win on spaces with sharp interactions, the Gaussian process on smooth ones, boosting in
between); their average ranks configurations better than any one of them on the provided spaces, and
their disagreement, with the trees' and the GP's own spread, says where the model is unsure.

Members are deliberately small (100 trees, 300 depth-2 boosting stages, one GP on a few columns)
so that a fit plus five cross-validation refits takes about a second on one core.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
from sklearn.ensemble import ExtraTreesRegressor, GradientBoostingRegressor, RandomForestRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from kernelscout.tools.surrogates.features import FeatureBlocks

Member = Literal["et", "gbm", "gp", "rf"]
DEFAULT_MEMBERS: tuple[Member, ...] = ("et", "gbm", "gp")


@dataclass
class EnsemblePrediction:
    mean: np.ndarray  # predicted log-time
    spread: np.ndarray  # unnormalised uncertainty scale; conformal calibration fixes its units


class _Standardizer:
    def __init__(self, x: np.ndarray) -> None:
        self.mu = x.mean(axis=0)
        sd = x.std(axis=0)
        self.sd = np.where(sd > 0, sd, 1.0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mu) / self.sd


class LogTimeEnsemble:
    """Fits members on (features, log-time) and predicts mean and spread."""

    def __init__(self, members: Sequence[Member] = DEFAULT_MEMBERS, seed: int = 0) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = tuple(members)
        self.seed = seed
        self._models: dict[str, object] = {}
        self._gp_scale: Optional[_Standardizer] = None
        self.gp_kernel: Optional[Kernel] = None

    def fit(self, x: FeatureBlocks, y: np.ndarray, gp_kernel: Optional[Kernel] = None) -> LogTimeEnsemble:
        """Fit every member; `gp_kernel` reuses fitted GP hyperparameters (cheap refits for CV)."""
        y = np.asarray(y, dtype=float)
        self._models = {}
        for m in self.members:
            if m == "et":
                self._models[m] = ExtraTreesRegressor(
                    n_estimators=100, max_features=0.5, random_state=self.seed, n_jobs=1
                ).fit(x.full, y)
            elif m == "rf":
                self._models[m] = RandomForestRegressor(n_estimators=100, random_state=self.seed, n_jobs=1).fit(
                    x.full, y
                )
            elif m == "gbm":
                self._models[m] = GradientBoostingRegressor(
                    n_estimators=300, max_depth=2, learning_rate=0.05, subsample=0.7, random_state=self.seed
                ).fit(x.full, y)
            elif m == "gp":
                self._models[m] = self._fit_gp(x.compact, y, gp_kernel)
            else:
                raise ValueError(f"unknown ensemble member {m!r}")
        return self

    def _fit_gp(self, xc: np.ndarray, y: np.ndarray, kernel: Optional[Kernel]) -> GaussianProcessRegressor:
        self._gp_scale = _Standardizer(xc)
        d = max(xc.shape[1], 1)
        if kernel is None:
            kernel = ConstantKernel(1.0) * Matern(
                length_scale=np.full(d, 2.0), length_scale_bounds=(1e-2, 1e3), nu=1.5
            ) + WhiteKernel(1e-2, (1e-6, 1.0))
            optimizer: Optional[str] = "fmin_l_bfgs_b"
        else:
            optimizer = None
        gp = GaussianProcessRegressor(kernel, normalize_y=True, optimizer=optimizer, random_state=self.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(self._gp_scale(xc), y)
        self.gp_kernel = gp.kernel_
        return gp

    def predict(self, x: FeatureBlocks) -> EnsemblePrediction:
        means, variances = [], []
        for m, model in self._models.items():
            if m in ("et", "rf"):
                per_tree = np.stack([t.predict(x.full) for t in model.estimators_])  # type: ignore[attr-defined]
                means.append(per_tree.mean(axis=0))
                variances.append(per_tree.var(axis=0))
            elif m == "gbm":
                means.append(model.predict(x.full))  # type: ignore[attr-defined]
            elif m == "gp":
                assert self._gp_scale is not None
                mu, sd = model.predict(self._gp_scale(x.compact), return_std=True)  # type: ignore[attr-defined]
                means.append(mu)
                variances.append(sd**2)
        stacked = np.stack(means)
        mean = stacked.mean(axis=0)
        within = np.mean(variances, axis=0) if variances else np.zeros_like(mean)
        between = stacked.var(axis=0)
        return EnsemblePrediction(mean=mean, spread=np.sqrt(within + between))
