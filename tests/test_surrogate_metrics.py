"""Evaluation metrics behave as their definitions say on cases small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kernelscout.tools.surrogates import metrics as M


def test_pairwise_accuracy_perfect_reversed_and_constant() -> None:
    truth = np.array([1.0, 2.0, 3.0, 4.0])
    i, j = np.array([0, 0, 1, 2]), np.array([1, 3, 2, 3])
    assert M.pairwise_accuracy(truth * 10, truth, i, j) == 1.0
    assert M.pairwise_accuracy(-truth, truth, i, j) == 0.0
    assert M.pairwise_accuracy(np.zeros(4), truth, i, j) == 0.5


def test_pairwise_accuracy_ignores_pairs_tied_in_truth() -> None:
    truth = np.array([1.0, 1.0, 2.0])
    score = np.array([5.0, 0.0, 9.0])
    assert M.pairwise_accuracy(score, truth, np.array([0, 0]), np.array([1, 2])) == 1.0


def test_sample_pairs_are_distinct_and_in_range() -> None:
    i, j = M.sample_pairs(5, 1000, np.random.default_rng(0))
    assert (i != j).all() and i.max() < 5 and j.max() < 5
    assert len(set(zip(i.tolist(), j.tolist()))) == 20  # all ordered pairs show up


def test_spearman_shares_tied_ranks_and_matches_scipy() -> None:
    assert M.average_ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert M.spearman(np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])) == pytest.approx(1.0)
    assert M.spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert M.spearman(np.array([1.0, 1.0, 1.0]), np.array([3.0, 2.0, 1.0])) == 0.0  # a constant side claims nothing
    from scipy.stats import spearmanr

    rng = np.random.default_rng(3)
    for _ in range(50):
        score, truth = rng.integers(0, 4, 12).astype(float), rng.normal(size=12)  # many ties on one side
        if np.ptp(score) > 0:
            assert M.spearman(score, truth) == pytest.approx(spearmanr(score, truth)[0], abs=1e-12)


def test_direction_accuracy_counts_coin_flips_as_half() -> None:
    assert M.direction_accuracy(np.array([0.9, 0.2, 0.5]), np.array([True, True, False])) == pytest.approx(1.5 / 3)


def test_brier_and_rps_zero_for_certain_right_forecasts_and_rps_rewards_near_misses() -> None:
    outcome = np.array([2])
    right = np.array([[0.0, 0.0, 1.0, 0.0]])
    near = np.array([[0.0, 1.0, 0.0, 0.0]])
    far = np.array([[1.0, 0.0, 0.0, 0.0]])
    assert M.brier_multiclass(right, outcome) == 0.0
    assert M.ranked_probability_score(right, outcome) == 0.0
    assert M.brier_multiclass(near, outcome) == M.brier_multiclass(far, outcome) == 2.0
    assert M.ranked_probability_score(near, outcome) < M.ranked_probability_score(far, outcome)


def test_ece_small_for_calibrated_forecasts_large_for_overconfident() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(50_000)
    calibrated = rng.random(p.size) < p
    assert M.expected_calibration_error(p, calibrated) < 0.01
    overconfident = np.where(p > 0.5, 0.99, 0.01)
    assert M.expected_calibration_error(overconfident, calibrated) > 0.2


def test_risk_coverage_and_aurc_reward_confidence_that_tracks_correctness() -> None:
    correct = np.array([1, 1, 1, 0, 0], dtype=float)
    good = np.array([0.9, 0.8, 0.7, 0.2, 0.1])
    coverage, risk = M.risk_coverage(good, correct)
    assert coverage.tolist() == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert risk[:3].tolist() == [0.0, 0.0, 0.0] and risk[-1] == pytest.approx(0.4)
    assert M.aurc(good, correct) < M.aurc(-good, correct)


def test_top_fraction_recovery_skips_failures_and_scores_the_miss() -> None:
    times = np.array([1.0, 2.0, np.nan, 4.0, 8.0, 3.0, 5.0, 6.0, 7.0, 9.0])
    perfect = np.nan_to_num(times, nan=100.0)
    assert M.top_fraction_recovery(perfect, times, 0.1) == 1.0
    picks_second_best = np.where(times == 1.0, 50.0, perfect)
    assert M.top_fraction_recovery(picks_second_best, times, 0.1) == 0.5
    picks_failure = np.where(np.isnan(times), -1.0, perfect)
    assert M.top_fraction_recovery(picks_failure, times, 0.1) == 0.0
