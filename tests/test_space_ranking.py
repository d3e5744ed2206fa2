"""How the recorded-space policy ranks the configurations it has screened: by what measuring each would tell about
the best time in the space (max-value entropy search), not by how much each is expected to beat the best so far."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kernelscout.agent.policies.space_search import max_value_entropy


def screen(mu: list[float], scale: list[float], p_fail: list[float]) -> SimpleNamespace:
    """A screen as `Forecaster.screen` gives it: log-time means and spreads, and the chance each fails."""
    return SimpleNamespace(mu=np.array(mu), scale=np.array(scale), p_fail=np.array(p_fail))


def test_an_uncertain_configuration_that_may_be_the_best_outranks_one_known_to_be_near_it() -> None:
    sure_near_best, unsure, unsure_slower, sure_slow = max_value_entropy(
        screen(mu=[0.0, 0.1, 0.5, 2.0], scale=[0.01, 0.3, 0.3, 0.01], p_fail=[0, 0, 0, 0]))
    assert unsure > sure_near_best > unsure_slower > sure_slow
    assert sure_slow == pytest.approx(0.0, abs=1e-9)  # nothing to learn: it is surely not the best


def test_what_a_configuration_would_tell_is_weighed_by_the_chance_that_it_runs() -> None:
    runs, may_fail, fails = max_value_entropy(screen(mu=[0.1, 0.1, 0.1], scale=[0.3, 0.3, 0.3], p_fail=[0.0, 0.5, 1.0]))
    assert may_fail == pytest.approx(runs / 2) and fails == 0.0


def test_the_ranking_does_not_depend_on_the_unit_of_time() -> None:
    """Log-times: a space timed in microseconds instead of milliseconds shifts every mean by the same amount."""
    mu, scale = [0.0, 0.1, 0.5, 2.0], [0.01, 0.3, 0.3, 0.01]
    in_ms = max_value_entropy(screen(mu, scale, [0, 0, 0, 0]))
    in_us = max_value_entropy(screen([m + np.log(1000) for m in mu], scale, [0, 0, 0, 0]))
    assert in_us == pytest.approx(in_ms, rel=1e-6, abs=1e-9)
