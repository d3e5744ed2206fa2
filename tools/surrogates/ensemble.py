"""A small, diverse regression ensemble for log-time, with a per-point spread, that updates cheaply.

Why extra-trees plus a Gaussian process: with ~50 measured configurations no single learner is best
on every space (extra-trees win on spaces with sharp interactions, the GP on smooth ones); their
average ranks configurations better than either on the provided spaces, and their disagreement, with
the trees' and the GP's own spread, says where the model is unsure. Gradient boosting ("gbm") is still
available but not a default member: on the provided spaces it added no ranking accuracy to et+gp and
cost more than both together (300 sequential stages). Settings, chosen on the provided spaces with
the same values for every space: extra-trees consider every feature at each split (`max_features=1.0`:
with ~50 points, random feature subsets mostly add noise), and the GP uses a Matern-5/2 kernel with one
length scale per compact feature; both were worth a few thousandths of pairwise accuracy.

Why a prior on the GP's length scales (`LENGTH_SCALE_PRIOR`, log-normal, median 8 standardised units,
log-sd 1): with ~50 points and 8-26 compact features, maximum likelihood
happily makes a few length scales short, so the GP chases single points and ranks the unseen
configurations between them badly. The prior keeps a length scale short only where the data insist.
On the provided spaces (50 training points, 10 seeds, same draws) a median of 4 raised the GP alone
from 0.825 to 0.833 pairwise accuracy and the ensemble from 0.842 to 0.844; with the thread-block
columns (features.py) a median of 8 scores 0.852 against 0.850 for 4. Much longer scales, as suggested
for high-dimensional Bayesian optimisation (about 16 here), were worse. It costs nothing: the penalty
is added to the objective L-BFGS-B already minimises. The search starts from length scales of 2
(`LENGTH_SCALE_START`), not from the median: started at 8, a flat fit that calls every difference
noise is a local optimum L-BFGS-B does not leave (on a two-feature cliff it predicted one constant;
on the provided spaces starting at 2 scores 0.8527 against 0.8520).

Why `refresh`: the search asks for forecasts after every measurement. Refitting a 100-tree forest and
re-optimising the GP's hyperparameters each time costs about a second on the shared 2-core machines;
`refresh` instead refits the GP with its hyperparameters kept (one Cholesky factorisation, a few ms) and
regrows the trees on all the data, so every measurement is seen by the whole model at once. Until the
thirtieth session it regrew only the oldest tenth of the trees (`REFRESH_SHARE = 0.1`), and a new
measurement reached the whole forest only after ten updates. Regrowing all of them costs about 3 s more
CPU over a stream of 100 measurements (benchmarks/surrogate_update_speed.py; in the search benchmark's
runs the difference did not show) and gains a little early: paired over 120
seeds on the four hardest spaces, +0.011 of the optimum at 20 measurements, +0.007 at 50 and +0.003 at
100, level on the other four (docs/search_experiments.md). Trees are grown with `n_jobs=1`: at this
size a tree takes about a millisecond and joblib's start-up would cost more than it saves. Growing them in 2
threads of a pool kept for the process (each tree seeded before any is grown, so the same trees and the same
search) was tried on 2026-12-04 on recorded spaces, where nothing is timed on the CPU: alone, a 100-tree forest
on 100 points grew 1.4-1.8 times as fast, but a whole search gained on gemm_RTX_3090 (150 measurements, seed 3:
32.7 s to 26.8 s) and lost on convolution_A100 (100, seed 0: 12.0 and 12.3 s to 13.1 and 13.0 s), so it was not kept.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import sklearn
from scipy.optimize import minimize
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel
from sklearn.tree import ExtraTreeClassifier, ExtraTreeRegressor
from threadpoolctl import ThreadpoolController

from kernelscout.tools.surrogates.features import FeatureBlocks

Member = Literal["et", "gbm", "gp", "rf"]
DEFAULT_MEMBERS: tuple[Member, ...] = ("et", "gp")
N_TREES = 100
REFRESH_SHARE = 1.0  # share of a forest's trees regrown by one `refresh`, the oldest first
WARM_GP_ITERATIONS = 15  # L-BFGS-B iterations when GP hyperparameters start from an earlier fit
LENGTH_SCALE_PRIOR = (8.0, 1.0)  # GP length scales (standardised inputs): log-normal median and log-sd
LENGTH_SCALE_START = 2.0  # where the hyperparameter search starts (see the module docstring)


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


@functools.cache
def _threads() -> ThreadpoolController:
    """Built once: finding the loaded BLAS libraries takes milliseconds, more than a small GP fit."""
    return ThreadpoolController()


def grow_extra_trees(n_trees: int, seed: int, x: np.ndarray, y: np.ndarray, classify: bool = False) -> list:
    """`n_trees` extra-trees fitted on all of (x, y): an extra-trees forest without bootstrap is exactly that.

    Grown one by one with sklearn's parameter validation skipped: at ~100 points, validation and a
    forest's per-tree `set_params` cost more than growing the tree.
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    states = np.random.default_rng(seed).integers(0, 2**31 - 1, size=n_trees)
    with sklearn.config_context(skip_parameter_validation=True):
        if classify:
            return [ExtraTreeClassifier(max_features="sqrt", random_state=int(s)).fit(x32, y) for s in states]
        y64 = np.ascontiguousarray(y, dtype=np.float64)
        return [
            ExtraTreeRegressor(max_features=1.0, random_state=int(s)).fit(x32, y64, check_input=False) for s in states
        ]


