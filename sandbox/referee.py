"""A second opinion on a measurement, from a worker that never loads candidate code.

The candidate runs inside its own worker's process, so anything that worker reports (its verdict, the
reference's time beside the candidate) the candidate could have written: a review took the command
channel over from inside `forward` and answered every check itself (docs/harness_hardening.md). The
referee is a worker of the same pool that only ever loads the problem. Once the candidate's worker has
reached its verdict, the referee

- judges one output of the candidate's, for inputs of a seed chosen only now, against its own
  reference (the candidate's worker writes the output to a file; the supervisor copies it across), and
- when the candidate came out faster, times the reference alone while the candidate's worker is
  stopped, and compares that with the reference's time beside the candidate.

A referee that fails, or cannot judge, leaves the timing not valid: were it only a warning, a candidate
that made it fail would pass unjudged (a red-team pass did, twice).

What it does not close: a candidate that answers for its worker can still compute the right output for
the referee's seed alone and report timings of its own making; the supervisor's wall clock around every
call bounds those (`stats.wall_clock_disagreement`), and the reference's time has a clean bound (1.5x).
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path
from typing import Callable, Optional

from kernelscout.sandbox.pool import WorkerDied, WorkerOutOfMemory, WorkerPool, WorkerProcess, WorkerTimedOut
from kernelscout.sandbox.stats import busy_machine, crowded, quantile, slowed_beside_the_candidate
from kernelscout.tools.schema import Measurement, MeasureStatus

SLACK_BYTES = 1 << 20  # what the file format adds to the outputs' own bytes, and more
FROZEN_CPU_S = 0.05  # CPU time a stopped tree may still show (ticks of 10 ms, and the stop's own delivery)


class _RefereeFailed(Exception):
    """The referee itself failed: the candidate is not blamed, and nothing its worker said is confirmed."""


def second_opinion(
    pool: WorkerPool,
    worker: WorkerProcess,
    m: Measurement,
    *,
    device: str,
    stage: Callable[[WorkerProcess], str],
    problem_sha: str,
    init_seed: int,
    beside_ms: list[float],
    rounds: tuple[int, int, float],
    deadline: float,
    allowance_s: float,
    start_timeout: float,
) -> Measurement:
    """Return `m` as the referee leaves it: incorrect if the candidate's output is wrong on its seed,
    timing not valid if the reference ran slower beside the candidate than alone; unchanged otherwise.

    `stage` copies the problem into a worker's folder; `rounds` is (warm-up rounds, least timed rounds,
    seconds to aim for) of the reference alone."""
    seed = secrets.randbits(31)
    name = f"referee-{secrets.token_hex(6)}.pt"
    reply = worker.request_by("emit", deadline, seed=seed, path=name)
    if reply["status"] != "ok":  # the candidate failed on fresh inputs: that is its own verdict
        failed = Measurement(status=MeasureStatus(reply["status"]), message=reply.get("message", ""))
        failed.message = f"on the second worker's inputs (seed {seed}): {failed.message}"
        return failed
    made = reply.get("inputs")
    # the referee's own allowance from here: a candidate that spent its own up to the last moment (a red-team
    # pass did, in `emit`) would otherwise leave the referee none, and time it out
    deadline = time.monotonic() + allowance_s
    try:
        referee = pool.referee(device, start_timeout)
        reply = referee.request_by("load_problem", deadline, path=stage(referee), sha=problem_sha, seeds=[seed])
        if reply["status"] != "ok":
            raise _RefereeFailed(reply.get("message", reply["status"]))
        limit = sum(spec[2] for spec in reply.get("outputs") or []) * 2 + SLACK_BYTES
        wrong = _hand_over(worker.workdir / name, referee.workdir / name, limit)
        if wrong:
            return _incorrect(m, wrong)
        with worker.frozen() as freeze:
            reply = referee.request_by("load_reference", deadline, init_seed=init_seed)
            if reply["status"] != "ok":
                raise _RefereeFailed(reply.get("message", reply["status"]))
            try:
                reply = referee.request_by("judge", deadline, seed=seed, path=name, inputs=made)
            except WorkerDied:
                return _incorrect(m, "the candidate's output crashed the second worker that judged it")
            if reply["status"] == "incorrect":
                return _incorrect(m, reply["message"])
            if reply["status"] == "skipped":  # the referee is fine; it could not judge this output
                return _unconfirmed(m, f"the second worker did not judge the candidate's output: {reply['message']}")
            if reply["status"] != "ok":
                raise _RefereeFailed(reply.get("message", reply["status"]))
            m.checks.append(f"one output on fresh inputs judged by a second worker that never loaded the candidate (seed {seed})")
            compare = m.timing_valid and m.speedup is not None and m.speedup > 1.0
            if compare:
                _compare_reference(m, beside_ms, lambda: _time_alone(referee, rounds, len(beside_ms), deadline))
        if compare and freeze.ran_s > FROZEN_CPU_S:
            return _unconfirmed(m, f"the candidate's worker used {freeze.ran_s * 1e3:.0f} ms of CPU while it was stopped for "
                                   "the reference to be timed alone (a process inside a long system call runs on), so that "
                                   "timing is not trusted")
    except (_RefereeFailed, WorkerDied, WorkerTimedOut, WorkerOutOfMemory) as exc:
        pool.retire_referee(device)
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # not the candidate's verdict, and not a pass either: whatever made it fail, the timing stands unconfirmed
        return _unconfirmed(m, f"the second worker that checks the candidate's worker failed ({what}), so nothing it "
                               "reported was confirmed; measure it again")
    finally:
        (worker.workdir / name).unlink(missing_ok=True)
    return m


def _hand_over(source: Path, target: Path, limit: int) -> Optional[str]:
    """Copy the candidate's output file into the referee's folder; what is wrong with it, if anything.

    The file is the candidate's to make: it could be a link to a file of the user's, a FIFO that never
    ends or far larger than any output, so it is opened without following links and must be a regular file
    of sensible size."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"the candidate's worker did not write its output as a plain file ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "the candidate's worker did not write its output as a plain file"
        if info.st_size > limit:
            return f"the candidate's output file is {info.st_size} bytes, more than twice the reference's outputs"
        with os.fdopen(fd, "rb", closefd=False) as src, open(target, "wb") as dst:
            while chunk := src.read(min(1 << 24, limit + 1)):
                dst.write(chunk)
                limit -= len(chunk)
                if limit < 0:
                    return "the candidate's output file grew while it was copied"
    finally:
        os.close(fd)
    return None


