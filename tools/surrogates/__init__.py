"""Surrogates that forecast a candidate's speedup before it is measured.

`learned` (ensemble + conformal calibration, the offline default), `plain-rf` (the reference random
forest), `none` (always measure). Forecasts are read off their predictive distributions by
`kernelscout.tools.predict`; `decision.RiskControlledGate` turns forecasts into measure or skip
(import it from its module: it depends on `predict`, which depends on this package).
"""

from kernelscout.tools.surrogates.base import NoneSurrogate, Surrogate
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, LogTimeDistribution
from kernelscout.tools.surrogates.learned import LearnedSurrogate
from kernelscout.tools.surrogates.registry import make_surrogate, register_surrogate, surrogate_names
from kernelscout.tools.surrogates.warmstart import PriorSource

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
