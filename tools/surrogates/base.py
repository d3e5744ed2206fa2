"""What every surrogate offers `predict`, so that the search loop can swap them freely.

A surrogate turns candidate configurations into predictive distributions of log-time (or says it has
none yet), estimates the chance a candidate fails, and learns from every measurement. Forecasts relative
to a parent are derived from the distribution in `tools/predict.py`, once for all surrogates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np

from kernelscout.tools.schema import Measurement
from kernelscout.tools.surrogates.distribution import LogTimeDistribution

Configs = Sequence[Mapping[str, Any]] | np.ndarray
"""Configurations as dicts, or as a matrix of values in the space's parameter order."""


@runtime_checkable
class Surrogate(Protocol):
    name: str

    def predictive(self, configs: Configs) -> Optional[LogTimeDistribution]:
        """Distribution of each configuration's log-time (ms); None when it cannot forecast yet."""

    def p_fail(self, configs: Configs) -> np.ndarray:
        """Chance that each configuration fails to compile or run."""

    def update(self, config: Mapping[str, Any], measurement: Measurement) -> None:
        """Learn from one measurement (failures included)."""

    def status(self) -> str:
        """One line on what the surrogate knows, for rationales (e.g. 'cold start: 3 measured')."""


class NoneSurrogate:
    """The baseline that forecasts nothing, so every candidate is measured."""

    name = "none"

    def predictive(self, configs: Configs) -> Optional[LogTimeDistribution]:
        return None

    def p_fail(self, configs: Configs) -> np.ndarray:
        return np.zeros(len(configs))

    def update(self, config: Mapping[str, Any], measurement: Measurement) -> None:
        return None

    def status(self) -> str:
        return "no surrogate: every candidate is measured"