def _unconfirmed(m: Measurement, why: str) -> Measurement:
    m.warnings.append(why)
    if m.timing_valid:
        m.timing_valid = False
        m.timing_invalid_reason = why
        m.message += f"; timing not valid: {why}"
    return m


def _incorrect(m: Measurement, why: str) -> Measurement:
    return Measurement(status=MeasureStatus.incorrect, message=why, checks=m.checks, warnings=m.warnings)


def _time_alone(referee: WorkerProcess, rounds: tuple[int, int, float], wanted: int, deadline: float) -> tuple[list[float], int]:
    """The reference's per-call times in the referee, as the candidate's worker times it (fresh inputs each
    round, the same timer), for at least the least number of rounds and a quarter of the timing budget; and
    how many rounds were left out because another process crowded the reference off its CPU."""
    warmup, least, budget_s = rounds
    times: list[float] = []
    kept_s, made, left_out = 0.0, 0, 0
    while made < warmup + max(least, wanted) * 3:
        # with keys, so that the reference's calls here are surrounded by the same sampling as beside the candidate
        key = secrets.randbits(63)
        reply = referee.request_by("prep", deadline, seed=secrets.randbits(31), keys={"ref": key})
        if reply["status"] == "ok":
            reply = referee.request_by("call", deadline, side="ref", key=key)
        if reply["status"] != "ok":
            raise _RefereeFailed(reply.get("message", reply["status"]))
        made += 1
        if made <= warmup:
            continue
        if crowded(reply.get("queued_ms", 0.0), reply["timer_ms"]):
            left_out += 1
            continue
        times.append(reply["timer_ms"])
        kept_s += reply["timer_ms"] / 1e3
        # a quarter of the budget (the reference had about half of it beside the candidate): enough for a median
        if len(times) >= max(least, min(wanted, 3 * least)) or (len(times) >= least and kept_s >= budget_s / 4):
            break
    return times, left_out


def _compare_reference(m: Measurement, beside: list[float], time_alone: Callable[[], tuple[list[float], int]]) -> None:
    """Void the timing if the reference ran slower beside the candidate than alone, twice: a finding is
    confirmed by a second timing alone, and the slower of the two stands (the machine may have been
    quieter for the first than while the candidate's worker was timed).

    Too few quiet rounds alone is the busy machine's verdict, in its words, so that a search waits for an
    idle machine and times the candidate again rather than taking it for the candidate's fault."""
    alone, left_out = time_alone()
    slowed = slowed_beside_the_candidate(beside, alone)
    if slowed:
        again, _ = time_alone()
        if len(again) >= 3 and quantile(again, 0.5) > quantile(alone, 0.5):
            alone = again
        slowed = slowed_beside_the_candidate(beside, alone)
    if len(alone) < 3 or not beside:
        busy = busy_machine(left_out, len(alone), where=" while the second worker timed the reference alone")
        _unconfirmed(m, busy or "the reference could not be timed alone often enough to compare it with its time beside the candidate")
        return
    m.reference_alone_ms = quantile(alone, 0.5)
    m.checks.append(f"the reference alone in the second worker: {quantile(alone, 0.5):.4g} ms a call, beside the candidate "
                    f"{quantile(beside, 0.5):.4g} ms")
    if slowed:
        m.timing_valid = False
        m.timing_invalid_reason = slowed
        m.message += f"; timing not valid: {slowed}"