def _grow_trees(member: Member, n_trees: int, seed: int, x: np.ndarray, y: np.ndarray) -> list:
    if member == "rf":
        return list(RandomForestRegressor(n_estimators=n_trees, random_state=seed, n_jobs=1).fit(x, y).estimators_)
    return grow_extra_trees(n_trees, seed, x, y)


def _length_scale_slice(kernel: Kernel) -> slice:
    """Where the length scales sit in the kernel's log-hyperparameter vector `theta`."""
    start = 0
    for h in kernel.hyperparameters:
        size = h.n_elements
        if h.name.endswith("length_scale"):
            return slice(start, start + size)
        start += size
    return slice(0, 0)


def _gp_optimizer(max_iter: Optional[int], length_scales: slice = slice(0, 0)):
    """L-BFGS-B on the GP's log marginal likelihood plus a log-normal prior on the length scales
    (`LENGTH_SCALE_PRIOR`), with an iteration cap for warm starts (a few points added to a fitted
    GP move its optimum little)."""
    centre, width = np.log(LENGTH_SCALE_PRIOR[0]), LENGTH_SCALE_PRIOR[1]

    def objective(obj_func):
        def penalised(theta):
            value, grad = obj_func(theta)
            z = (theta[length_scales] - centre) / width
            grad = np.array(grad, dtype=float)
            grad[length_scales] += z / width
            return value + 0.5 * float(z @ z), grad

        return penalised

    def optimize(obj_func, initial_theta, bounds):
        options = {"maxiter": max_iter} if max_iter else {}
        res = minimize(objective(obj_func), initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options=options)
        return res.x, res.fun

    return optimize


def per_tree_predictions(trees: Sequence, x: np.ndarray, column: Optional[int] = None) -> np.ndarray:
    """Predictions of each tree, shape (trees, n); `column` picks a class probability of classifiers.

    The input is validated once here rather than by each tree (`check_input=False`, which wants
    float32 in C order): validation, not the trees, is most of the cost of a 100-tree forecast.
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if column is None:
        return np.stack([t.predict(x32, check_input=False) for t in trees])
    return np.stack([t.predict_proba(x32, check_input=False)[:, column] for t in trees])


class TailCompressor:
    """Squeezes the slowest tail of log-times before the members see them, and maps forecasts back.

    Tuning spaces have a long tail of very slow configurations (one bad tile size can cost 10x). In
    log-time that tail still dominates the squared error both members minimise, so they spend their
    few points resolving how slow the hopeless configurations are instead of ordering the rest.
    Above the `QUANTILE` of the training times, differences are shrunk by `SLOPE`; the map is
    monotone, so it keeps every order, and forecasts are mapped back (the mean through the inverse), so
    that the ensemble still predicts log-time. The spread is not stretched by the inverse's slope above
    the knee: the side of a forecast that a search acts on (could this be faster than the best so
    far?) lies below the knee, where the map is the identity. Stretching it made every configuration
    predicted to be slow look four times as uncertain, and expected improvement then spent a third of
    a search's measurements on them (docs/benchmarks.md). The conformal residuals are computed after
    mapping back, so intervals stay calibrated in log-time.
    """

    QUANTILE = 0.9
    SLOPE = 0.25

    def __init__(self, y: np.ndarray) -> None:
        self.knee = float(np.quantile(y, self.QUANTILE))

    def __call__(self, y: np.ndarray) -> np.ndarray:
        return np.where(y > self.knee, self.knee + self.SLOPE * (y - self.knee), y)

    def inverse(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values and slopes (d y / d z) of the inverse map at `z`."""
        above = z > self.knee
        return np.where(above, self.knee + (z - self.knee) / self.SLOPE, z), np.where(above, 1.0 / self.SLOPE, 1.0)


