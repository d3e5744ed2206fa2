"""Summaries and the supervisor's cross-check of per-call timings; no torch, so the supervisor stays light."""

from __future__ import annotations

import math
import resource
import statistics
from typing import Any, Optional, Sequence

from kernelscout.tools.schema import TimingStats


def quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def balanced_median(times_ms: Sequence[float], follows: Optional[Sequence[bool]] = None) -> float:
    """A side's median per-call time, balanced over where its calls fell in their rounds.

    Rounds alternate which side goes first, so each side is timed first in half of them and right after
    the other side's call in the rest, and on calls of tens of microseconds the two positions differ by
    5-15 % (what the call before, and the harness's work after it, left in the caches). Alternating cancels
    that for a mean, not for a median of all the calls: they form two clusters, and the median falls
    between them wherever the clusters' edges happen to lie (a candidate whose code is the reference's read
    0.97x on a 19 us call, benchmarks/aa_bias.py, with the candidate first-in-round 5 % slower and second 4 %
    faster). The geometric mean of the two positions' medians cancels any factor that goes with the position,
    since both sides spend as many calls in each; with fewer than 3 calls in either, the plain median."""
    medians = _by_position(times_ms, follows) if follows is not None and len(follows) == len(times_ms) else None
    return statistics.median(times_ms) if medians is None else math.sqrt(medians[0] * medians[1])


SAMPLE_RTOL = 1e-3  # how far a re-run of the reference may be from its timed call, at each sampled value


def same_sample(got: Any, kept: Any) -> bool:
    """Whether the values a worker read back at a round's sampled positions are those it reported when the
    round's step happened (`worker.sample`): equal, NaN where NaN was."""
    return close_sample(got, kept, rtol=0.0)


def close_sample(got: Any, kept: Any, rtol: float = SAMPLE_RTOL) -> bool:
    """Whether the reference run again at a re-check gave, at the sampled positions, what its timed call gave: the
    same integers and flags, floats within `rtol` of the larger of the value and the sample's RMS (a reference on
    a GPU may sum in another order from one call to the next; `Worker._check_repeatable` refuses one that moves
    more). A forward changed for the timed calls alone (a patch that puts itself back) gives other values."""
    if not isinstance(got, list) or not isinstance(kept, list) or len(got) != len(kept):
        return False
    for a, b in zip(got, kept):
        if a == b:
            continue
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            return False
        finite = [abs(y) for y in b if isinstance(y, float) and math.isfinite(y)]
        scale = math.sqrt(sum(y * y for y in finite) / len(finite)) if finite else 0.0
        for x, y in zip(a, b):
            if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                continue
            if not (isinstance(x, float) and isinstance(y, float)) or not abs(x - y) <= rtol * max(abs(y), scale):
                return False
    return True


def _by_position(times_ms: Sequence[float], follows: Sequence[bool]) -> Optional[tuple[float, float]]:
    first = [t for t, f in zip(times_ms, follows) if not f]
    after = [t for t, f in zip(times_ms, follows) if f]
    if len(first) < 3 or len(after) < 3:
        return None
    return statistics.median(first), statistics.median(after)


def speedups_by_position(ref_ms: Sequence[float], cand_ms: Sequence[float], follows: dict[str, Sequence[bool]]) -> Optional[tuple[float, float]]:
    """(speedup from the calls each side made first in its round, from those made right after the other's); the
    speedup shown is their geometric mean. None with fewer than 3 calls of either kind on either side."""
    ref, cand = _by_position(ref_ms, follows.get("ref", ())), _by_position(cand_ms, follows.get("cand", ()))
    if ref is None or cand is None or min(cand) <= 0:
        return None
    return ref[0] / cand[0], ref[1] / cand[1]


