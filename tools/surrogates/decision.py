"""Turn forecasts into measure-or-skip, skipping only at a stated, data-controlled risk.

The risk that matters to a search is losing the winner: skipping a candidate that would have become
the new best. The gate controls the miss rate among such would-be winners,

    P(P_beats(candidate) < threshold | candidate would beat the incumbent) <= target,

with a conformal bound over the would-be winners observed so far: with scores s_1..s_n of the n
measured winners, skipping below threshold t is allowed when (#{s_i < t} + 1) / (n + 1) <= target.
Its guarantee is the usual conformal one (exchangeable forecasts; the surrogate changes as it learns,
so it holds approximately). It needs n >= 1/target - 1 winners before it may skip anything (19 for
5%); until then it defers and says so.

Skipped candidates never reveal whether they would have won, which would bias the winners towards
high scores. So a small random share of would-be skips is measured anyway (audits), and each audited
outcome counts with weight 1/audit_rate (inverse-probability weighting; weighted conformal quantile).
The threshold is also capped: a candidate with P(beats) at or above `max_threshold` is never skipped,
which is what "skip only when confidently worse" means here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.tools.predict import Forecast


class Decision(BaseModel):
    action: Literal["measure", "skip"]
    reason: str
    threshold: Optional[float] = Field(None, description="skip when P(beats incumbent) is below this")
    p_beats_incumbent: Optional[float] = None
    audit: bool = Field(False, description="measured only to keep the risk estimate unbiased")
    weight: float = Field(1.0, description="1 / P(measured) under the rule when decided; for observe()")


class RiskControlledGate:
    """Decides whether to measure each forecast candidate, at a miss-rate target among would-be winners."""

    def __init__(
        self,
        target_risk: float = 0.05,
        audit_rate: float = 0.1,
        max_threshold: float = 0.5,
        seed: int = 0,
    ) -> None:
        if not 0 < target_risk < 1:
            raise ValueError("target_risk must be in (0, 1)")
        if not 0 < audit_rate <= 1:
            raise ValueError("audit_rate must be in (0, 1]")
        self.target_risk = target_risk
        self.audit_rate = audit_rate
        self.max_threshold = max_threshold
        self.min_winners = math.ceil(1 / target_risk - 1 - 1e-9)
        self._rng = np.random.default_rng(seed)
        self._scores: list[float] = []  # P(beats) of measured would-be winners
        self._weights: list[float] = []
        self.n_outcomes = 0

    @property
    def n_winners(self) -> int:
        return len(self._scores)

    @property
    def threshold(self) -> Optional[float]:
        """Current skip threshold; None while too few winners have been seen to bound the risk."""
        if self.n_winners < self.min_winners:
            return None
        order = np.argsort(self._scores)
        s = np.asarray(self._scores)[order]
        w = np.asarray(self._weights)[order]
        total = w.sum()
        # Largest k such that skipping the k lowest-scored winners keeps the conformal bound.
        bound = (np.concatenate([[0.0], np.cumsum(w)]) + 1.0) / (total + 1.0)
        k = int(np.flatnonzero(bound <= self.target_risk).max()) if (bound <= self.target_risk).any() else -1
        if k < 0:
            return 0.0
        # Skip strictly below the (k+1)-th smallest winner score.
        return float(min(s[k], self.max_threshold))

    def decide(self, forecast: Forecast) -> Decision:
        p = forecast.p_beats_incumbent
        if not forecast.informative:
            return Decision(action="measure", reason=f"no usable forecast ({forecast.rationale})")
        if p is None:
            return Decision(action="measure", reason="no incumbent yet: nothing to beat")
        thr = self.threshold
        if thr is None:
            return Decision(
                action="measure",
                p_beats_incumbent=p,
                reason=f"cold start: only {self.n_winners} measured outcomes that beat the incumbent "
                f"(needs {self.min_winners} to bound a {self.target_risk:.0%} miss rate)",
            )
        if p >= thr:
            why = "promising" if p >= 0.5 else "not confidently worse"
            return Decision(
                action="measure",
                threshold=thr,
                p_beats_incumbent=p,
                reason=f"{why}: P(beats best)={p:.3f} >= threshold {thr:.3f}",
            )
        if self._rng.random() < self.audit_rate:
            return Decision(
                action="measure",
                threshold=thr,
                p_beats_incumbent=p,
                audit=True,
                weight=1.0 / self.audit_rate,
                reason=f"audit: P(beats best)={p:.3f} < {thr:.3f} would skip; measured at random "
                f"({self.audit_rate:.0%}) to keep the miss-rate estimate honest",
            )
        return Decision(
            action="skip",
            threshold=thr,
            p_beats_incumbent=p,
            weight=1.0 / self.audit_rate,
            reason=f"confidently worse: P(beats best)={p:.3f} < threshold {thr:.3f}, set so that at most "
            f"{self.target_risk:.0%} of would-be winners are skipped ({self.n_winners} winners seen)",
        )

    def preload(self, p_beats: Sequence[float], beat_incumbent: Sequence[bool]) -> None:
        """Start from outcomes of earlier runs (same surrogate, measured without a gate), so that a new
        search need not spend its first winners on calibration."""
        for p, won in zip(p_beats, beat_incumbent):
            self.n_outcomes += 1
            if won:
                self._scores.append(float(p))
                self._weights.append(1.0)

    def observe(self, forecast: Forecast, beat_incumbent: bool, decision: Optional[Decision] = None) -> None:
        """Record a measured outcome: did the candidate beat the incumbent it was forecast against?"""
        if not forecast.informative or forecast.p_beats_incumbent is None:
            return
        self.n_outcomes += 1
        if beat_incumbent:
            self._scores.append(forecast.p_beats_incumbent)
            self._weights.append(decision.weight if decision is not None else 1.0)
