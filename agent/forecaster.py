"""The loop's view of `predict`: forecast a candidate, decide measure/skip, learn from measurements.

Adapts tools/predict.py (speedup forecasts from a surrogate's predictive log-time distribution) and
the risk-controlled gate to what agent/graph.py asks, and keeps the bookkeeping the gate needs:
which forecast led to which decision, against which incumbent.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from kernelscout.tools.archive import CandidateRecord
from kernelscout.tools.predict import CLEAR_WIN, Candidate, Forecast, Parent, PredictContext, make_surrogate, predict
from kernelscout.tools.schema import Measurement, MeasureStatus
from kernelscout.tools.surrogates.decision import Decision, RiskControlledGate
from kernelscout.tools.surrogates.features import as_hashable
from kernelscout.tools.surrogates.history import PRIOR_FEATURE


class Screen(NamedTuple):
    """What `Forecaster.screen` says about each configuration (arrays aligned with the input)."""

    mu: np.ndarray  # predicted log-time (ms), location of the predictive distribution
    scale: np.ndarray  # its scale
    expected_improvement: np.ndarray  # E[max(0, log best - log time)] * (1 - P(fail))
    p_fail: np.ndarray
    p_clear_win: Optional[np.ndarray] = None  # P(beats the best by CLEAR_WIN) * (1 - P(fail))


class _ResidualShape:
    """The standardised shape shared by every predictive distribution of one fit: the smoothed
    sample of normalised residuals. Its partial expectation E[max(0, z - E)] is tabulated once, so
    expected improvement costs one interpolation per configuration."""

    def __init__(self, residuals: np.ndarray, bandwidth: float, points: int = 1025):
        from kernelscout.tools.surrogates.distribution import kernel_cdf

        e = np.asarray(residuals, dtype=float).ravel()
        e = e[np.isfinite(e)] if e.size else np.zeros(1)
        e = e if e.size else np.zeros(1)
        h = bandwidth if bandwidth > 0 else 1.0
        self.lo, self.hi = float(e.min() - 12 * h), float(e.max() + 12 * h)
        self.grid = np.linspace(self.lo, self.hi, points)
        cdf = kernel_cdf((self.grid[:, None] - e[None, :]) / h).mean(axis=1)
        step = self.grid[1] - self.grid[0]
        self.table = np.concatenate([[0.0], np.cumsum(0.5 * (cdf[1:] + cdf[:-1]) * step)])
        self._cdf = cdf

    def cdf(self, z: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(z, dtype=float), self.grid, self._cdf, left=0.0, right=1.0)

    def partial_expectation(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=float)
        inside = np.interp(z, self.grid, self.table)
        return np.where(z > self.hi, self.table[-1] + (z - self.hi), np.where(z < self.lo, 0.0, inside))


def on_reference_scale(m: Measurement, reference_ms: Optional[float]) -> Measurement:
    """A timed measurement as the run's reference time over its speedup, the time it would have taken had the machine
    run at the pace the forecasts are made at.

    On a real machine the pace drifts (this 2-core VM timed the reference 6-64 % slower at its slowest than at its
    fastest within one 20-measurement search of an example, 24 searches on 2026-12-06), and each measurement times the
    reference beside the candidate, so its speedup carries the candidate's merit and its raw time the machine's mood
    as well.
    Forecasts are compared with the parent's time on that scale (the reference over the parent's speedup), so the fit
    learns on it too: replayed over 24 CPU searches of the examples (216 forecasts), P(faster) scored Brier 0.203 fit
    so, 0.232 on raw times (docs/benchmarks.md). Left as it is without a reference or a speedup (a failure)."""
    if reference_ms and m.status == MeasureStatus.ok and m.runtime_ms and m.speedup:
        return m.model_copy(update={"runtime_ms": reference_ms / m.speedup})
    return m


class OpenSpaceSurrogate:
    """A learned surrogate over candidates whose feature set is not known in advance (code rewrites).

    The surrogate for a fixed tuning space needs every parameter's values up front; code candidates
    bring new features as the policy invents them. So this refits over the union of what it has seen,
    with absent features as the category "-", each time it is asked (cheap at search scale).

    With a `prior` (tools/surrogates/history.py: earlier runs on this device), its forecast of each
    candidate's speedup is one more feature of the fit, and while this problem has too few
    measurements for a fit of its own, the prior alone forecasts, with the error it showed on problems
    it had not seen. That needs the reference time, so `reference_ms` comes with it.
    """

    def __init__(self, name: str, seed: int = 0, prior: Any = None, reference_ms: Optional[Callable[[], Optional[float]]] = None):
        self.name, self.seed = name, seed
        self.prior = prior if name != "none" else None
        self._reference_ms = reference_ms or (lambda: None)
        self._seen: list[tuple[dict, Measurement]] = []
        self._last = None
        self._from_prior = False  # whether the last forecast came from the prior alone
        self._cache = None  # (key, fitted model): one fit serves every forecast until something new is seen
        self._prior_memo: dict[str, float] = {}  # the prior's forecast per candidate (its features, as JSON)

    def _with_prior(self, rows: Sequence[Mapping[str, Any]]) -> list[dict]:
        if self.prior is None:
            return [dict(r) for r in rows]
        import json

        keys = [json.dumps(r, sort_keys=True, default=str) for r in rows]
        todo = [i for i, k in enumerate(keys) if k not in self._prior_memo]
        if todo:
            for i, v in zip(todo, self.prior.log_speedup([rows[i] for i in todo])):
                self._prior_memo[keys[i]] = float(v)
        return [{**r, PRIOR_FEATURE: self._prior_memo[k]} for r, k in zip(rows, keys)]

    def _fresh(self, configs: Sequence[Mapping[str, Any]]):
        seen = self._with_prior([c for c, _ in self._seen])
        configs = self._with_prior(configs)
        rows = seen + configs
        names = sorted({k for r in rows for k in r})
        numeric = {n: all(isinstance(r.get(n), (int, float)) and not isinstance(r.get(n), bool) for r in rows) for n in names}

        def encode(r: Mapping[str, Any]) -> dict:
            return {n: r[n] if numeric[n] else str(r.get(n, "-")) for n in names}

        space = {n: sorted({encode(r)[n] for r in rows}) for n in names}
        ref = self._reference_ms()
        key = (len(self._seen), ref, tuple((n, tuple(v)) for n, v in space.items()))
        if self._cache is None or self._cache[0] != key:
            model = make_surrogate(self.name, space, seed=self.seed)
            for cfg, (_, m) in zip(seen, self._seen):
                model.update(encode(cfg), on_reference_scale(m, ref))
            self._cache = (key, model)
        return self._cache[1], [encode(c) for c in configs]

    def predictive(self, configs):
        model, encoded = self._fresh(configs)
        self._last = model
        dist = model.predictive(encoded)
        self._from_prior = False
        if dist is None and self.prior is not None and len(configs):
            dist = self._prior_predictive(configs)
        return dist

    def _prior_predictive(self, configs):
        """log-time = log(reference) - forecast log-speedup, spread as the prior erred on unseen problems."""
        from kernelscout.tools.surrogates.distribution import LogTimeDistribution

        ref = self._reference_ms()
        if not ref or ref <= 0:
            return None
        seen = [(c, math.log(m.speedup) - math.log(max(float(c.get("parent_speedup", 1.0) or 1.0), 1e-9)))
                for c, m in self._seen if m.usable]
        # the prior's own forecasts were made (and memoised) for the fit's feature column; only the
        # correction for what this problem measured is new
        raw = np.asarray([r[PRIOR_FEATURE] for r in self._with_prior(configs)])
        mu = math.log(ref) - (raw + self.prior.offsets(configs, seen))
        self._from_prior = True
        return LogTimeDistribution(mu=mu, scale=np.full(mu.shape, self.prior.scale), residuals=self.prior.residuals,
                                   bandwidth=self.prior.bandwidth)

    def p_fail(self, configs):
        model, encoded = self._fresh(configs)
        return model.p_fail(encoded)

    def update(self, config: Mapping[str, Any], measurement: Measurement) -> None:
        self._seen.append((dict(config), measurement))

    def status(self) -> str:
        own = self._last.status() if self._last is not None else f"cold start: {len(self._seen)} measured candidates"
        if self.prior is None:
            return own
        if self._from_prior:
            return f"prior from earlier runs ({self.prior.describe()}); this problem: {own}"
        return f"{own}, with the prior from earlier runs as a feature"


class _FitMemo:
    """Predictions of the surrogate's current fit, by configuration.

    `Forecaster.screen` asks the surrogate about the whole space once per measurement; the full
    forecasts of the same iteration then read those predictions instead of asking every tree again
    (per-call overhead in the trees, not arithmetic, was most of a search's CPU time). A new
    measurement changes the fit, so `Forecaster.observe` clears the memo.
    """

    def __init__(self, surrogate: Any):
        self.surrogate = surrogate
        self.names: Optional[list[str]] = list(getattr(surrogate, "param_names", []) or []) or None
        self.clear()

    def clear(self) -> None:
        self.index: dict[tuple, int] = {}
        self.dist: Any = None
        self.p_fail: Optional[np.ndarray] = None

    def keys(self, configs: Any) -> Optional[list[tuple]]:
        if self.names is None:
            return None
        if isinstance(configs, np.ndarray):
            return [tuple(row) for row in configs]
        try:
            return [tuple(as_hashable(c[n]) for n in self.names) if isinstance(c, Mapping) else tuple(map(as_hashable, c))
                    for c in configs]
        except KeyError:
            return None

    def store(self, configs: Any, dist: Any, p_fail: np.ndarray, keys: Optional[list[tuple]] = None) -> None:
        keys = keys if keys is not None else self.keys(configs)
        if keys is None or dist is None or not hasattr(dist, "subset"):
            return
        self.index = {k: i for i, k in enumerate(keys)}
        self.dist, self.p_fail = dist, np.asarray(p_fail, dtype=float)

    def rows(self, configs: Any) -> Optional[np.ndarray]:
        if self.dist is None:
            return None
        keys = self.keys(configs)
        if keys is None or any(k not in self.index for k in keys):
            return None
        return np.asarray([self.index[k] for k in keys], dtype=int)


class _MemoSurrogate:
    """The surrogate as `predict` sees it during the loop: answers from the memo when it can."""

    def __init__(self, surrogate: Any, memo: _FitMemo):
        self._inner, self._memo = surrogate, memo

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def predictive(self, configs: Any) -> Any:
        rows = self._memo.rows(configs)
        return self._memo.dist.subset(rows) if rows is not None else self._inner.predictive(configs)

    def p_fail(self, configs: Any) -> np.ndarray:
        rows = self._memo.rows(configs)
        return self._memo.p_fail[rows] if rows is not None else self._inner.p_fail(configs)


class Forecaster:
    def __init__(self, surrogate: Any, reference_ms: Callable[[], Optional[float]], features: Callable[[CandidateRecord], dict],
                 measure_all: bool = False, target_risk: float = 0.05, seed: int = 0, sol_ms: Optional[float] = None,
                 code_context: Optional[Callable[[CandidateRecord], dict]] = None, gate: Optional[RiskControlledGate] = None,
                 screener: Optional["Forecaster"] = None, priors: Sequence[Any] = ()):
        """`screener`: a feature-based forecaster that ranks an enumerable space for a code-reading
        surrogate (the LLM), which cannot afford a chat call per configuration; it learns every
        measurement this forecaster learns. `priors`: the warm start's sources (`warmstart.PriorSource`), which the
        surrogate (or the screener) forecasts from; the space's policy starts its design at their fastest configurations."""
        self.surrogate = surrogate
        self.priors = list(priors)
        self.screener = screener
        self._reference_ms = reference_ms
        self._reference: Optional[tuple[Optional[float]]] = None  # cached until the next measurement
        self.features = features
        self.measure_all = measure_all
        self.gate = gate or RiskControlledGate(target_risk=target_risk, seed=seed)
        self.sol_ms = sol_ms
        self.code_context = code_context
        self._pending: dict[int, tuple[Forecast, Optional[Decision], float]] = {}  # forecast, decision, incumbent speedup
        self._raw: dict[int, Optional[float]] = {}
        self._best_log_ms: Optional[float] = None  # log of the best measured time, for `screen`
        self._memo = _FitMemo(surrogate)
        self.notes: list[str] = []  # what the user should know about this forecaster before the search starts

    def reference_ms(self) -> Optional[float]:
        """The reference time; it can only change with a new measurement, so it is read once per measurement."""
        if self._reference is None:
            self._reference = (self._reference_ms(),)
        return self._reference[0]

    def forecast(self, rec: CandidateRecord, parent_speedup: float, incumbent_speedup: float) -> Forecast:
        if self.code_context is not None:
            return self._forecast_code(rec, parent_speedup, incumbent_speedup)
        ref = self.reference_ms()
        if ref is None:
            parent = Parent(config=self.features(rec), runtime_ms=1.0)
            context = PredictContext()
        else:
            parent = Parent(config=self.features(rec), runtime_ms=ref / max(parent_speedup, 1e-9))
            context = PredictContext(incumbent_runtime_ms=ref / max(incumbent_speedup, 1e-9), sol_runtime_ms=self.sol_ms)
        forecast = predict(Candidate(config=self.features(rec), source_path=rec.path), parent, context, self.surrogate)
        if ref is None and forecast.informative:
            forecast = forecast.model_copy(update={"informative": False, "rationale": "no reference time measured yet"})
        self._pending[rec.id] = (forecast, None, incumbent_speedup)
        return forecast

    def forecast_batch(self, recs: Sequence[CandidateRecord], parent_speedups: Sequence[float], incumbent_speedup: float) -> list[Forecast]:
        """Forecast many candidates, each against its own parent, in one pass over the surrogate's predictions."""
        if self.code_context is not None or self.reference_ms() is None:
            return [self.forecast(r, p, incumbent_speedup) for r, p in zip(recs, parent_speedups)]
        from kernelscout.tools.predict import predict_many

        ref = self.reference_ms()
        context = PredictContext(incumbent_runtime_ms=ref / max(incumbent_speedup, 1e-9), sol_runtime_ms=self.sol_ms)
        parents = [Parent(config=self.features(r), runtime_ms=ref / max(p, 1e-9)) for r, p in zip(recs, parent_speedups)]
        cands = [Candidate(config=self.features(r), source_path=r.path) for r in recs]
        out = predict_many(cands, parents, context, _MemoSurrogate(self.surrogate, self._memo))
        for rec, f in zip(recs, out):
            self._pending[rec.id] = (f, None, incumbent_speedup)
        return out

    def _forecast_code(self, rec: CandidateRecord, parent_speedup: float, incumbent_speedup: float) -> Forecast:
        """A code-reading surrogate (the LLM) forecasts from sources rather than from features."""
        from kernelscout.tools.surrogates.llm import read_source

        ctx = self.code_context(rec)
        ref = self.reference_ms()
        forecast = self.surrogate.forecast(
            child_source=ctx.get("child_source") or read_source(rec.path), parent_source=ctx["parent_source"],
            parent_ms=ref / max(parent_speedup, 1e-9) if ref else None, parent_speedup=parent_speedup,
            incumbent_ratio=incumbent_speedup / max(parent_speedup, 1e-9), device=ctx["device"], sol=ctx["sol"],
            related=ctx.get("related", ()),
        )
        self._raw[rec.id] = getattr(self.surrogate, "last_raw_p_faster", None)
        self._pending[rec.id] = (forecast, None, incumbent_speedup)
        return forecast

    def decide(self, forecast: Forecast) -> Decision:
        if self.measure_all:
            decision = Decision(action="measure", reason="--surrogate none: every proposal is measured")
        else:
            decision = self.gate.decide(forecast)
        for cid, (f, _, inc) in self._pending.items():
            if f is forecast:
                self._pending[cid] = (f, decision, inc)
        return decision

    @staticmethod
    def priority(forecast: Forecast) -> float:
        """Rank measure-worthy candidates: chance of a clear new best (`CLEAR_WIN` in tools/predict.py), then
        expected speedup; uninformative last. A surrogate that gives no P(clear win), such as the LLM's, is
        ranked by its P(beats the best), and without a best by P(faster)."""
        if not forecast.informative:
            return -1.0
        p = next((q for q in (forecast.p_clear_win, forecast.p_beats_incumbent) if q is not None), forecast.p_faster)
        return p * (1.0 - (forecast.p_fail or 0.0)) + 1e-3 * math.log(max(forecast.expected_speedup or 1.0, 1e-9))

    def screen(self, configs: Any, keys: Optional[list[tuple]] = None) -> Optional["Screen"]:
        """Forecast many configurations at once, for a policy to rank: predictive mean and spread, expected
        improvement over the best measured time, P(fail) and P(clear win).

        A policy that can enumerate its space asks this before proposing, so that the surrogate, not
        chance, decides which few candidates get a full forecast (`predict`). Only the predictive
        distribution's location, scale and shared residual shape are used: reading quantiles or bins
        for tens of thousands of configurations would cost more than the refit. None when there is
        nothing to rank by (no surrogate, cold start, nothing timed yet). `keys` (the configurations'
        values in parameter order) spares the memo from building them again.
        """
        if self.screener is not None:
            return self.screener.screen(configs, keys)
        if self.measure_all or self.code_context is not None or self._best_log_ms is None:
            return None
        if not hasattr(self.surrogate, "predictive"):
            return None
        dist = self.surrogate.predictive(configs)
        if dist is None:
            return None
        mu = np.asarray(dist.mu, dtype=float)
        scale = np.maximum(np.asarray(dist.scale, dtype=float), 1e-12)
        shape = _ResidualShape(getattr(dist, "residuals", np.zeros(1)), float(getattr(dist, "bandwidth", 1.0)))
        ei = scale * shape.partial_expectation((self._best_log_ms - mu) / scale)
        p_fail = np.clip(np.asarray(self.surrogate.p_fail(configs), dtype=float), 0.0, 1.0)
        self._memo.store(configs, dist, p_fail, keys)
        p_clear = shape.cdf((self._best_log_ms + math.log(1.0 - CLEAR_WIN) - mu) / scale) * (1.0 - p_fail)
        return Screen(mu=mu, scale=scale, expected_improvement=ei * (1.0 - p_fail), p_fail=p_fail, p_clear_win=p_clear)

    def catch_up(self) -> None:
        """Fit the surrogate on what it has observed, as the uninterrupted search did before its next forecast (a
        surrogate without `ensure_fitted` fits however it fits)."""
        if self.screener is not None:
            self.screener.catch_up()
        fit = getattr(self.surrogate, "ensure_fitted", None)
        if fit is not None:
            fit()

    def observe(self, rec: CandidateRecord, m: Measurement, parent_speedup: float) -> None:
        if self.screener is not None:
            self.screener.observe(rec, m, parent_speedup)
        self._memo.clear()  # the fit is about to change
        self._reference = None
        if m.status == MeasureStatus.ok and m.runtime_ms and m.timing_valid and m.runtime_ms > 0:
            log_ms = math.log(m.runtime_ms)
            self._best_log_ms = log_ms if self._best_log_ms is None else min(self._best_log_ms, log_ms)
        if self.code_context is not None:
            ratio = m.speedup / parent_speedup if (m.speedup and m.correct and m.timing_valid) else None
            self.surrogate.observe(self._raw.pop(rec.id, None), ratio, label=f"#{rec.id} {rec.origin}: {rec.hypothesis[:80]}")
        else:
            self.surrogate.update(self.features(rec), m)
        entry = self._pending.pop(rec.id, None)
        if entry and entry[1] is not None and m.status == MeasureStatus.ok and m.speedup and m.timing_valid:
            self.gate.observe(entry[0], beat_incumbent=m.speedup > entry[2], decision=entry[1])


def make_forecaster(name: str, tune_params: Optional[Mapping[str, Sequence[Any]]], reference_ms, features,
                    priors: Sequence[Any] = (), seed: int = 0, sol_ms: Optional[float] = None,
                    valid: Optional[Sequence[Sequence[Any]]] = None, history_prior: Any = None) -> Forecaster:
    """`priors`: recorded spaces of the same kernel (a tuning space); `history_prior`: earlier runs'
    outcomes on this device (a code problem; tools/surrogates/history.py)."""
    if tune_params is not None:
        surrogate = make_surrogate("none" if name == "none" else name, tune_params, priors=priors, seed=seed, valid=valid,
                                   for_search=True)
    else:
        surrogate = OpenSpaceSurrogate("none" if name == "none" else name, seed=seed, prior=history_prior, reference_ms=reference_ms)
    return Forecaster(surrogate, reference_ms, features, measure_all=(name == "none"), seed=seed, sol_ms=sol_ms, priors=priors)
