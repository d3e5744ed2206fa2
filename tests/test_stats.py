"""The supervisor's wall-clock cross-check: honest timings agree, faked ones do not."""

import random

from kernelscout.sandbox.stats import summarise, wall_clock_disagreement


def _rounds(true_ref, true_cand, claimed_cand=None, n=40, overhead=0.3, jitter=0.02, seed=0):
    rng = random.Random(seed)
    ref_t = [true_ref * rng.uniform(0.97, 1.03) for _ in range(n)]
    cand_true = [true_cand * rng.uniform(0.97, 1.03) for _ in range(n)]
    cand_t = cand_true if claimed_cand is None else [claimed_cand] * n
    ref_w = [t + overhead + rng.uniform(0, jitter) for t in ref_t]
    cand_w = [t + overhead + rng.uniform(0, jitter) for t in cand_true]
    return ref_t, cand_t, ref_w, cand_w


def test_honest_timings_agree_with_the_wall_clock():
    assert wall_clock_disagreement(*_rounds(2.0, 1.0)) is None
    assert wall_clock_disagreement(*_rounds(0.05, 0.02)) is None


def test_a_timer_that_under_reports_is_caught():
    reason = wall_clock_disagreement(*_rounds(2.0, 2.0, claimed_cand=0.2))
    assert reason and "disagree" in reason


def test_a_call_longer_than_the_wall_clock_is_impossible():
    ref_t, cand_t, ref_w, cand_w = _rounds(1.0, 1.0)
    assert "longer than" in wall_clock_disagreement(ref_t, [50.0] * len(cand_t), ref_w, cand_w)


def test_summary_uses_median_and_iqr():
    s = summarise([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_ms == 3.0 and s.iqr_ms == 2.0 and s.repeats == 5 and s.min_ms == 1.0


def test_a_timer_that_over_reports_the_candidate_cannot_inflate_a_speedup_and_is_tolerated():
    # timer says the candidate is slower than the wall clock does: scheduling noise, not an attack
    assert wall_clock_disagreement(*_rounds(2.0, 2.0, claimed_cand=2.25)) is None
