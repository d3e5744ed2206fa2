"""`predict` forecasts a candidate's speedup over its measured parent, as a search would ask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace
from kernelscout.tools.predict import (
    Candidate,
    Forecast,
    NoneSurrogate,
    Parent,
    PredictContext,
    make_surrogate,
    predict,
    predict_many,
)
from kernelscout.tools.surrogates.learned import LearnedSurrogate
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> ReplaySpace:
    return ReplaySpace.load(write_synthetic_cache(tmp_path_factory.mktemp("predict") / "synthetic_A.json"))


@pytest.fixture(scope="module")
def trained(space: ReplaySpace) -> LearnedSurrogate:
    """A learned surrogate after 60 random measurements on the replay device."""
    rng = np.random.default_rng(0)
    device = ReplayDevice(space)
    surrogate = make_surrogate("learned", space.param_values, seed=0)
    for idx in rng.permutation(len(space))[:60]:
        config = space.config(int(idx))
        surrogate.update(config, device.measure(config, rng))
    return surrogate


def _extremes(space: ReplaySpace) -> tuple[Candidate, Parent, Parent]:
    ok = np.flatnonzero(space.ok_mask)
    best = space.best_index
    worst = int(ok[np.nanargmax(space.median_times[ok])])
    child = Candidate(config=space.config(best), name="best")
    slow_parent = Parent(config=space.config(worst), runtime_ms=float(space.median_times[worst]))
    fast_parent = Parent(config=space.config(best), runtime_ms=float(space.median_times[best]) * 0.5)
    return child, slow_parent, fast_parent


def test_forecast_is_a_distribution_over_ordinal_speedup_bins(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    child, parent, _ = _extremes(space)
    f = predict(child, parent, PredictContext(), trained)
    assert isinstance(f, Forecast) and f.informative
    assert len(f.bin_probs) == len(f.bin_labels) == len(f.bin_edges) + 1 == 8
    assert sum(f.bin_probs) == pytest.approx(1.0)
    assert f.surrogate == "learned"
    assert f.cost.latency_ms > 0 and f.cost.tokens_in == 0
    assert f"parent {parent.runtime_ms:.4g} ms" in f.rationale
    assert 0.0 <= f.p_fail <= 1.0
    lo, hi = f.speedup_interval_80
    assert lo < hi


def test_clearly_faster_child_is_forecast_faster_and_the_reverse_slower(
    space: ReplaySpace, trained: LearnedSurrogate
) -> None:
    child, slow_parent, fast_parent = _extremes(space)
    up = predict(child, slow_parent, PredictContext(), trained)
    down = predict(child, fast_parent, PredictContext(), trained)
    assert up.p_faster > 0.9 and up.expected_speedup > 1.5
    assert sum(up.bin_probs[4:]) > 0.9  # speedup >= 1.05
    assert down.p_faster < 0.1 and down.expected_speedup < 1.0
    assert up.confidence > 0.8 and down.confidence > 0.8


def test_beating_the_incumbent_is_never_likelier_than_beating_a_slower_parent(
    space: ReplaySpace, trained: LearnedSurrogate
) -> None:
    _, parent, _ = _extremes(space)
    mid = int(np.flatnonzero(space.ok_mask)[len(space) // 2])
    child = Candidate(config=space.config(mid))
    f = predict(child, parent, PredictContext(incumbent_runtime_ms=space.best_time * 1.05), trained)
    assert f.p_beats_incumbent is not None
    assert f.p_beats_incumbent <= f.p_faster
    assert "P(beats best" in f.rationale


def test_a_clear_win_is_a_win_by_more_than_two_percent(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    # the incumbent's own configuration against the incumbent's forecast time: it may well win by a hair,
    # and is much less likely to win by more than a measurement's noise
    _, parent, _ = _extremes(space)
    twin = Candidate(config=space.config(space.best_index))
    best_ms = predict(twin, parent, PredictContext(), trained).predicted_runtime_ms
    f = predict(twin, parent, PredictContext(incumbent_runtime_ms=best_ms), trained)
    assert f.p_clear_win < f.p_beats_incumbent - 0.05
    assert "by 2% or more" in f.rationale
    # by definition: P(clear win) is P(beats) against a best 2 % faster
    g = predict(twin, parent, PredictContext(incumbent_runtime_ms=best_ms * 0.98), trained)
    assert f.p_clear_win == pytest.approx(g.p_beats_incumbent)


def test_the_search_measures_the_likelier_clear_win_first() -> None:
    from kernelscout.agent.forecaster import Forecaster

    def forecast(p_beats: float, p_clear: float | None) -> Forecast:
        return Forecast(surrogate="learned", informative=True, bin_edges=[1.0], bin_labels=["slower", "faster"],
                        bin_probs=[0.5, 0.5], p_faster=0.5, p_beats_incumbent=p_beats, p_clear_win=p_clear,
                        confidence=0.0, rationale="", cost={"latency_ms": 0.0})

    twin, far = forecast(p_beats=0.5, p_clear=0.1), forecast(p_beats=0.35, p_clear=0.3)
    assert Forecaster.priority(far) > Forecaster.priority(twin)
    # a surrogate that gives no P(clear win) (the LLM's) is ranked by P(beats the best)
    assert Forecaster.priority(forecast(0.5, None)) > Forecaster.priority(forecast(0.35, None))


def test_speed_of_light_caps_the_speedup(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    child, parent, _ = _extremes(space)
    sol = parent.runtime_ms / 1.2  # nothing can be more than 1.2x faster than the parent
    f = predict(child, parent, PredictContext(sol_runtime_ms=sol), trained)
    assert sum(f.bin_probs[5:]) == pytest.approx(0.0, abs=1e-9)  # bins from 1.25x up
    assert f.expected_speedup <= 1.2 + 1e-6


def test_a_bound_the_best_measured_time_beat_is_no_floor_for_the_forecast(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    # a CPU "speed of light" from measured peaks, which the search's best kernel has already run under: a floor there
    # forecast P(faster) 0 for every child of that best, where most of them then measured faster
    child, _, _ = _extremes(space)
    fast_parent = Parent(config=child.config, runtime_ms=float(space.median_times[space.best_index]))  # the best itself
    sol = fast_parent.runtime_ms * 1.25
    floored = predict(child, fast_parent, PredictContext(sol_runtime_ms=sol), trained)
    beaten = predict(child, fast_parent, PredictContext(sol_runtime_ms=sol, incumbent_runtime_ms=fast_parent.runtime_ms), trained)
    unbounded = predict(child, fast_parent, PredictContext(incumbent_runtime_ms=fast_parent.runtime_ms), trained)
    assert floored.p_faster == 0.0  # nothing beats the bound, so nothing beats a parent under it
    assert beaten.p_faster == pytest.approx(unbounded.p_faster) and beaten.p_faster > 0.05


def test_predict_many_matches_one_at_a_time(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    _, parent, _ = _extremes(space)
    children = [Candidate(config=space.config(i)) for i in (3, 40, 90)]
    batch = predict_many(children, parent, PredictContext(), trained)
    single = [predict(c, parent, PredictContext(), trained) for c in children]
    assert [f.p_faster for f in batch] == pytest.approx([f.p_faster for f in single])
    assert [f.bin_probs for f in batch] == [pytest.approx(f.bin_probs) for f in single]


def test_cold_start_forecast_is_uninformative_and_says_why(space: ReplaySpace) -> None:
    surrogate = make_surrogate("learned", space.param_values)
    for idx in np.flatnonzero(space.ok_mask)[:3]:
        surrogate.observe(space.config(int(idx)), float(space.median_times[idx]))
    child, parent, _ = _extremes(space)
    f = predict(child, parent, PredictContext(), surrogate)
    assert not f.informative
    assert f.p_faster == 0.5 and f.confidence == 0.0
    assert f.p_fail is None  # it knows nothing, so it does not claim the child cannot fail either
    assert f.rationale.startswith("cold start: only 3 timed configurations")


def test_none_surrogate_never_forecasts(space: ReplaySpace) -> None:
    child, parent, _ = _extremes(space)
    f = predict(child, parent, PredictContext(), NoneSurrogate())
    assert f.surrogate == "none" and not f.informative
    assert f.bin_probs == pytest.approx([1 / 8] * 8)


def test_code_candidate_without_config_gets_no_config_forecast(trained: LearnedSurrogate) -> None:
    f = predict(
        Candidate(source_path="kernel.cu"), Parent(source_path="old.cu", runtime_ms=1.0), PredictContext(), trained
    )
    assert not f.informative
    assert "forecasts configurations only" in f.rationale


def test_unknown_surrogate_name_lists_the_available_ones(space: ReplaySpace) -> None:
    with pytest.raises(KeyError, match="available: learned, none, plain-rf"):
        make_surrogate("llm-that-does-not-exist", space.param_values)


def test_parent_time_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Parent(config={}, runtime_ms=0.0)


def test_forecast_round_trips_through_json(space: ReplaySpace, trained: LearnedSurrogate, tmp_path: Path) -> None:
    child, parent, _ = _extremes(space)
    f = predict(child, parent, PredictContext(incumbent_runtime_ms=1.0), trained)
    assert Forecast.model_validate_json(f.model_dump_json()) == f


def test_unlikely_candidates_keep_a_nonzero_ordered_chance(space: ReplaySpace, trained: LearnedSurrogate) -> None:
    """The gate thresholds on small probabilities, so 'very unlikely' must not collapse to 'impossible'."""
    ok = np.flatnonzero(space.ok_mask)
    by_time = ok[np.argsort(space.median_times[ok])]
    best = Parent(config=space.config(int(by_time[0])), runtime_ms=float(space.median_times[by_time[0]]))
    poor, worst = (Candidate(config=space.config(int(i))) for i in (by_time[len(by_time) // 2], by_time[-1]))
    p_poor = predict(poor, best, PredictContext(), trained).p_faster
    p_worst = predict(worst, best, PredictContext(), trained).p_faster
    assert 0.0 < p_worst < p_poor < 0.2
