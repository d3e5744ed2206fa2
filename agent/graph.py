"""The search loop, as a LangGraph StateGraph. Read this file first.

    select_parent -> propose -> predict -> measure -> check --(continue)--> select_parent
                                   |                      \\--(stop)--> confirm -> END
                                   \\-- skip (recorded with its forecast, never measured)

Each iteration proposes several candidates, forecasts every one, and measures only the few the
decision rule of `predict` selects (promising or unsure), so far more candidates are considered
than measured. With several measurement workers (`--workers N`, `--ray`; agent/dispatch.py) the
rule's top N go out together and are recorded as each returns. The best of many noisy
measurements reads high (the winner's curse), so with `confirm` set the last measurements of the
budget re-measure the best once the search stops, and that re-measurement is what is reported.
Everything durable lives in the run directory: the archive and the ledger in run.db, LangGraph's
checkpoints in checkpoints.db (the latest only, once the search stops: agent/checkpoint_trim.py).
Each node is idempotent (content-addressed candidates, forecasts keyed by candidate and iteration,
measurements keyed by content and device), so replaying the node that a kill -9 interrupted
neither loses nor repeats a measurement.
"""

from __future__ import annotations

import math
import random
import shlex
import sqlite3
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, Callable, Optional, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from kernelscout.agent.checkpoint_trim import keep_latest_checkpoint
from kernelscout.agent.cold_start import cold_start_order, order_said
from kernelscout.agent.dispatch import InlineExecutor
from kernelscout.agent.policies.tuner import USER_ORIGIN
from kernelscout.agent.search_spec import SearchSettings
from kernelscout.agent.selection import Node, select
from kernelscout.agent.stops import (AT_SOL, BUDGET_SPENT, MACHINE_BUSY, NEAR_SOL, NOTHING_LEFT, PROBLEM_UNUSABLE,  # noqa: F401
                                     RUN_DIR_UNUSABLE, SOLVED, SOLVED_AFTER)
from kernelscout.sandbox.stats import BUSY_REASON
from kernelscout.tools.archive import ROOT_ID, Archive, CandidateRecord
from kernelscout.tools.budget import Budget
from kernelscout.tools.predict import CLEAR_WIN
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus

try:
    from kernelscout.agent.llm_pricing import BudgetExceeded as _LLMBudgetExceeded

    LLM_CAPS: tuple[type[BaseException], ...] = (_LLMBudgetExceeded,)
except ImportError:  # pragma: no cover
    LLM_CAPS = ()


BUSY_STREAK = 2  # void timings in a row that stop the search (MACHINE_BUSY)


class LoopState(TypedDict, total=False):
    iteration: int
    parent_id: int
    considered: list[int]
    to_measure: list[int]
    stop_reason: Optional[str]
    started: float
    last_improvement: int  # measurements used when the best last improved
    best_speedup: float
    dry_iterations: int  # consecutive iterations that had nothing to consider
    stop_limit: Optional[dict]  # {"setting": name in SearchSettings, "value": its value} when a user's limit stopped it
    # (and "chance", the surrogate's sum, when solved_chance did)
    stopped_at: float  # when the search last ended (after `confirm`); a search that goes on counts its wall clock from there
    policy_state: dict  # the policy's memory between iterations (`state_dict`), for a policy that has one


