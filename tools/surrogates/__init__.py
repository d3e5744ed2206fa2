"""Surrogates that forecast a candidate's speedup before it is measured.

`learned` (ensemble + conformal calibration, the offline default), `plain-rf` (the reference random
forest), `none` (always measure). Forecasts are read off their predictive distributions by
`kernelscout.tools.predict`; `decision.RiskControlledGate` turns forecasts into measure or skip
(import it from its module: it depends on `predict`, which depends on this package).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Exported names and the module each lives in. They are imported on first use (PEP 562), because
# scikit-learn and scipy.stats take about a second to import, and commands that only read a run
# (`kscout show`, `kscout budget`, `kscout --help`) reach this package through its numpy-only
# `metrics` module without ever fitting a model.
_EXPORTS = {
    "DEFAULT_EDGES": "distribution",
    "LearnedSurrogate": "learned",
    "LogTimeDistribution": "distribution",
    "NoneSurrogate": "base",
    "PriorSource": "warmstart",
    "Surrogate": "base",
    "make_surrogate": "registry",
    "register_surrogate": "registry",
    "surrogate_names": "registry",
}

if TYPE_CHECKING:
    from kernelscout.tools.surrogates.base import NoneSurrogate, Surrogate
    from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, LogTimeDistribution
    from kernelscout.tools.surrogates.learned import LearnedSurrogate
    from kernelscout.tools.surrogates.registry import make_surrogate, register_surrogate, surrogate_names
    from kernelscout.tools.surrogates.warmstart import PriorSource


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_EDGES",
    "LearnedSurrogate",
    "LogTimeDistribution",
    "NoneSurrogate",
    "PriorSource",
    "Surrogate",
    "make_surrogate",
    "register_surrogate",
    "surrogate_names",
]


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
