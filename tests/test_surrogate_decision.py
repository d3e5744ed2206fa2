"""The gate measures promising or unsure candidates and skips only at a controlled miss rate."""

from __future__ import annotations

import numpy as np
import pytest

from kernelscout.tools.predict import Forecast, SurrogateCost
from kernelscout.tools.surrogates.decision import RiskControlledGate


def _forecast(p_beats: float | None, informative: bool = True) -> Forecast:
    return Forecast(
        surrogate="test",
        informative=informative,
        bin_edges=[1.0],
        bin_labels=["slower", "faster"],
        bin_probs=[0.5, 0.5],
        p_faster=0.5,
        p_beats_incumbent=p_beats,
        confidence=0.0,
        rationale="test forecast",
        cost=SurrogateCost(latency_ms=0.0),
    )


def test_cold_start_defers_and_says_so() -> None:
    gate = RiskControlledGate(target_risk=0.05)
    d = gate.decide(_forecast(0.001))
    assert d.action == "measure"
    assert d.reason.startswith("cold start: only 0 measured outcomes")
    assert gate.min_winners == 19


def test_uninformative_forecasts_and_missing_incumbent_are_measured() -> None:
    gate = RiskControlledGate()
    assert gate.decide(_forecast(0.0, informative=False)).action == "measure"
    assert gate.decide(_forecast(None)).reason == "no incumbent yet: nothing to beat"


def _stream(gate: RiskControlledGate, n: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """Calibrated forecasts: a candidate with P(beats)=p wins with probability p. Returns (winners, missed, skipped)."""
    winners = missed = skipped = 0
    for _ in range(n):
        p = float(rng.beta(0.4, 4.0))  # most candidates are unlikely to win, as in a search
        wins = rng.random() < p
        f = _forecast(p)
        d = gate.decide(f)
        winners += wins
        if d.action == "skip":
            skipped += 1
            missed += wins
        else:
            gate.observe(f, wins, d)
    return winners, missed, skipped


def test_miss_rate_among_would_be_winners_stays_under_target_while_skipping_many() -> None:
    winners = missed = skipped = 0
    for seed in range(10):
        gate = RiskControlledGate(target_risk=0.05, seed=seed)
        w, m, s = _stream(gate, 1500, np.random.default_rng(seed))
        winners, missed, skipped = winners + w, missed + m, skipped + s
    assert missed / winners <= 0.05
    assert skipped / 15000 > 0.2  # it does save measurements


def test_threshold_tightens_when_winners_had_low_forecasts() -> None:
    optimistic = RiskControlledGate(target_risk=0.1)
    pessimistic = RiskControlledGate(target_risk=0.1)
    for k in range(40):
        optimistic.observe(_forecast(0.3 + 0.01 * k), True)
        pessimistic.observe(_forecast(0.001 * (k + 1)), True)
    assert optimistic.threshold is not None and pessimistic.threshold is not None
    assert pessimistic.threshold < 0.01 < optimistic.threshold


def test_never_skips_a_promising_candidate() -> None:
    gate = RiskControlledGate(target_risk=0.05, max_threshold=0.5)
    for _ in range(100):
        gate.observe(_forecast(0.99), True)
    assert gate.threshold == 0.5
    d = gate.decide(_forecast(0.6))
    assert d.action == "measure" and d.reason.startswith("promising")


def test_would_be_skips_are_audited_at_the_audit_rate_with_inverse_weight() -> None:
    gate = RiskControlledGate(target_risk=0.05, audit_rate=0.25, seed=0)
    for _ in range(50):
        gate.observe(_forecast(0.9), True)
    decisions = [gate.decide(_forecast(0.01)) for _ in range(2000)]
    audits = [d for d in decisions if d.audit]
    assert 0.2 < len(audits) / len(decisions) < 0.3
    assert all(d.action == "measure" and d.weight == pytest.approx(4.0) for d in audits)
    assert all(d.action == "skip" for d in decisions if not d.audit)
    assert "at most 5% of would-be winners" in next(d for d in decisions if not d.audit).reason


def test_rejects_meaningless_targets() -> None:
    with pytest.raises(ValueError):
        RiskControlledGate(target_risk=0.0)


def test_outcomes_of_earlier_runs_end_the_cold_start() -> None:
    gate = RiskControlledGate(target_risk=0.05)
    gate.preload([0.2 + 0.01 * k for k in range(30)] + [0.01] * 100, [True] * 30 + [False] * 100)
    assert gate.n_winners == 30 and gate.n_outcomes == 130
    d = gate.decide(_forecast(0.05))
    assert d.action in {"skip", "measure"} and not d.reason.startswith("cold start")
    # (0 + 1) / 31 <= 5% < (1 + 1) / 31: skip below the lowest winner's score, never past it
    assert gate.threshold == pytest.approx(0.2)