def summarise(times_ms: Sequence[float], follows: Optional[Sequence[bool]] = None) -> TimingStats:
    """`follows`: per call, whether it came right after the other side's (its median is then balanced
    over the two positions, `balanced_median`)."""
    return TimingStats(
        median_ms=balanced_median(times_ms, follows),
        iqr_ms=quantile(times_ms, 0.75) - quantile(times_ms, 0.25),
        mean_ms=statistics.fmean(times_ms),
        min_ms=min(times_ms),
        repeats=len(times_ms),
    )


def wall_clock_disagreement(
    ref_timer: Sequence[float],
    cand_timer: Sequence[float],
    ref_wall: Sequence[float],
    cand_wall: Sequence[float],
) -> Optional[str]:
    """Compare the worker's per-call timer with the supervisor's own clock around each call.

    The supervisor's wall time of a call is the call plus the same fixed costs for both sides
    (pipe round trip, synchronise, cache flush), so the wall-clock *difference* between candidate
    and reference must match the timer's difference. A timer the candidate has faked, or work it
    has pushed outside the timed region, breaks that match; the worker cannot touch this clock.
    """
    n = min(len(ref_timer), len(cand_timer), len(ref_wall), len(cand_wall))
    if n < 3:
        return None
    d_timer = statistics.median(c - r for c, r in zip(cand_timer[:n], ref_timer[:n]))
    d_wall = statistics.median(c - r for c, r in zip(cand_wall[:n], ref_wall[:n]))
    over_ref = [w - t for w, t in zip(ref_wall[:n], ref_timer[:n])]
    over_cand = [w - t for w, t in zip(cand_wall[:n], cand_timer[:n])]
    if min(over_ref) < -0.05 * statistics.median(ref_wall[:n]) - 0.05 or min(over_cand) < -0.05 * statistics.median(cand_wall[:n]) - 0.05:
        return "the worker reported a call as longer than the supervisor's wall clock around it"
    noise = (quantile(over_ref, 0.75) - quantile(over_ref, 0.25) + quantile(over_cand, 0.75) - quantile(over_cand, 0.25)) / 2
    scale = max(statistics.median(ref_timer[:n]), statistics.median(cand_timer[:n]))
    tolerance = 0.2 * scale + 3 * noise + 0.05
    gap = d_wall - d_timer
    # One-sided: only a timer that makes the candidate look faster than the wall clock says can
    # overstate a speedup. The other direction is scheduling noise on a busy machine.
    if gap > tolerance:
        return (
            f"per-call timer and the supervisor's wall clock disagree by {gap:+.3f} ms per call "
            f"(tolerance {tolerance:.3f} ms): time was spent outside the timed region, or the timer was tampered with"
        )
    return None


AFTER_THE_OTHER_LIMIT = 1.5  # how much more the reference may slow after the candidate than the candidate after it


def after_the_other_ratio(times: Sequence[float], follows: Sequence[bool]) -> Optional[float]:
    """Median time of one side's calls made right after the other side's, over its calls made first in
    their round (after the harness's refill); None with fewer than 3 of either."""
    medians = _by_position(times, follows)
    if medians is None or medians[0] <= 0:
        return None
    return medians[1] / medians[0]


