"""The learned surrogate: an ensemble over configuration features with conformal uncertainty.

Pipeline, refitted lazily after new measurements:

1. encode configurations (`features.ConfigEncoder`), plus one column per warm-start prior;
2. fit the ensemble (`ensemble.LogTimeEnsemble`) on log-time of the timed configurations;
3. refit it on K folds to get out-of-fold means and spreads, whose normalised residuals become the
   shape of every predictive distribution (a conformal predictive system: its quantiles hold on
   held-out data by construction, not by a Gaussian assumption);
4. fit an isotonic map on out-of-fold pairs so that P(child faster than a measured parent) is
   calibrated (`calibration`);
5. a small classifier for P(fail) when failures have been seen.

Online updates are cheap because steps 3-4 (and the GP's hyperparameter search) are redone only on a
geometric schedule, when the data have grown by `refit_growth` (25 %) since they were last done: at
8, 10, 13, 17, 22, ... timed points. In between, a new measurement only refreshes the ensemble
(`LogTimeEnsemble.refresh`) and keeps the residuals and calibration map of the last cross-fit.
Those come from models fitted on 80 % of fewer points, so they overstate the current error
slightly: the intervals stay conservative rather than becoming too narrow. Measured on a stream of
100 measurements (benchmarks/surrogate_update_speed.py, convolution_A100): a cross-fit takes about
0.15 s of CPU, a refresh about 50 ms (it regrows every tree), about 60 ms per measurement on average,
against about 3.5 s when everything was redone after every measurement.

With fewer than `min_points` timed configurations it forecasts nothing and says so (cold start).

`focus_after=N` (the search on a recorded space sets it; see `SEARCH_FOCUS_AFTER`): from N timed
configurations on, log-times slower than the measured `focus_quantile` (75th percentile) are fitted as
that percentile. A search that has found the good region then ranks within it more sharply; over
a whole space (eval-surrogate) it would blur the order of the slow configurations, so it is off by
default. docs/search_experiments.md has the paired runs behind the number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from kernelscout.tools.schema import Measurement, MeasureStatus
from kernelscout.tools.surrogates.base import Configs
from kernelscout.tools.surrogates.calibration import IsotonicCalibrator, fit_pair_calibrator
from kernelscout.tools.surrogates.distribution import LogTimeDistribution
from kernelscout.tools.surrogates.ensemble import DEFAULT_MEMBERS, LogTimeEnsemble, Member, grow_extra_trees, per_tree_predictions
from kernelscout.tools.surrogates.features import ConfigEncoder, FeatureBlocks
from kernelscout.tools.surrogates.warmstart import PriorSource

OOF_TREES = 50
SEARCH_FOCUS_AFTER = 50
_FAILED = {MeasureStatus.compile_error, MeasureStatus.runtime_error, MeasureStatus.crashed, MeasureStatus.timeout}


@dataclass(frozen=True)
class FitSummary:
    """What a fit did, for logs and tests."""

    n_timed: int
    fitted: bool
    crossfit: bool = False  # residuals, calibration and GP hyperparameters redone (not just a refresh)


class LearnedSurrogate:
    """Forecasts log-time of configurations of one tuning space from the measurements seen so far."""

    def __init__(
        self,
        tune_params: Mapping[str, Sequence[Any]],
        *,
        members: Sequence[Member] = DEFAULT_MEMBERS,
        rich_features: bool = True,
        priors: Sequence[PriorSource] = (),
        folds: int = 5,
        min_points: int = 8,
        refit_growth: float = 1.25,
        seed: int = 0,
        name: str = "learned",
        valid: Optional[Sequence[Sequence[Any]]] = None,
        focus_after: Optional[int] = None,
        focus_quantile: float = 75.0,
    ) -> None:
        self.name = name
        self.encoder = ConfigEncoder(tune_params, rich=rich_features, valid=valid)
        self.param_names = self.encoder.param_names
        for p in priors:
            if not p.covers(self.param_names):
                raise ValueError(f"prior {p.name!r} tunes other parameters than this space")
        self.priors = list(priors)
        self.members = tuple(members)
        self.folds = folds
        self.min_points = max(min_points, 3)
        self.seed = seed
        if refit_growth < 1.0:
            raise ValueError("refit_growth must be at least 1 (1 cross-fits after every measurement)")
        self.refit_growth = refit_growth
        if focus_after is not None and focus_after < 1:
            raise ValueError("focus_after must be at least 1 (or None: never focus)")
        if not 0.0 < focus_quantile <= 100.0:
            raise ValueError("focus_quantile is a percentile, in (0, 100]")
        self.focus_after = focus_after
        self.focus_quantile = focus_quantile
        self._crossfit_at = 0  # timed points at the last full pipeline (0: never)
        self._fail_fit_at = (-1, -1)  # (timed, failed) counts the failure model was fitted on
        self._rows: list[tuple[Any, ...]] = []
        self._logt: list[float] = []  # NaN for failures
        self._dirty = True
        self._model: Optional[LogTimeEnsemble] = None
        self._residuals = np.zeros(1)
        self._bandwidth = 1.0
        self._calibrator = IsotonicCalibrator()
        self._fail_model: Optional[list] = None  # extra-trees classifying failed (True) vs timed
        self.last_fit: Optional[FitSummary] = None

    # --- data -----------------------------------------------------------------------------

    def observe(self, config: Mapping[str, Any] | Sequence[Any], runtime_ms: Optional[float]) -> None:
        """Record one outcome; `runtime_ms=None` records a failed configuration."""
        row = tuple(config[n] for n in self.param_names) if isinstance(config, Mapping) else tuple(config)
        ok = runtime_ms is not None and np.isfinite(runtime_ms) and runtime_ms > 0
        self._rows.append(row)
        self._logt.append(float(np.log(runtime_ms)) if ok else np.nan)
        self._dirty = True

    def update(self, config: Mapping[str, Any], measurement: Measurement) -> None:
        """Learn from a measurement; outcomes that say nothing about this config's speed are ignored."""
        if measurement.status == MeasureStatus.ok and measurement.runtime_ms:
            self.observe(config, measurement.runtime_ms)
        elif measurement.status in _FAILED:
            self.observe(config, None)

    @property
    def n_timed(self) -> int:
        return int(np.isfinite(np.asarray(self._logt, dtype=float)).sum()) if self._logt else 0

    @property
    def n_failed(self) -> int:
        return len(self._logt) - self.n_timed

    def status(self) -> str:
        prior = f", warm start from {', '.join(p.name for p in self.priors)}" if self.priors else ""
        if self.n_timed < self.min_points:
            noun = "configuration" if self.n_timed == 1 else "configurations"
            return f"cold start: only {self.n_timed} timed {noun} (needs {self.min_points}){prior}"
        return f"{'+'.join(self.members)} on {self.n_timed} timed configurations{prior}"

    # --- model ----------------------------------------------------------------------------

    def _features(self, configs: Configs) -> FeatureBlocks:
        x = self.encoder.transform(configs)
        if not self.priors:
            return x
        extra = np.column_stack([p.feature(configs, self.param_names) for p in self.priors])
        return FeatureBlocks(full=np.hstack([x.full, extra]), compact=np.hstack([x.compact, extra]))

    def _crossfit_due(self, n_timed: int) -> bool:
        if self._model is None or self._crossfit_at == 0:
            return True
        return n_timed >= max(self._crossfit_at + 1, math.ceil(self._crossfit_at * self.refit_growth))

    def fit(self, full: Optional[bool] = None) -> FitSummary:
        """Refit now (otherwise done lazily on the next forecast after new data).

        `full=None` follows the schedule (see the module docstring); True forces the whole pipeline,
        False only refreshes the ensemble when a cross-fit exists.
        """
        logt = np.asarray(self._logt, dtype=float)
        ok = np.isfinite(logt)
        rows = np.asarray(self._rows, dtype=object).reshape(len(self._rows), len(self.param_names))
        self._dirty = False
        self.last_fit = self._fit(rows, logt, ok, full)
        return self.last_fit

    def _fit(self, rows: np.ndarray, logt: np.ndarray, ok: np.ndarray, full: Optional[bool]) -> FitSummary:
        n = int(ok.sum())
        self._fit_failures(rows, ok)
        if n < self.min_points:
            self._model = None
            self._crossfit_at = 0
            return FitSummary(n_timed=n, fitted=False)
        x = self._features(rows[ok])
        y = logt[ok]
        if self.focus_after is not None and n >= self.focus_after:
            # Late in a search the question is which of the good configurations is fastest; the slowest
            # measured quarter, told apart in full, draws the fit (and the GP's length scales) towards
            # differences that no longer matter. They are kept, as equally slow.
            y = np.minimum(y, np.percentile(y, self.focus_quantile))
            if self._crossfit_at < self.focus_after:  # the last cross-fit saw the unfocused target
                full = True  # residuals and calibration must describe the focused target, not the old one
        crossfit = self._crossfit_due(n) if full is None else (full or self._model is None)
        if not crossfit:
            assert self._model is not None
            self._model.refresh(x, y)
            return FitSummary(n_timed=n, fitted=True, crossfit=False)
        previous = self._model.gp_kernel if self._model is not None else None
        self._model = LogTimeEnsemble(self.members, seed=self.seed).fit(x, y, gp_init=previous)
        mu_oof, s_oof = self._out_of_fold(x, y)
        e = (y - mu_oof) / s_oof
        self._residuals = e
        sd = float(e.std()) or 1.0
        self._bandwidth = 1.06 * sd * e.size ** (-0.2)  # Silverman: smooth the residual sample
        rng = np.random.default_rng(self.seed)
        self._calibrator = fit_pair_calibrator(y, mu_oof, s_oof, e, self._bandwidth, rng)
        self._crossfit_at = n
        return FitSummary(n_timed=n, fitted=True, crossfit=True)

    def _out_of_fold(self, x: FeatureBlocks, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self._model is not None
        n = y.size
        k = min(self.folds, n)
        fold = np.random.default_rng(self.seed + 1).permutation(n) % k
        mu = np.empty(n)
        sd = np.empty(n)
        for f in range(k):
            tr, te = fold != f, fold == f
            # Half the trees: the fold models only supply residuals; a 50-tree forest's mean is a bit
            # noisier, which makes the residuals, hence the intervals, if anything slightly wider.
            sub = LogTimeEnsemble(self.members, seed=self.seed, n_trees=OOF_TREES).fit(
                FeatureBlocks(full=x.full[tr], compact=x.compact[tr]), y[tr], gp_kernel=self._model.gp_kernel
            )
            pred = sub.predict(FeatureBlocks(full=x.full[te], compact=x.compact[te]))
            mu[te], sd[te] = pred.mean, pred.spread
        floor = 1e-3 * max(float(y.std()), 1e-6)
        return mu, np.maximum(sd, floor)

    def _fit_failures(self, rows: np.ndarray, ok: np.ndarray) -> None:
        """A forest of where configurations fail; regrown when a failure is new or the data grew by
        `refit_growth`, since successes alone barely move it."""
        counts = (int(ok.sum()), int((~ok).sum()))
        if counts[1] < 2 or counts[0] < 2:
            self._fail_model, self._fail_fit_at = None, (-1, -1)
            return
        last_ok, last_failed = self._fail_fit_at
        if self._fail_model is not None and counts[1] == last_failed and counts[0] < last_ok * self.refit_growth:
            return
        x = self.encoder.transform(rows).full
        self._fail_model = grow_extra_trees(50, self.seed, x, ~ok, classify=True)
        self._fail_fit_at = counts

    def ensure_fitted(self) -> None:
        """Fit now if outcomes came in since the last fit, as the next forecast would. A resumed search calls it after
        each measurement it replays, so that the refits (and the schedule of cross-fits, whose Gaussian process starts
        from the last one's hyperparameters) are the ones the uninterrupted search made."""
        if self._dirty:
            self.fit()

    # --- forecasts ------------------------------------------------------------------------

    def predictive(self, configs: Configs) -> Optional[LogTimeDistribution]:
        self.ensure_fitted()
        if self._model is None:
            return None
        pred = self._model.predict(self._features(configs))
        return LogTimeDistribution(
            mu=pred.mean,
            scale=np.maximum(pred.spread, 1e-9),
            residuals=self._residuals,
            bandwidth=self._bandwidth,
            calibrator=self._calibrator if self._calibrator.fitted else None,
        )

    def p_fail(self, configs: Configs) -> np.ndarray:
        self.ensure_fitted()
        n_obs = len(self._logt)
        base = (self.n_failed + 0.5) / (n_obs + 1.0)  # Jeffreys-style rate before any model
        if self._fail_model is None:
            return np.full(len(configs), base)
        p = per_tree_predictions(self._fail_model, self.encoder.transform(configs).full, column=1).mean(axis=0)
        # Shrink towards the base rate: a forest on a handful of failures is overconfident.
        w = n_obs / (n_obs + 20.0)
        return w * p + (1 - w) * base
