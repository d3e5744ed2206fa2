"""What the search loop optimises: a KernelBench problem on a real device, or a recorded space on replay.

Both answer the same questions for the loop (how to measure a candidate, what a parent looks like
to the policy, how close to speed-of-light a result is), so `agent/graph.py` has one code path.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import AbstractSet, Any, NamedTuple, Optional

from kernelscout.sandbox.problem import problem_name
from kernelscout.sandbox.replay import ReplaySpace
from kernelscout.tools.archive import CandidateRecord
from kernelscout.tools.measure import code_key, measure_replay, replay_record, stored_measurement_id
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement


def recorded_measurement(run: RunDir, measurement_id: Optional[int]) -> Optional[Measurement]:
    if measurement_id is None:
        return None
    with run.connect() as db:
        row = db.execute("SELECT result_json FROM measurements WHERE id = ?", (measurement_id,)).fetchone()
    return Measurement.model_validate_json(row[0]) if row else None


REPLAY_REFERENCE_KEY = "replay_reference"  # run meta: the configuration a recorded space's speedups are over
SPACE_NOTES_KEY = "space_notes"  # run meta: what the recorded space's file says that the search did not replay


def drawn_reference(space: ReplaySpace, seed: int) -> dict[str, Any]:
    """The configuration a recorded space's speedups are over: one that works, drawn by the search's seed."""
    ok = [i for i in range(len(space)) if i not in space.failures]
    return space.config(random.Random(f"reference:{seed}").choice(ok))


def reference_times(run: RunDir, valid_only: bool = False) -> list[float]:
    """The reference's time in each of the run's successful measurements (each timed it alongside a candidate), sorted;
    `valid_only`: in those whose timing counted (a busy machine's are slow for the reference too)."""
    with run.connect() as db:
        rows = db.execute("SELECT result_json FROM measurements WHERE status = 'ok'").fetchall()
    measured = [Measurement.model_validate_json(row[0]) for row in rows]
    return sorted(m.ref_runtime_ms for m in measured if m.ref_runtime_ms and (m.timing_valid or not valid_only))


def _median(sorted_times: list[float]) -> Optional[float]:
    """The middle timing (the upper one of an even count), so that the figure is one the machine measured."""
    return sorted_times[len(sorted_times) // 2] if sorted_times else None


def reference_ms(run: RunDir, valid_only: bool = False) -> Optional[float]:
    """Median reference time over the run's successful measurements (`valid_only`: as in reference_times)."""
    return _median(reference_times(run, valid_only))


class ReferenceTimings(NamedTuple):
    """The reference's timings that counted, as `kscout show` and report.html give them."""

    median_ms: Optional[float]
    range_ms: Optional[tuple[float, float]]  # fastest and slowest, on a machine whose pace can drift
    count: int


def reference_timings(run: RunDir, kind: str) -> ReferenceTimings:
    """A replayed space (`kind` "space") has no drift to show, so no range."""
    refs = reference_times(run, valid_only=True)
    return ReferenceTimings(median_ms=_median(refs),
                            range_ms=(refs[0], refs[-1]) if kind == "problem" and len(refs) > 1 else None, count=len(refs))


def search_reference_ms(run: RunDir) -> Optional[float]:
    """The reference time a search forecasts against: over timings that counted, as `kscout show` reports it, so
    that a burst of load does not stretch every forecast's parent; over all of them while none has counted yet."""
    return reference_ms(run, valid_only=True) or reference_ms(run)


def config_sha(space: ReplaySpace, config: dict[str, Any]) -> str:
    text = json.dumps({k: config[k] for k in space.param_names}, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ReplayTarget:
    """A recorded brute-forced space. The reference is one configuration that compiles and runs,
    timed in the same (replayed) session as each candidate, exactly as a real measurement does."""

    def __init__(self, space: ReplaySpace, run: RunDir, seed: int = 0, dispatcher: Any = None):
        self.space, self.run = space, run
        self.dispatcher = dispatcher  # agent/dispatch.py: replay on scale-out workers instead of in this thread
        self.reference = drawn_reference(space, seed)
        if run.get_meta(REPLAY_REFERENCE_KEY) is None:  # what every speedup of the run is over, for `kscout show`
            run.set_meta(REPLAY_REFERENCE_KEY, json.dumps(self.reference, default=str))
        if space.notes and run.get_meta(SPACE_NOTES_KEY) is None:  # said once at the start; `kscout show` says it again
            run.set_meta(SPACE_NOTES_KEY, json.dumps(space.notes))
        self.name = space.name
        self.device = f"replay:{space.device_label}"

    def parent_info(self, parent: Optional[CandidateRecord], tried: set[str], shelved: AbstractSet[str] = frozenset(),
                    waiting: AbstractSet[str] = frozenset()) -> dict[str, Any]:
        # the reference configuration is timed in every measurement session, so it is never a candidate
        return {"config": dict(parent.params) if parent else None, "tried": tried, "shelved": shelved, "waiting": waiting,
                "sha": lambda cfg: config_sha(self.space, cfg), "reference_sha": config_sha(self.space, self.reference)}

    def proposal_sha(self, proposal) -> str:
        return config_sha(self.space, proposal.params)

    def measure(self, rec: CandidateRecord, repeat: str = "", again: bool = False) -> Measurement:
        """`again`: a new measurement even if this configuration was measured here (its first judged nothing)."""
        execute = self.dispatcher.replay(self.space, rec.params, self.reference) if self.dispatcher else None
        return measure_replay(self.space, rec.params, self.run, reference=self.reference, execute=execute, repeat=repeat, again=again)

    def stored_id(self, rec: CandidateRecord) -> Optional[int]:
        """The latest measurement of this candidate the run holds, which measuring it (not `again`) hands back."""
        if self.space.index_of(rec.params) is None:
            return None
        return stored_measurement_id(self.run, replay_record(self.space, rec.params, self.reference).key)

    def confirm(self, rec: CandidateRecord, label: str) -> Measurement:
        """A fresh replay of a chosen configuration (its own noise draw), under its own key."""
        return self.measure(rec, repeat=label)

    def recorded_measurement(self, rec: CandidateRecord) -> Optional[Measurement]:
        return recorded_measurement(self.run, rec.measurement_id)

    def headroom(self, rec: Optional[CandidateRecord]) -> Optional[float]:
        return None  # a recorded space has no FLOP/byte counts to bound it

    def below_speed_of_light(self, m: Measurement) -> Optional[str]:
        return None

    def at_speed_of_light(self, best: Optional[CandidateRecord], margin: float) -> bool:
        return False

    def best_time_ms(self, run_best: Optional[CandidateRecord]) -> Optional[float]:
        m = recorded_measurement(self.run, run_best.measurement_id) if run_best else None
        return m.runtime_ms if m else None

    @staticmethod
    def describe(path: Path) -> str:
        return f"recorded space {path.name}"


class CodeTarget:
    """A KernelBench problem measured for real in the sandbox, with speed-of-light bounds.

    A time below speed-of-light is suspect: it is measured again with more correctness trials,
    and stays out of "best" unless the second look is both correct and not below the bound.
    """

    def __init__(self, problem: Path, device: str, run: RunDir, pool: Any = None, harness: Any = None, dispatcher: Any = None):
        from kernelscout.sandbox.harness import HarnessConfig
        from kernelscout.tools import plugins

        self.problem, self.device, self.run, self.pool = Path(problem), device, run, pool
        # what the device measures on, and its name for the speed-of-light bound: an installed package's device
        # (tools/plugins.py) declares both; None for the bound's name means it has none
        self.kind, self.sol_device = plugins.device_kind(device)
        self.dispatcher = dispatcher  # agent/dispatch.py: measure on scale-out workers instead of `pool`
        self.harness = harness or HarnessConfig()
        self.name = problem_name(self.problem)
        self.bounds = self._load_bounds()

    def _load_bounds(self):
        from kernelscout.tools.sol import SolBounds, SolRequest, sol_bounds

        if self.run.get_meta("sol_dropped"):
            return None
        cached = self.run.get_meta("sol_bounds")
        if cached:
            return SolBounds.model_validate_json(cached) if cached != "unavailable" else None
        try:
            if self.sol_device is None:
                raise ValueError(f"the device {self.device!r} names no GPU (its factory's `gpu` attribute) to bound it by")
            bounds = sol_bounds(SolRequest(problem=str(self.problem), device=self.sol_device))
        except Exception as exc:  # a bound is guidance; the search runs without one
            self.run.event("sol_unavailable", reason=str(exc))
            self.run.set_meta("sol_bounds", "unavailable")
            return None
        self.run.set_meta("sol_bounds", bounds.model_dump_json())
        return bounds

    def parent_info(self, parent: Optional[CandidateRecord], tried: set[str], shelved: AbstractSet[str] = frozenset(),
                    waiting: AbstractSet[str] = frozenset()):
        """`shelved` and `waiting` are not used: the code policies never propose a candidate twice."""
        from kernelscout.agent.policies.tuner import ParentInfo

        return ParentInfo(
            id=parent.id if parent else 0,
            path=parent.path if parent else str(self.problem),
            is_reference=parent is None,
            problem_path=str(self.problem),
            device=self.kind,
            speedup=parent.speedup if parent else 1.0,
            tried_shas=set(tried),
        )

    def proposal_sha(self, proposal) -> str:
        return hashlib.sha256(proposal.source.encode()).hexdigest()

    def _measure_path(self, path: str, again: bool = False, trials: Optional[int] = None, repeat: str = "",
                      count_flops: bool = False) -> Measurement:
        from kernelscout.tools.measure import MeasureRequest, measure

        harness = self.harness if trials is None else self.harness.model_copy(update={"correctness_trials": trials})
        if count_flops:
            harness = harness.model_copy(update={"count_flops": True})
        return measure(MeasureRequest(problem=str(self.problem), candidate=path, device=self.device, run_dir=str(self.run.path),
                                      harness=harness, again=again, repeat=repeat), pool=self.pool,
                       execute=self.dispatcher.code if self.dispatcher else None)

    def measure(self, rec: CandidateRecord, again: bool = False) -> Measurement:
        m = self._measure_path(rec.path, again=again)
        if suspect := self.below_speed_of_light(m):
            self.run.event("suspect", candidate=rec.id, reason=suspect)
            # more trials, and the candidate's own FLOPs: a time under the reference's bound may be less work, honestly
            second = self._measure_path(rec.path, again=True, trials=max(10, 3 * self.harness.correctness_trials), count_flops=True)
            if second.status.value == "budget_exhausted":
                return m
            if less := self.less_work(second):  # the search's measure event says it too
                second.warnings.append(less)
            return second
        return m

    def stored_id(self, rec: CandidateRecord) -> Optional[int]:
        """The latest measurement of this candidate the run holds, which measuring it (not `again`) hands back."""
        if rec.path is None:
            return None
        key = code_key(str(self.problem), rec.path, self.device, scaled_out=self.dispatcher is not None)
        return stored_measurement_id(self.run, key)

    def confirm(self, rec: CandidateRecord, label: str) -> Measurement:
        """A fresh measurement of a chosen candidate, correctness included, under its own key; with its FLOPs counted
        where a bound holds, so that a best that does less work than the reference is judged on its own count again."""
        return self._measure_path(rec.path, repeat=label, count_flops=self.bounds is not None)

    def recorded_measurement(self, rec: CandidateRecord) -> Optional[Measurement]:
        return recorded_measurement(self.run, rec.measurement_id)

    @property
    def bound_is_datasheet(self) -> bool:
        """GPU bounds come from datasheet peaks; CPU peaks are measured, so a kernel can beat them."""
        return self.bounds is not None and self.bounds.device_key != "cpu"

    def headroom(self, rec: Optional[CandidateRecord]) -> Optional[float]:
        """Measured time over the floor; the floor drops the memory side when the data stays in cache."""
        if self.bounds is None:
            return None
        floor = self._floor_ms
        ms = reference_ms(self.run) if rec is None else (m.runtime_ms if (m := self.recorded_measurement(rec)) else None)
        return ms / floor if (ms and floor and floor > 0) else None

    def below_speed_of_light(self, m: Measurement) -> Optional[str]:
        """Why a time is suspect: under the reference's bound, and (where the candidate's own FLOPs were counted and
        are fewer) under the bound at its own count too; None when it can be believed."""
        reason = self._under_reference_bound(m)
        if reason and (own := self._own_bounds(m)) is not None:
            own_reason = self._under(m.runtime_ms, own)
            return None if own_reason is None else f"even at the candidate's own FLOP count: {own_reason}"
        if reason and m.flops_uncounted:
            reason += f"; its own FLOPs were not counted: {m.flops_uncounted}"
        return reason

    @property
    def _floor_ms(self) -> float:
        """The bound's floor: a GPU timing flushes caches, so the whole bound; a CPU one only the side cache leaves."""
        return self.bounds.time_ms if self.kind.startswith("cuda") else self.bounds.floor_ms

    @property
    def _margin(self) -> float:
        # measured CPU peaks can be low on a busy machine, so only a time far below them is suspect
        return 0.1 if self.bound_is_datasheet else 0.5

    def _under(self, ms: float, bounds) -> Optional[str]:
        """Why a time of `ms` is under `bounds` by more than the margin, or None."""
        from kernelscout.tools.sol import suspicious

        return suspicious(ms, bounds, margin=self._margin, cache_flushed=self.kind.startswith("cuda"))

    @property
    def forecast_floor_ms(self) -> Optional[float]:
        """The least time a forecast may give a candidate: the floor `below_speed_of_light` judges by, less the margin
        within which it still believes a measurement. A forecast floored at the bound itself ruled out times the search
        accepts: CPU peaks are measured, and on this VM conv2d_relu, linear_gelu and masked_mean ran at 0.67-0.8 of
        theirs, so every child of their best was forecast P(faster) 0.00 and 71-78 % of them measured faster."""
        if self.bounds is None:
            return None
        floor = self._floor_ms
        return floor * (1.0 - self._margin) if floor > 0 else None

    def _under_reference_bound(self, m: Measurement) -> Optional[str]:
        """The time against the reference's bound, which is dropped instead where the reference itself beats it."""
        if self.bounds is None or not m.runtime_ms or not m.timing_valid:
            return None
        # the reference's time as the candidate's worker reported it, the candidate could have written; the bound
        # is dropped only when the referee's own timing of the reference alone confirms it
        alone = m.reference_alone_ms
        if m.ref_runtime_ms and self._under(m.ref_runtime_ms, self.bounds) and alone and (wrong := self._under(alone, self.bounds)):
            self._drop_bounds(f"the reference itself, timed alone in a worker that never loaded a candidate: {wrong}")
            return None
        return self._under(m.runtime_ms, self.bounds)

    def _own_bounds(self, m: Measurement):
        """The bound at the candidate's own FLOP count, where one was counted and is below the reference's."""
        from kernelscout.tools.sol import with_flops

        if self.bounds is None or m.candidate_flops is None or m.candidate_flops >= self.bounds.flops:
            return None
        return with_flops(self.bounds, m.candidate_flops)

    def less_work(self, m: Measurement) -> Optional[str]:
        """What to tell a user of a time under the reference's bound that the candidate's own FLOPs explain."""
        from kernelscout.tools.sol import format_si

        if (own := self._own_bounds(m)) is None or not self._under_reference_bound(m) or self._under(m.runtime_ms, own):
            return None
        counted = (f"the candidate's own ({own.floor_ms:.4g} ms for the {format_si(own.flops, 'FLOP')} torch counted in a "
                   "checked call)" if own.flops else "the candidate's own count (torch's counter found no matmul, convolution "
                   "or attention FLOPs in a checked call: its work is matrix-vector or elementwise)")
        return (f"{m.runtime_ms:.4g} ms is under the reference's speed-of-light floor ({self.bounds.floor_ms:.4g} ms for "
                f"{format_si(self.bounds.flops, 'FLOP')}), and not under {counted}: it does less work than the reference "
                "(an algebraic simplification), so it counts")

    def _drop_bounds(self, why: str) -> None:
        """The reference is trusted code; a time of its own below the floor shows the bound is wrong for this
        problem (bfloat16 or int8 units faster than the fp32 peak a CPU bound is measured at, a FLOP count
        that misses how the work is done), so no candidate is held to it and it steers nothing."""
        if self.bounds is not None and self.bounds.device_key == "cpu":
            from kernelscout.tools.sol import forget_cpu_peaks

            forget_cpu_peaks()  # a measured peak the reference beats was measured low: the next bound measures it again
        self.bounds = None
        self.run.set_meta("sol_dropped", why)  # kept on resume; "sol_bounds" keeps the bound for the record
        self.run.event("sol_unavailable", reason=f"speed-of-light bound dropped: {why}")

    def at_speed_of_light(self, best: Optional[CandidateRecord], margin: float) -> bool:
        if not self.bound_is_datasheet:
            return False  # never stop on a measured CPU peak: it is not a hard bound
        h = self.headroom(best) if best else None
        return h is not None and h <= margin
