"""Summaries and the supervisor's cross-check of per-call timings; no torch, so the supervisor stays light."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from kernelscout.tools.schema import TimingStats


def quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(times_ms: Sequence[float]) -> TimingStats:
    return TimingStats(
        median_ms=statistics.median(times_ms),
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