class SearchLoop:
    """Holds the non-serialisable collaborators (target, policy, predictor) around a compiled graph."""

    def __init__(self, run: RunDir, target: Any, policy: Any, predictor: Any, settings: SearchSettings,
                 on_event: Optional[Callable[[str, dict], None]] = None):
        self.run, self.target, self.policy, self.predictor, self.settings = run, target, policy, predictor, settings
        self.archive = Archive(run)
        self.budget = Budget(run)
        self.on_event = on_event or (lambda kind, data: None)
        self._last_note: Optional[str] = None  # the policy's last reason for dropping an answer
        self._ruled_out_while_dry: set[int] = set()  # candidates a forecast ruled out since the last one measured
        self._lay_dead_s = 0.0  # how long a killed search lay dead before this resume; `check` moves `started` by it
        self.workers = 1  # measurements in flight at once; see scale_out
        self._busy_streak = 0  # measurements in a row whose timing a busy machine voided (MACHINE_BUSY)
        self._rebuild_predictor()

    def scale_out(self, dispatcher: Any) -> None:
        """Measure on the dispatcher's workers (agent/dispatch.py), keeping one candidate in flight per worker."""
        self.target.dispatcher = dispatcher
        self.workers = dispatcher.size

    # -- nodes --------------------------------------------------------------------------------
    def select_parent(self, state: LoopState) -> LoopState:
        records = [r for r in self.archive.all() if r.state == "measured" and r.speedup]
        children: dict[Optional[int], int] = {}
        for r in self.archive.all():
            children[r.parent_id] = children.get(r.parent_id, 0) + 1
        # Only a datasheet bound may stop a lineage from growing: a measured CPU peak taken on a busy
        # machine can sit below what a good kernel reaches, and would freeze the search on the root.
        headroom = self.target.headroom if getattr(self.target, "bound_is_datasheet", False) else (lambda rec: None)
        nodes = [Node(ROOT_ID, 1.0, children.get(ROOT_ID, 0), headroom(None))]
        nodes += [Node(r.id, r.speedup, children.get(r.id, 0), headroom(r)) for r in records]
        if not getattr(self.policy, "grows_reference", True) and len(nodes) > 1:
            nodes = nodes[1:]  # a policy that only turns knobs (--rewrites none): the reference has none
        parent = select(nodes)
        self._emit("select_parent", parent=parent.id, speedup=parent.speedup)
        return {"parent_id": parent.id, "iteration": state.get("iteration", 0) + 1}

    def propose(self, state: LoopState) -> LoopState:
        iteration, parent_id = state["iteration"], state["parent_id"]
        parent = None if parent_id == ROOT_ID else self.archive.get(parent_id)
        rng = random.Random(f"{self.settings.seed}:{iteration}")
        # shelved: tried, but never judged, so a policy that ranks a whole space may propose them again; waiting: in the
        # loop's queue. Both are read from run.db, so that such a policy sees the same after a resume
        info = self.target.parent_info(parent, tried=self.archive.shas(), shelved=self.archive.shas("shelved"),
                                       waiting=self.archive.shas("proposed"))
        try:
            proposals = self.policy.propose(info, self.settings.proposals_per_iteration, rng)
        except LLM_CAPS as exc:
            return {"considered": [], **self._llm_cap_stop(exc)}
        notes = getattr(self.policy, "notes", None)
        while notes:  # why the policy dropped answers: said as it happens, and named if the search runs dry
            self._last_note = notes.pop(0)
            self._emit("policy_note", note=self._last_note)
        new_ids, revived = [], 0
        for p in proposals:
            sha = self.target.proposal_sha(p)
            rec = self.archive.add(sha, p.source, parent_id, p.origin, p.params, p.hypothesis, p.features, iteration)
            if rec.state == "proposed" and rec.id not in new_ids:  # a policy may propose one child twice: it is one candidate
                new_ids.append(rec.id)
                revived += rec.iteration != iteration  # shelved earlier, proposed again
        pending = [r.id for r in self.archive.all() if r.state == "proposed" and r.id not in new_ids]
        self._emit("propose", parent=parent_id, new=len(new_ids) - revived, revived=revived, pending=len(pending))
        out: LoopState = {"considered": new_ids + pending}
        if hasattr(self.policy, "state_dict"):
            out["policy_state"] = self.policy.state_dict()
        return out

    def predict(self, state: LoopState) -> LoopState:
        iteration = state["iteration"]
        incumbent = self._best_speedup()
        judged = []
        if state.get("stop_reason"):
            return {"to_measure": []}
        recs = [self.archive.get(cid) for cid in state.get("considered", [])]
        if (solved := self._solved()) and not any(rec.origin == USER_ORIGIN or rec.requeued for rec in recs):
            self._emit("stop", reason=solved)
            return {"to_measure": [], "stop_reason": solved,
                    "stop_limit": {"setting": "solved_chance", "value": self.settings.solved_chance,
                                   "chance": self.policy.chance_left}}
        try:
            forecasts = self.predictor.forecast_batch(recs, [self._speedup_of(r.parent_id) for r in recs], incumbent)
        except LLM_CAPS as exc:
            return {"to_measure": [], **self._llm_cap_stop(exc)}
        # the user's own kernels (--start) are measured whatever the forecast: they asked for them; so are those
        # a busy machine kept from being judged, which the search had chosen already
        given = [rec.id for rec in recs if rec.origin == USER_ORIGIN or rec.requeued]
        requeued = {rec.id for rec in recs if rec.requeued}
        for rec, forecast in zip(recs, forecasts):
            judged.append((rec.id, forecast, self.predictor.decide(forecast)))
        # highest priority first; among equals (e.g. cold start) a code policy's cold-start order (agent/cold_start.py),
        # then the policy's own order, oldest first
        cold = self._cold_order(recs)
        wanted = sorted(((self.predictor.priority(f), cold.get(cid, (0, 0.0)), -cid), cid)
                        for cid, f, d in judged if d.action == "measure" and cid not in given)[::-1]
        room = self._room()
        # batch selection: the rule's best, one per free worker, never more than the budget has room for
        per_iteration = len(wanted) if self.predictor.measure_all else max(self.settings.measure_per_iteration, self.workers)
        batch = max(per_iteration, len(given))
        if room is not None:
            batch = min(batch, room)
        chosen = (sorted(given) + [cid for _, cid in wanted])[:batch]
        dropped = {cid for _, cid in wanted[batch + self.settings.pending_limit:]}
        for cid, forecast, decision in judged:
            action, reason = decision.action, decision.reason
            if cid in given:
                why = "its timing was void (the machine was busy): timed again" if cid in requeued else "given with --start, measured"
                action, reason = ("measure" if cid in chosen else "defer"), f"{why} whatever the forecast ({reason})"
            elif cid in dropped:
                action, reason = "shelve", f"worth measuring ({reason}) but ranked below the {self.settings.pending_limit} kept for later"
            elif action == "measure" and cid not in chosen:
                action, reason = "defer", f"{reason}; kept for a later iteration (batch of {batch})"
            self.archive.record_forecast(cid, iteration, forecast.surrogate, forecast.model_dump(), action, reason)
        blind = [f for _, f, _ in judged if not f.informative]  # no forecast to go on: the log must not say one chose
        ruled_out = {cid for cid, f, d in judged if f.informative and d.action == "skip"}
        self._ruled_out_while_dry = set() if chosen else self._ruled_out_while_dry | ruled_out
        self._emit("predict", considered=len(judged), measure=chosen, total_considered=considered_count(self.archive),
                   uninformative=len(blind), why_uninformative=blind[0].rationale if blind else None,
                   order=f"this order: {order_said(recs)}" if cold else "the policy's order")
        return {"to_measure": chosen}

    def measure(self, state: LoopState) -> LoopState:
        """Measure the chosen candidates, `self.workers` at a time, and record each as it returns.

        The ledger reserves every measurement before it is dispatched, so the cap holds however the
        results interleave; a repair of a failed candidate joins the queue and takes the free worker.
        """
        progress = {"last_improvement": state.get("last_improvement", 0), "best_speedup": self._best_speedup()}
        queue, stop = list(state.get("to_measure", [])), None
        self._cap_stop = None  # set by a repair the LLM's cost cap refused: the queue is measured, then the search stops
        with ThreadPoolExecutor(self.workers, thread_name_prefix="measure") if self.workers > 1 else InlineExecutor() as pool:
            running: dict[Future, CandidateRecord] = {}
            while queue or running:
                while queue and len(running) < self.workers:
                    if (room := self._room(in_flight=len(running))) is not None and room <= 0:
                        # the rest is kept for re-measuring the best (or the cap is reached); but a measurement a kill
                        # kept from being recorded (stored, its candidate still proposed) is handed back free: take it up
                        queue = [cid for cid in queue if self._unrecorded(self.archive.get(cid))]
                        if not queue:
                            break
                    rec = self.archive.get(queue.pop(0))
                    if rec.state == "proposed":  # otherwise measured before a crash: its result is already recorded
                        # a candidate queued again after a busy machine is timed anew (the measure tool would
                        # otherwise hand back its recorded, void result), unless a kill kept that new timing unrecorded
                        again = {"again": True} if rec.requeued and not self._unrecorded(rec) else {}
                        running[pool.submit(self.target.measure, rec, **again)] = rec
                done, _ = wait(running, return_when=FIRST_COMPLETED) if running else (set(), None)
                for future in done:
                    rec, m = running.pop(future), future.result()
                    if m.status == MeasureStatus.budget_exhausted:
                        self._emit("budget_exhausted", candidate=rec.id)
                        stop, queue = BUDGET_SPENT, []
                        continue
                    if m.status == MeasureStatus.run_dir_unusable:  # nothing ran: the candidate stays queued for a resume
                        stop, queue = stop or f"{RUN_DIR_UNUSABLE}: {m.message}", []
                        continue
                    if m.status == MeasureStatus.invalid_problem and stop is None:
                        stop, queue = f"{PROBLEM_UNUSABLE}: {m.message}", []
                    busy = _busy_machine(m)
                    if m.status == MeasureStatus.ok:
                        self._busy_streak = self._busy_streak + 1 if busy else 0
                        if self._busy_streak >= BUSY_STREAK and stop is None:
                            stop, queue = (f"{MACHINE_BUSY}: {self._busy_streak} measurements in a row were timed while other processes "
                                           "held the worker's cores, so their timings are void; resume the run when it is idle "
                                           "(candidates whose timings were void are timed again first)"), []
                    repaired = self._record(rec, m, progress, state["iteration"])
                    if repaired is not None and stop is None:
                        queue.insert(0, repaired)
                    if m.status == MeasureStatus.ok:
                        self._retime_after_burst(rec, busy, stopped=stop is not None)
        if stop:
            return {**progress, "stop_reason": stop}
        return {**progress, **self._cap_stop} if self._cap_stop else progress

    def _retime_after_burst(self, rec: CandidateRecord, busy: bool, stopped: bool) -> None:
        """A burst of load that voided fewer timings than stop the search (MACHINE_BUSY): once a timing is valid
        again, the candidates it voided go back to the queue, once each (a new measurement each), and the next
        iteration times them whatever their forecast; they were chosen and never judged. The voided ones are
        read from the ledger, so a kill (or a spent budget) between the void and the valid timing loses no
        retry. A streak that stops the search is left to the resume (`_requeue_busy`)."""
        if busy or stopped:
            return
        once = [cid for cid, times in self.archive.void_timings(BUSY_REASON) if times == 1]
        for cid in once:
            self.archive.requeue(cid)
        if once:
            self._emit("requeue", candidates=once, reason="timing void: the machine was busy for a moment")

    def _record(self, rec: CandidateRecord, m: Measurement, progress: dict, iteration: int) -> Optional[int]:
        """Archive one measurement, teach the predictor, track the best; returns a repaired candidate to measure."""
        suspect = self.target.below_speed_of_light(m)
        self.archive.record_measurement(rec.id, m, suspect=bool(suspect))
        self.predictor.observe(self.archive.get(rec.id), m, parent_speedup=self._speedup_of(rec.parent_id))
        ledger = self._ledger_numbers()
        used = ledger["used"]
        if m.speedup and m.timing_valid and m.correct and not suspect and m.speedup > progress["best_speedup"]:
            progress.update(best_speedup=m.speedup, last_improvement=used)
        less_work = getattr(self.target, "less_work", None)  # code problems: a time under the reference's bound, explained
        self._emit("measure", candidate=rec.id, status=m.status.value, speedup=m.speedup, timing_valid=m.timing_valid, why=m.unusable_reason,
                   suspect=suspect or None, less_work=(less_work(m) if less_work and not suspect else None) or None,
                   **ledger, best=progress["best_speedup"])
        return self._repair(rec, m, iteration)

    def _repair(self, rec: CandidateRecord, m: Measurement, iteration: int) -> Optional[int]:
        """Give a policy that can repair (the LLM) one more try at a candidate that failed to build or was wrong."""
        if not hasattr(self.policy, "repair") or m.status not in (MeasureStatus.compile_error, MeasureStatus.incorrect, MeasureStatus.runtime_error):
            return None
        if not rec.path:
            return None
        lineage = str(rec.params.get("repair_of", rec.id))
        parent = None if rec.parent_id in (None, ROOT_ID) else self.archive.get(rec.parent_id)
        info = self.target.parent_info(parent, tried=self.archive.shas())
        from pathlib import Path

        try:
            fixed = self.policy.repair(Path(rec.path).read_text(), m.status.value, m.message, info, lineage)
        except LLM_CAPS as exc:
            self._cap_stop = self._llm_cap_stop(exc)
            return None
        if fixed is None:
            return None
        params = dict(fixed.params, repair_of=int(lineage))
        new = self.archive.add(self.target.proposal_sha(fixed), fixed.source, rec.parent_id, fixed.origin, params,
                               fixed.hypothesis, fixed.features, iteration)
        if new.state != "proposed":
            return None
        forecast = self.predictor.forecast(new, parent_speedup=self._speedup_of(new.parent_id), incumbent_speedup=self._best_speedup())
        self.archive.record_forecast(new.id, iteration, forecast.surrogate, forecast.model_dump(), "measure",
                                     f"repair of #{rec.id} ({m.status.value}), which the rule had chosen to measure")
        self._emit("repair", failed=rec.id, repaired=new.id, status=m.status.value)
        return new.id

    def check(self, state: LoopState) -> LoopState:
        if state.get("stop_reason"):
            return {}
        status = self.budget.status()
        s = self.settings
        reason, limit = None, None
        remaining = self._remaining()
        started, moved = state.get("started", time.time()) + self._lay_dead_s, bool(self._lay_dead_s)
        self._lay_dead_s = 0.0
        if remaining is not None and remaining <= self._reserve():
            reason = BUDGET_SPENT
        elif s.max_wall_s and time.time() - started > s.max_wall_s:
            reason, limit = f"wall-clock limit of {s.max_wall_s:g} s reached", "max_wall_s"
        elif s.patience and status.used - state.get("last_improvement", 0) >= s.patience:
            reason, limit = f"no new best in {s.patience} measurements", "patience"
        elif self.target.at_speed_of_light(self.archive.best(), s.sol_margin):
            reason = AT_SOL
        elif s.max_device_s and self._device_seconds() >= s.max_device_s:
            reason, limit = f"device-time budget of {s.max_device_s:g} s spent", "max_device_s"
        elif status.cap and status.used >= math.ceil(status.cap / 2) and self._near_sol(s.near_sol):
            reason = f"within {s.near_sol:g}x {NEAR_SOL}"
        dry = state.get("dry_iterations", 0) + 1 if not state.get("to_measure") else 0
        if reason is None and dry >= 3:
            reason = NOTHING_LEFT
            if self._ruled_out_while_dry:  # not a space used up: the surrogate ruled the candidates out
                reason += (f": the surrogate judged the last {len(self._ruled_out_while_dry)} candidates proposed unlikely to beat "
                           "the best (--surrogate none measures what the policy proposes)")
            if self._last_note:
                reason += f"; last: {self._last_note}"
        if reason:
            self._emit("stop", reason=reason)
        update: LoopState = {"stop_reason": reason, "dry_iterations": dry,
                             "stop_limit": {"setting": limit, "value": getattr(s, limit)} if limit else None}
        if moved:
            update["started"] = started
        return update

    def confirm(self, state: LoopState) -> LoopState:
        """Re-measure the best with the measurements kept back for it: the number reported is then not the
        lucky draw that made it the best. A re-measurement that is wrong, has an invalid timing or falls below
        speed-of-light takes the candidate out of "best", and the next slot goes to the new best.

        Each slot's label names the cap it belongs to, so raising the cap and resuming confirms again,
        and replaying this node after a kill finds the slots already spent instead of spending them twice.
        """
        cap = self.budget.status().cap
        for slot in range(self.settings.confirm):
            label = f"confirm:{cap}:{slot}"
            if self.archive.confirmation(label) is not None:
                continue
            best = self.archive.best()
            if best is None or (self.archive.reported_speedup(best) or 0.0) <= 1.0:
                break  # nothing beat the reference: there is no claim to check
            # each attempt at a slot is a measurement of its own (a void one is not handed back when the slot is
            # tried again); counted from the record, so a replay after a kill finds the same attempt's result
            attempt = self.archive.void_confirmations(label)
            m = self.target.confirm(best, label if attempt == 0 else f"{label}:again:{attempt}")
            if m.status == MeasureStatus.budget_exhausted:
                self._emit("confirm_skipped", candidate=best.id, reason="no budget left to re-measure the best")
                break
            if m.status == MeasureStatus.run_dir_unusable:  # nothing ran, nothing charged: the slot waits for a resume
                self._emit("confirm_skipped", candidate=best.id, reason=m.message)
                break
            suspect = self.target.below_speed_of_light(m)
            ok = bool(m.status == MeasureStatus.ok and m.correct and m.timing_valid and m.speedup and not suspect)
            # timed while the machine was busy: that judged nothing, so the best stays as it was, and the slot
            # stays open (recorded under a label of its own): a further slot re-measures it now, a resume later
            void = m.timing_voided and _busy_machine(m)
            self.archive.record_confirmation(f"{label}:void:{attempt}" if void else label, best.id, m, ok, void=void)
            self._emit("confirm", candidate=best.id, status=m.status.value, speedup=m.speedup, search_speedup=best.speedup,
                       ok=ok, void=void or None, suspect=suspect or None, why=None if ok else suspect or m.unusable_reason,
                       **self._ledger_numbers())
        return {"stopped_at": time.time()}

    # -- helpers ------------------------------------------------------------------------------
    def _ledger_numbers(self) -> dict:
        """What progress shows of the ledger: the cap too, which `kscout budget --set` may raise mid-search."""
        status = self.budget.status()
        return {"used": status.used, "cap": status.cap}

    def _unrecorded(self, rec: CandidateRecord) -> bool:
        """Whether the run holds a measurement of this queued candidate that its record does not: stored, and then a
        kill came before the search recorded it (its first timing, or the new one after a busy machine voided it).
        Measuring it hands that back free, so it is taken up even with no room left."""
        if rec.state != "proposed":
            return False
        latest = self.target.stored_id(rec)
        return latest is not None and latest != rec.measurement_id

    def _remaining(self) -> Optional[int]:
        """The cap less what is spent, counting a measurement a killed run left in flight as not yet spent: it
        is taken up again without a new charge, and with the cap full it would otherwise never be."""
        remaining = self.budget.status().remaining
        return None if remaining is None else remaining + self.budget.adoptable()

    def _room(self, in_flight: int = 0) -> Optional[int]:
        """Measurements the search may still start: the cap, less those spent or in flight, less the reserve."""
        remaining = self._remaining()
        return None if remaining is None else max(remaining - in_flight - self._reserve(), 0)

    def _reserve(self) -> int:
        """Measurements the search leaves for `confirm`: none until some candidate beats the reference."""
        if not self.settings.confirm or self._best_speedup() <= 1.0:
            return 0
        # slots of this cap already spent (a resume after the search stopped) need nothing kept back for them
        return max(0, self.settings.confirm - self.archive.confirmations_spent(self.budget.status().cap))

    def _solved(self) -> Optional[str]:
        """The stop for a recorded space the surrogate deems solved, decided from this iteration's screen before
        anything is measured: a search resumed after it (a budget raised, say) then spends nothing to stop again.
        Not before `SOLVED_AFTER` measurements: the chance is only as good as the surrogate's spread, which a handful
        of timings of a flat space make small everywhere, a lone fast configuration included."""
        chance, below = getattr(self.policy, "chance_left", None), self.settings.solved_chance
        if chance is None or chance >= below or self.budget.status().used < SOLVED_AFTER:
            return None
        return (f"{SOLVED}: the surrogate gives the configurations left a {chance * 100:.3g} % chance, together, of beating "
                f"the best by more than {CLEAR_WIN * 100:g} %, under the {below * 100:.3g} % it stops at (--solved-chance {below:g}); "
                f"`kscout resume {shlex.quote(str(self.run.path))} --solved-chance 0` measures on to the budget")

    def _llm_cap_stop(self, exc: BaseException) -> dict:
        """The stop for an LLM call the run's cost cap refused (before it was sent), with the setting it hit."""
        self._emit("llm_cap", reason=str(exc))
        setting = "max_llm_tokens" if getattr(exc, "cap", None) == "tokens" else "max_usd"
        # the cap's own message names it ("LLM token cap reached: ...", "LLM spending cap reached: ..."); the kind is in stop_limit
        return {"stop_reason": str(exc), "stop_limit": {"setting": setting, "value": getattr(self.settings, setting)}}

    def _requeue_busy(self) -> None:
        """Candidates whose timing a busy machine voided were never judged: the stop told the user to resume
        when the machine is idle, so they go back to the queue and are timed again (a new measurement each)."""
        requeued = [cid for cid, _ in self.archive.void_timings(BUSY_REASON)]
        for cid in requeued:
            self.archive.requeue(cid)
        if requeued:
            self._emit("requeue", candidates=requeued, reason="timing void: the machine was busy")

    def _limit_raised(self, values: dict) -> Optional[str]:
        """What now lets a finished search go on: its ledger has room again after the budget ran out
        (`kscout budget DIR --set N`), or the limit that stopped it was raised or lifted (`kscout resume
        DIR --max-usd X`, ...). None if nothing did."""
        if (values.get("stop_reason") or "").startswith(MACHINE_BUSY):
            remaining = self._remaining()  # no room to time the void candidates again: they stay listed as they are
            return "resumed after the machine was busy" if remaining is None or remaining > 0 else None
        if values.get("stop_reason") == BUDGET_SPENT:
            remaining = self._remaining()
            return f"budget raised to {self.budget.status().cap}" if remaining is None or remaining > 0 else None
        limit = values.get("stop_limit") or {}
        setting = limit.get("setting")
        if setting not in SearchSettings.model_fields:
            return None
        now, then = getattr(self.settings, setting), limit.get("value")
        if then is None:
            return None
        if setting == "solved_chance":  # the one limit a lower value loosens (0: never stop for it)
            if now >= then or self._still_solved(values):
                return None
            chance = limit.get("chance")
            return f"solved_chance lowered from {then:g} to {now:g}" + (f", under the {chance * 100:.3g} % chance it stopped on"
                                                                          if chance is not None else "")
        if not now or now > then:  # None, and patience 0, mean "no limit"
            return f"{setting} raised from {then} to {now or 'no limit'}"
        return None

    def _still_solved(self, values: dict) -> Optional[str]:
        """Why a solved search resumed with a lower --solved-chance does not go on: the chance it stopped on is under
        the new value too. Nothing was measured after the stop, so that chance still stands. The resume's replay
        (`_rebuild_predictor`) gives the same figure when the search measured one candidate at a time; it can give
        another when several were measured at once (`--workers`: one fit for each batch, where the replay fits after
        each measurement; reasoned from the code, not measured). Said when it stays stopped, or the user would read the
        stop's old threshold and wonder."""
        limit = values.get("stop_limit") or {}
        now, then, chance = self.settings.solved_chance, limit.get("value"), limit.get("chance")
        if limit.get("setting") != "solved_chance" or then is None or chance is None or not chance < now < then:
            return None
        return (f"still solved: the {chance * 100:.3g} % chance it stopped on is under the {now * 100:.3g} % now set; "
                f"`kscout resume {shlex.quote(str(self.run.path))} --solved-chance 0` measures on to the budget")

    def _near_sol(self, factor: float) -> bool:
        if not getattr(self.target, "bound_is_datasheet", False):
            return False
        best = self.archive.best()
        headroom = self.target.headroom(best) if best else self.target.headroom(None)
        return headroom is not None and headroom <= factor

    def _device_seconds(self) -> float:
        """Measurement time spent on the device, from the supervisor's wall clock of each charged measurement."""
        import json as _json

        with self.run.connect() as db:
            rows = db.execute("SELECT result_json FROM measurements WHERE charged = 1").fetchall()
        return sum(_json.loads(r[0]).get("wall_s") or 0.0 for r in rows)

    def _best_speedup(self) -> float:
        """The speedup to beat. The reference is a kernel too: a search whose candidates so far all ran slower
        than it still has the reference's 1.0 to beat, not its least slow candidate's 0.66."""
        best = self.archive.best()
        return max(1.0, (self.archive.reported_speedup(best) or 1.0) if best else 1.0)

    def _cold_order(self, recs: list[CandidateRecord]) -> dict[int, tuple[int, float]]:
        if not getattr(self.policy, "grows_the_best_first", False):
            return {}  # a recorded space's design, or a plugin's order, is deliberate: kept as proposed
        everything = self.archive.all()
        speedups = {r.id: r.speedup or 1.0 for r in everything}
        return cold_start_order(recs, everything, lambda pid: 1.0 if pid in (None, ROOT_ID) else speedups.get(pid, 1.0))

    def _speedup_of(self, candidate_id: Optional[int]) -> float:
        if candidate_id in (None, ROOT_ID):
            return 1.0
        rec = self.archive.get(candidate_id)
        return rec.speedup or 1.0

    def _rebuild_predictor(self) -> None:
        """The predictor learns online; after a resume, replay what the archive measured so it knows the same: in the
        order measured, each measurement followed by the fit the search made before its next forecast. Fitted once on
        everything instead, the learned surrogate (which cross-fits on a schedule and refreshes in between) gave other
        forecasts: on the tests' V-shaped space the chance left that had stopped a solved search came back changed by
        factors (0.093 % as 0.144 %, 2.70 % as 14.8 %), and a search resumed after its budget ran out measured on where
        the uninterrupted search stopped as solved (seeds 2 and 3, docs/search_experiments.md). Costs a fit per
        measurement: about 6 s for 100 measurements of gemm_RTX_3090."""
        measured = [rec for rec in self.archive.all()
                    if rec.state in ("measured", "failed", "suspect", "unconfirmed") and rec.measurement_id is not None]
        for rec in sorted(measured, key=lambda r: r.measurement_id):
            m = self.target.recorded_measurement(rec)
            if m is not None:
                self.predictor.observe(rec, m, parent_speedup=self._speedup_of(rec.parent_id))
                self.predictor.catch_up()

    def _emit(self, kind: str, **data: Any) -> None:
        self.run.event(kind, **data)
        self.on_event(kind, data)

    # -- graph --------------------------------------------------------------------------------
    def build(self, checkpointer: SqliteSaver):
        g = StateGraph(LoopState)
        g.add_node("select_parent", self.select_parent)
        g.add_node("propose", self.propose)
        g.add_node("predict", self.predict)
        g.add_node("measure", self.measure)
        g.add_node("check", self.check)
        g.add_node("confirm", self.confirm)
        g.add_edge(START, "select_parent")
        g.add_edge("select_parent", "propose")
        g.add_edge("propose", "predict")
        g.add_edge("predict", "measure")
        g.add_edge("measure", "check")
        g.add_conditional_edges("check", lambda s: "confirm" if s.get("stop_reason") else "select_parent")
        g.add_edge("confirm", END)
        return g.compile(checkpointer=checkpointer)

    def _restore_policy(self, snapshot: Any) -> None:
        """A resumed search's policy is new: it takes up the memory the last `propose` left. A kill after that step
        and before its checkpoint leaves the step's writes saved; LangGraph 1.2's live snapshot applies them to
        `values`, and a snapshot that lists the step as a task with its result instead is read here as well."""
        if not hasattr(self.policy, "load_state_dict"):
            return
        saved = (snapshot.values or {}).get("policy_state")
        for task in snapshot.tasks:
            result = getattr(task, "result", None)
            if task.name == "propose" and isinstance(result, dict) and result.get("policy_state"):
                saved = result["policy_state"]
        if saved:
            self.policy.load_state_dict(saved)

    def run_to_end(self, resume: bool = False) -> LoopState:
        conn = sqlite3.connect(self.run.path / "checkpoints.db", check_same_thread=False)
        try:
            graph = self.build(SqliteSaver(conn))
            config = {"configurable": {"thread_id": "search"}, "recursion_limit": 1_000_000}
            snapshot = graph.get_state(config)
            # A step whose node finished but whose checkpoint a kill prevented shows up in `tasks`
            # (with its writes saved) and not in `next`: it is unfinished work, not the end.
            unfinished = bool(snapshot.next or snapshot.tasks)
            self._restore_policy(snapshot)
            if unfinished or not snapshot.values:
                for note in getattr(self.predictor, "notes", ()):
                    self._emit("surrogate_note", note=note)
            if resume and unfinished:
                # the wall clock (--max-wall) does not count the time the killed search lay dead: from its
                # last checkpoint (at most one step before the kill) to now
                if snapshot.created_at:
                    self._lay_dead_s = max(0.0, time.time() - datetime.fromisoformat(snapshot.created_at).timestamp())
                final = graph.invoke(None, config, durability="sync")
            elif resume and snapshot.values and (why := self._limit_raised(snapshot.values)):
                # go on from where the search stopped, with its archive, iteration count and best
                self._emit("continue", reason=why)
                if (snapshot.values.get("stop_reason") or "").startswith(MACHINE_BUSY):
                    self._requeue_busy()
                restart: dict[str, Any] = {"stop_reason": None, "stop_limit": None, "dry_iterations": 0}
                values = snapshot.values
                if values.get("stopped_at") and values.get("started"):
                    # the wall clock (--max-wall) goes on from where the search stopped: the time the run lay
                    # finished is not the search's, or a limit it never reached would stop it at once
                    restart["started"] = time.time() - (values["stopped_at"] - values["started"])
                final = graph.invoke(restart, config, durability="sync")
            elif snapshot.values and not unfinished:
                final = snapshot.values  # already finished
                if resume and (still := self._still_solved(final)):
                    self._emit("stop", reason=still)
            else:
                final = graph.invoke({"iteration": 0, "started": time.time(), "last_improvement": 0}, config, durability="sync")
            keep_latest_checkpoint(conn, "search")  # after a clean stop only: a kill or Ctrl-C leaves them to the next
        finally:
            conn.close()
        return final


def _busy_machine(m: Measurement) -> bool:
    """The measurement ran, but other processes held the worker's cores, so its timing judged nothing."""
    return m.status == MeasureStatus.ok and (m.timing_invalid_reason or "").startswith(BUSY_REASON)


def considered_count(archive: Archive) -> int:
    """Distinct candidates that got a forecast (and so were considered for measurement)."""
    with archive.run.connect() as db:
        return db.execute("SELECT COUNT(DISTINCT candidate_id) FROM forecasts").fetchone()[0]


def considered_per_measurement(archive: Archive, used: int) -> float:
    considered = considered_count(archive)
    return considered / used if used else float(considered)