def slowed_after_the_other(ref_timer: Sequence[float], cand_timer: Sequence[float], follows: dict[str, Sequence[bool]]) -> Optional[str]:
    """Whether the candidate leaves the process in a state that slows whatever runs next.

    Rounds alternate which side goes first, so each side is timed both right after the other side's
    call and first in its round. An honest pair disturbs each other about equally (caches, the
    allocator's free lists), so both ratios are close. A candidate that hands the heap's free pages
    back to the OS at the end of its call (malloc_trim, found in a review: the softmax reference's
    temporaries page-faulted in again, 2.4 ms to 8.6 ms, 3.5x reported against 2.2x) makes the
    reference slow only right after it; no setting is left changed for the other checks to see.

    A burst of noise on a shared machine can tip one run's medians too (an honest naive layernorm:
    1.86x once, against 0.8-1.26x in 25 runs), so when the halves of the run can each be judged, both
    must agree: a cheat acts in every round, a burst in some."""
    ref_f, cand_f = list(follows.get("ref", ())), list(follows.get("cand", ()))

    def slowed(lo: int, hi: int) -> Optional[tuple[float, float]]:
        r_ref = after_the_other_ratio(ref_timer[lo:hi], ref_f[lo:hi])
        r_cand = after_the_other_ratio(cand_timer[lo:hi], cand_f[lo:hi])
        if r_ref is None or r_cand is None:
            return None
        after = r_ref > AFTER_THE_OTHER_LIMIT * max(r_cand, 1.0)
        # and the mirror: slower in the rounds it opens, where code the candidate left to run between calls
        # (a finaliser planted in the harness) acts only before rounds that start with the reference
        opening = r_ref * AFTER_THE_OTHER_LIMIT < min(r_cand, 1.0)
        return (r_ref, r_cand) if after or opening else (0.0, 0.0)

    n = min(len(ref_timer), len(cand_timer), len(ref_f), len(cand_f))
    whole = slowed(0, n)
    if not whole or not whole[0]:
        return None
    halves = [slowed(0, n // 2), slowed(n // 2, n)]
    if all(h is not None for h in halves) and not all(h[0] for h in halves):
        return None
    r_ref, r_cand = whole
    if r_ref < 1.0:
        return (f"the reference ran {1 / r_ref:.2f}x slower first in its round than right after the candidate's call, while the "
                f"candidate's ratio was {r_cand:.2f}x (limit {AFTER_THE_OTHER_LIMIT}x), in both halves of the run: something "
                "slows the rounds the reference opens")
    return (f"the reference ran {r_ref:.2f}x slower right after the candidate's call than first in its round, while the "
            f"candidate ran {r_cand:.2f}x after the reference's (limit {AFTER_THE_OTHER_LIMIT}x), in both halves of the "
            "run: the candidate leaves something behind that slows the next call")


def disturbed_reference(disturbed: Sequence[str], ref_calls: int) -> Optional[str]:
    """Whether the candidate's threads disturbed the reference's timed calls often enough to move its
    median.

    The worker names each timed reference call that had to wait while a thread the candidate started
    ran ("waited"), or during which such threads used a CPU ("burned"; `Worker._disturbed`). Once is
    not proof: a pool thread the candidate used inside its own call may still be finishing its
    bookkeeping when the reference starts. A cheat that moves the reference's median has to reach at
    least half of its calls, so a quarter (and at least two) is the bar."""
    if len(disturbed) < 2 or len(disturbed) * 4 < ref_calls:
        return None
    waited = sum(1 for d in disturbed if d == "waited")
    if waited * 2 >= len(disturbed):
        how = "the reference had to wait meanwhile (for the interpreter lock or another lock)"
    else:
        how = "they used a CPU meanwhile"
    return (f"threads the candidate started ran while the reference was being timed, and {how} in "
            f"{len(disturbed)} of its {ref_calls} calls: its time was not its own")


BUSY_REASON = "the machine was busy"  # how `busy_machine`'s reason begins (a search stops on it)
CROWDED_SHARE = 0.1  # of a reference call's time its threads may spend waiting for a CPU before the round is left out


def crowded(queued_ms: float, call_ms: float) -> bool:
    """Whether a round's reference call was slowed by another process on the worker's cores: its threads,
    all together, waited for a CPU for over a tenth of the call.

    On a 2-core VM with one busy process beside it, an op-by-op softmax reference went from 2.7 ms to
    15-50 ms (every operator's threads wait at a barrier for the one pushed off its core), a fused
    candidate far less, and the timing passed every other check at 5.0x against 2.4x on the idle
    machine. Only the reference's calls decide: the candidate cannot crowd them without running
    something while they are timed (which the worker reports), so it cannot choose which rounds count,
    while its own calls could be crowded by its own threads."""
    return queued_ms > CROWDED_SHARE * call_ms


def busy_machine(left_out: int, kept: int, *, where: str = "") -> Optional[str]:
    """Whether too few rounds were quiet to stand on their own: fewer than 3, or fewer than those left out.

    `where` names the timing when it is not the candidate's worker's (the referee's of the reference alone)."""
    if not left_out or (kept >= 3 and kept >= left_out):
        return None
    return (f"{BUSY_REASON}{where}: in {left_out} of {left_out + kept} timed rounds the reference's threads waited for a CPU "
            "for over a tenth of its call, because another process was running on the worker's cores. Measure again when "
            "the machine is idle (or give the worker cores no other process uses)")


PAGE_BYTES = resource.getpagesize()
FAULTS_FLOOR = 256  # pages (1 MiB of 4 KiB pages) a reference call may fault in beyond what it did before the candidate loaded


def heap_handed_back(faults: Sequence[int], at_load: Optional[int]) -> Optional[str]:
    """Whether the reference's memory was taken back by the OS between its timed calls.

    A warm reference reuses the memory of its temporaries (the worker keeps blocks under 1 GiB in the
    heap): every honest example faults in 0 pages a call once warm. Handing the heap's free pages back
    to the OS (malloc_trim) from anywhere between calls makes it fault its temporaries in again, every
    call, in both positions of the round, so the after-the-other check cannot see it: a review's
    candidate did it from a finaliser it planted in the harness's round (softmax 7.9x against 2.9x
    honest, 4,096 pages a call). `at_load` is what the reference's repeat call faulted in before any
    candidate existed: a reference with temporaries above the heap's threshold faults every call, and
    that is its own cost."""
    if at_load is None or len(faults) < 3:
        return None
    typical = statistics.median(faults)
    if typical <= max(FAULTS_FLOOR, 4 * at_load):
        return None
    return (f"the reference faulted in {typical:.0f} pages ({typical * PAGE_BYTES / 2**20:.1f} MiB) of memory in a typical timed call, "
            f"against {at_load} in a call before the candidate loaded: memory it reuses when left alone was handed back to the "
            "OS between its calls (malloc_trim or madvise from the candidate's code), so every call paid to fault it in again")


ALONE_LIMIT = 1.5  # how much slower the reference may run beside the candidate than alone (1.3 false-alarmed: docs/harness_hardening.md)
ALONE_SLACK_MS = 0.05  # and by how much more, whatever its time


def slowed_beside_the_candidate(beside: Sequence[float], alone: Sequence[float]) -> Optional[str]:
    """Whether the reference ran slower in the candidate's worker than in a worker that never loaded it.

    The checks inside the candidate's worker look for what they know how to look for (settings, hooks,
    threads), and the candidate could have silenced them all by answering for its worker. Whatever it
    did to the reference, a slower reference is what it comes to; the referee's clean process is the
    measure. Medians only: a candidate that answers for its worker chooses the spread of the times
    beside it as freely as their level (a red-team pass slowed 11 calls in 20 by 20 ms, so that the
    middle halves overlapped and a test of their overlap let 5x through). The caller confirms a
    finding with a second timing alone, so that a lucky quiet phase is not read as a cheat.
    """
    if not beside or len(alone) < 3:
        return None
    b, a = statistics.median(beside), statistics.median(alone)
    # plus 50 us, as the wall-clock cross-check allows: a 0.1 ms reference read 1.4x slower beside an honest
    # candidate than alone, twice in a row (schedstat reads and the other side's call just before it, in a
    # bigger process), which is its worker's cost, not a cheat's
    if b <= ALONE_LIMIT * a + ALONE_SLACK_MS:
        return None
    return (f"the reference took {b:.4g} ms a call beside the candidate and {a:.4g} ms alone in a worker that never "
            f"loaded it ({b / a:.2f}x): something the candidate did slowed the reference (a setting made at import counts "
            "too: torch.set_default_device, say, puts a Python call in front of every torch call); if it changes nothing "
            "outside its own call, measure it again: on a CPU both timings can swing by a fifth from run to run")