class LogTimeEnsemble:
    """Fits members on (features, log-time) and predicts mean and spread."""

    def __init__(self, members: Sequence[Member] = DEFAULT_MEMBERS, seed: int = 0, n_trees: int = N_TREES) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        for m in members:
            if m not in ("et", "gbm", "gp", "rf"):
                raise ValueError(f"unknown ensemble member {m!r}")
        self.members = tuple(members)
        self.seed = seed
        self.n_trees = n_trees
        self._trees: dict[str, list] = {}  # forest member -> its fitted trees, oldest first
        self._gbm: Optional[GradientBoostingRegressor] = None
        self._gp: Optional[GaussianProcessRegressor] = None
        self._gp_scale: Optional[_Standardizer] = None
        self.gp_kernel: Optional[Kernel] = None
        self._refreshes = 0
        self._tail: Optional[TailCompressor] = None

    def fit(
        self, x: FeatureBlocks, y: np.ndarray, gp_kernel: Optional[Kernel] = None, gp_init: Optional[Kernel] = None
    ) -> LogTimeEnsemble:
        """Fit every member.

        `gp_kernel` keeps fitted GP hyperparameters (cheap refits for cross-validation); `gp_init`
        starts their optimisation from an earlier fit, which converges in far fewer steps than from
        the default when only a few points were added.
        """
        self._tail = TailCompressor(np.asarray(y, dtype=float))
        y = self._tail(np.asarray(y, dtype=float))
        for m in self.members:
            if m in ("et", "rf"):
                self._trees[m] = _grow_trees(m, self.n_trees, self.seed, x.full, y)
            elif m == "gbm":
                self._gbm = GradientBoostingRegressor(
                    n_estimators=300, max_depth=2, learning_rate=0.05, subsample=0.7, random_state=self.seed
                ).fit(x.full, y)
            elif m == "gp":
                self._fit_gp(x.compact, y, kernel=gp_kernel, init=gp_init)
        return self

    def refresh(self, x: FeatureBlocks, y: np.ndarray) -> LogTimeEnsemble:
        """Cheap update after new data: GP refitted with its hyperparameters kept, the oldest
        `REFRESH_SHARE` of each forest regrown on all data (gbm, if a member, is refitted); the tail
        compression keeps its knee, so old and new trees share one target scale."""
        assert self._tail is not None, "refresh needs a fitted ensemble"
        y = self._tail(np.asarray(y, dtype=float))
        self._refreshes += 1
        for m in self.members:
            if m in ("et", "rf"):
                trees = self._trees[m]
                k = max(1, int(round(REFRESH_SHARE * len(trees))))
                seed = self.seed + 7919 * self._refreshes  # fresh randomness for each refresh, reproducibly
                self._trees[m] = trees[k:] + _grow_trees(m, k, seed, x.full, y)
            elif m == "gbm":
                self._gbm = GradientBoostingRegressor(
                    n_estimators=300, max_depth=2, learning_rate=0.05, subsample=0.7, random_state=self.seed
                ).fit(x.full, y)
            elif m == "gp":
                self._fit_gp(x.compact, y, kernel=self.gp_kernel)
        return self

    def _fit_gp(self, xc: np.ndarray, y: np.ndarray, kernel: Optional[Kernel], init: Optional[Kernel] = None) -> None:
        self._gp_scale = _Standardizer(xc)
        d = max(xc.shape[1], 1)
        optimizer = None
        if kernel is None:
            warm = init is not None
            kernel = init if warm else ConstantKernel(1.0) * Matern(
                length_scale=np.full(d, LENGTH_SCALE_START), length_scale_bounds=(1e-2, 1e3), nu=2.5
            ) + WhiteKernel(1e-2, (1e-6, 1.0))
            optimizer = _gp_optimizer(WARM_GP_ITERATIONS if warm else None, _length_scale_slice(kernel))
        gp = GaussianProcessRegressor(kernel, normalize_y=True, optimizer=optimizer, random_state=self.seed)
        # One BLAS thread: a 100x100 Cholesky gains nothing from a second thread on a shared 2-core box.
        with warnings.catch_warnings(), _threads().limit(limits=1, user_api="blas"):
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(self._gp_scale(xc), y)
        self._gp = gp
        self.gp_kernel = gp.kernel_

    def predict(self, x: FeatureBlocks) -> EnsemblePrediction:
        means, variances = [], []
        for m in self.members:
            if m in ("et", "rf"):
                per_tree = per_tree_predictions(self._trees[m], x.full)
                means.append(per_tree.mean(axis=0))
                variances.append(per_tree.var(axis=0))
            elif m == "gbm":
                assert self._gbm is not None
                means.append(self._gbm.predict(x.full))
            elif m == "gp":
                assert self._gp is not None and self._gp_scale is not None
                with _threads().limit(limits=1, user_api="blas"):
                    mu, sd = self._gp.predict(self._gp_scale(x.compact), return_std=True)
                means.append(mu)
                variances.append(sd**2)
        stacked = np.stack(means)
        mean = stacked.mean(axis=0)
        within = np.mean(variances, axis=0) if variances else np.zeros_like(mean)
        between = stacked.var(axis=0)
        assert self._tail is not None
        mean, _ = self._tail.inverse(mean)
        return EnsemblePrediction(mean=mean, spread=np.sqrt(within + between))
