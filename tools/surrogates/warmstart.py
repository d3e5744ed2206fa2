"""Warm starts from the same kernel measured elsewhere (another GPU, or an earlier run).

Performance landscapes of one kernel on two GPUs differ in scale and in details, but share most of
their structure (which tile sizes and flags matter). The measured log-time on another device is
therefore the single most informative feature a target-device model can get, and with only a few
target measurements the ensemble learns how the two devices differ instead of learning the space
from scratch.

A `PriorSource` answers "what did this configuration take over there?" by lookup; configurations the
source never timed (it failed there, or an earlier run did not reach it) are filled in by a small model
of the source, so that the feature is defined everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
from sklearn.ensemble import ExtraTreesRegressor

from kernelscout.tools.surrogates.features import ConfigEncoder

_FALLBACK_MAX_POINTS = 3000


def _key(values: Sequence[Any]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


class PriorSource:
    """Log-times of one kernel's configurations as measured on another device or run."""

    def __init__(
        self,
        name: str,
        tune_params: Mapping[str, Sequence[Any]],
        configs: Sequence[Sequence[Any]],
        runtimes_ms: Sequence[float],
        seed: int = 0,
    ) -> None:
        """`configs` hold values in `tune_params` order; failed configurations are simply left out."""
        times = np.asarray(runtimes_ms, dtype=float)
        ok = np.isfinite(times) & (times > 0)
        if ok.sum() < 2:
            raise ValueError(f"prior {name!r} has fewer than two timed configurations")
        self.name = name
        self.param_names = tuple(tune_params)
        self._tune_params = dict(tune_params)
        logt = np.log(times[ok])
        self._center = float(np.median(logt))
        self._spread = float(logt.std()) or 1.0
        kept = [c for c, k in zip(configs, ok) if k]
        self._table = {_key(c): (lt - self._center) / self._spread for c, lt in zip(kept, logt)}
        self._configs = kept
        self._logt = logt
        self._seed = seed
        self._fallback: Optional[tuple[ConfigEncoder, ExtraTreesRegressor]] = None

    @classmethod
    def from_space(cls, space: Any, seed: int = 0) -> PriorSource:
        """Build from a `ReplaySpace` (duck-typed to keep tools independent of the sandbox).

        Named by the file the user passed to `--warm-start`, with the device where the cache records one: some
        caches leave the device empty, and a list of priors named half by device and half by file read as two
        kinds of thing."""
        device = space.device_name.strip()
        return cls(
            name=f"{space.name} ({device})" if device and device != space.name else space.name,
            tune_params=space.param_values,
            configs=space.configs,
            runtimes_ms=space.median_times,
            seed=seed,
        )

    def measured_ratio(self, parent: Mapping[str, Any], child: Mapping[str, Any]) -> Optional[float]:
        """parent time / child time as measured on this source, or None unless both were timed there.

        Only recorded times, never the imputed ones: an LLM shown this ratio reads it as a measurement."""
        try:
            zp, zc = (self._table.get(_key([c[n] for n in self.param_names])) for c in (parent, child))
        except KeyError:
            return None
        if zp is None or zc is None:
            return None
        return float(np.exp((zp - zc) * self._spread))

    def covers(self, param_names: Sequence[str]) -> bool:
        return set(param_names) == set(self.param_names)

    def feature(self, configs: Sequence[Mapping[str, Any]] | np.ndarray, param_names: Sequence[str]) -> np.ndarray:
        """Standardised source log-time per configuration (0 = the source's median)."""
        if isinstance(configs, np.ndarray):
            order = [list(param_names).index(n) for n in self.param_names]
            rows = [tuple(r[order]) for r in configs]
        else:
            rows = [tuple(c[n] for n in self.param_names) for c in configs]
        out = np.empty(len(rows))
        missing = []
        for i, r in enumerate(rows):
            v = self._table.get(_key(r))
            if v is None:
                missing.append(i)
            else:
                out[i] = v
        if missing:
            out[missing] = self._impute([rows[i] for i in missing])
        return out

    def _impute(self, rows: Sequence[Sequence[Any]]) -> np.ndarray:
        if self._fallback is None:
            enc = ConfigEncoder(self._tune_params)
            rng = np.random.default_rng(self._seed)
            take = rng.permutation(len(self._configs))[:_FALLBACK_MAX_POINTS]
            x = enc.transform(np.asarray([self._configs[i] for i in take], dtype=object)).full
            y = (self._logt[take] - self._center) / self._spread
            model = ExtraTreesRegressor(n_estimators=50, max_features=0.5, random_state=self._seed, n_jobs=1)
            self._fallback = (enc, model.fit(x, y))
        enc, model = self._fallback
        return model.predict(enc.transform(np.asarray(rows, dtype=object)).full)
