"""The supervisor's cross-checks of a timing: honest timings pass, faked or sabotaged ones do not."""

import random

from kernelscout.sandbox.stats import (busy_machine, close_sample, crowded, disturbed_reference, same_sample, slowed_after_the_other,
                                      speedups_by_position, summarise, wall_clock_disagreement)


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


def _alternating(n, ref_first, ref_after, cand_first, cand_after):
    """Rounds alternate which side goes first: (ref, cand), then (cand, ref), ..."""
    ref_t, cand_t, follows = [], [], {"ref": [], "cand": []}
    for i in range(n):
        ref_goes_first = i % 2 == 0
        ref_t.append(ref_first if ref_goes_first else ref_after)
        cand_t.append(cand_after if ref_goes_first else cand_first)
        follows["ref"].append(not ref_goes_first)
        follows["cand"].append(ref_goes_first)
    return ref_t, cand_t, follows


def test_a_pair_that_disturbs_each_other_alike_passes():
    # caches and free lists: each side a little slower right after the other, the reference more so
    assert slowed_after_the_other(*_alternating(20, 3.0, 3.5, 1.0, 1.05)) is None


def test_a_candidate_that_leaves_the_reference_slow_right_after_it_is_caught():
    # malloc_trim at the end of its call: the reference's next call page-faults its temporaries in again
    reason = slowed_after_the_other(*_alternating(20, 2.4, 8.6, 1.0, 1.0))
    assert reason and "slower right after the candidate" in reason


def test_a_reference_slowed_only_in_the_rounds_it_opens_is_caught():
    # a finaliser the candidate planted runs between rounds, only before those the reference opens
    # (layernorm: the reference's ratio 0.44x, 5.7x valid before the page faults were counted)
    reason = slowed_after_the_other(*_alternating(20, 6.0, 2.6, 1.0, 1.0))
    assert reason and "slower first in its round" in reason


def test_a_burst_of_noise_in_one_half_of_the_run_is_not_a_cheat():
    ref_t, cand_t, follows = _alternating(24, 3.0, 3.3, 1.0, 1.0)
    ref_t[:12] = _alternating(12, 3.0, 6.0, 1.0, 1.0)[0]  # the machine got busy for the first half, by turns
    assert slowed_after_the_other(ref_t, cand_t, follows) is None
    ref_t[12:] = _alternating(12, 3.0, 6.0, 1.0, 1.0)[0]  # in every round: a cheat
    assert "both halves" in slowed_after_the_other(ref_t, cand_t, follows)


def test_too_few_rounds_of_either_kind_say_nothing():
    assert slowed_after_the_other(*_alternating(4, 2.4, 8.6, 1.0, 1.0)) is None


def test_a_reference_disturbed_once_is_a_race_and_in_most_calls_is_a_cheat():
    assert disturbed_reference(["waited"], 10) is None  # a pool thread finishing late, once
    assert disturbed_reference(["waited", "burned"], 10) is None
    assert "had to wait" in disturbed_reference(["waited"] * 3, 10)
    assert "used a CPU" in disturbed_reference(["burned"] * 60 + ["waited"] * 40, 100)
    assert "in 100 of its 100 calls" in disturbed_reference(["waited"] * 100, 100)


def test_a_reference_call_whose_threads_queued_for_a_cpu_is_crowded():
    assert not crowded(queued_ms=0.02, call_ms=2.7)  # an idle machine: wake-ups only
    assert crowded(queued_ms=20.0, call_ms=40.0)  # a busy process on the same cores


def test_a_few_crowded_rounds_are_left_out_and_most_make_the_machine_busy():
    assert busy_machine(left_out=0, kept=40) is None
    assert busy_machine(left_out=5, kept=40) is None
    reason = busy_machine(left_out=27, kept=0)
    assert reason and "machine was busy" in reason and "27 of 27" in reason
    assert busy_machine(left_out=12, kept=10)  # more crowded rounds than quiet ones
    assert busy_machine(left_out=1, kept=2)  # too few quiet rounds to stand on


def _same_code_timed_in_alternating_rounds(n=300, seed=0):
    """Reference and candidate are the same 20 us code; a call is 10 % faster when the reference's call (and
    the harness's work after it) came just before it than when the candidate's did, whichever side it is,
    as the A/A check saw on this CPU (benchmarks/aa_bias.py)."""
    rng = random.Random(seed)
    times = {"ref": [], "cand": []}
    follows = {"ref": [], "cand": []}
    last = "cand"
    for k in range(n):
        for position, side in enumerate(("ref", "cand") if k % 2 == 0 else ("cand", "ref")):
            warm = 0.9 if last == "ref" else 1.0
            times[side].append(0.020 * warm * rng.uniform(0.97, 1.03))
            follows[side].append(position == 1)
            last = side
    return times, follows


def test_a_same_code_pair_reads_one_when_the_call_order_favours_one_side_s_follower():
    times, follows = _same_code_timed_in_alternating_rounds()
    plain = summarise(times["ref"]).median_ms / summarise(times["cand"]).median_ms
    balanced = summarise(times["ref"], follows["ref"]).median_ms / summarise(times["cand"], follows["cand"]).median_ms
    assert abs(plain - 1) > 0.02  # the pooled median lands between the clusters
    assert abs(balanced - 1) < 0.01
    first, after = speedups_by_position(times["ref"], times["cand"], follows)
    assert first < 0.93 and after > 1.07  # what the measurement's checks show of it


def test_a_balanced_median_needs_calls_in_both_positions():
    assert summarise([1.0, 2.0, 3.0, 4.0], [False, False, False, True]).median_ms == 2.5
    assert summarise([1.0, 1.0, 1.0, 4.0, 4.0, 4.0], [False] * 3 + [True] * 3).median_ms == 2.0


def test_a_sample_read_back_matches_only_the_values_kept_nan_included():
    kept = [[1.0, float("nan"), -0.0], [3, 4]]
    assert same_sample([[1.0, float("nan"), 0.0], [3, 4]], kept)
    assert not same_sample([[1.0, 2.0, 0.0], [3, 4]], kept)
    assert not same_sample([[1.0, float("nan"), 0.0], [3, 5]], kept)
    assert not same_sample([[1.0, float("nan"), 0.0]], kept)  # a tensor fewer
    assert not same_sample(None, kept)


def test_a_reference_run_again_may_differ_by_its_summation_order_only():
    timed = [[1.0, -2.0, 1e-6, float("nan")], [7]]
    assert close_sample([[1.0 + 1e-5, -2.0, 2e-6, float("nan")], [7]], timed)  # within 1e-3 of the value or the sample's RMS
    assert not close_sample([[1.01, -2.0, 1e-6, float("nan")], [7]], timed)
    assert not close_sample([[1.0, -2.0, 1e-6, float("nan")], [8]], timed)  # integers exactly
    assert not close_sample([[0.0, 0.0, 0.0, 0.0], [7]], timed)  # an answer changed for the timed call alone
