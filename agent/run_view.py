"""A look at a run directory after the fact, read only: what was searched, what it found, what it cost,
and how the forecasts that chose the measurements compare with those measurements.

`kscout show` renders it; `--json` prints it. Nothing here starts a worker, spends budget or writes
to the run directory (the report is rewritten only when asked), so it is safe on a run that another
process is still searching.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from kernelscout.agent.llm_pricing import CHAT_USAGE_META, RUN_USAGE_META, UsageState, stored_usage
from kernelscout.agent.stops import Stop, recorded_stop
from kernelscout.tools.archive import ROOT_ID, Archive, CandidateRecord
from kernelscout.tools.budget import Budget
from kernelscout.tools.claim_check import plan_claim
from kernelscout.tools.forecast_check import ForecastCheck, check_forecasts, deciding_forecasts
from kernelscout.tools.measure import MeasuredFile, measured_files
from kernelscout.tools.rundir import RunDir, RunDirError, read_events
from kernelscout.tools.runlock import holder
from kernelscout.tools.schema import BudgetStatus, Measurement


class RunViewError(ValueError):
    """The path is not something `kscout show` can read; the message says what to give instead."""


class CandidateRow(BaseModel):
    id: int
    parent: str = Field(description="'ref' for the problem's reference, else #id")
    origin: str
    params: dict[str, Any] = Field(default_factory=dict)
    changed: dict[str, Any] = Field(default_factory=dict, description="params whose value differs from the parent's (all of them for a child of the reference)")
    state: str
    speedup: Optional[float] = Field(None, description="reported speedup over the reference: the median of its "
                                     "re-measurements where it has any, else its one measurement")
    search_speedup: Optional[float] = Field(None, description="the measurement the search saw")
    remeasured: list[float] = Field(default_factory=list)
    remeasured_uncounted: list[str] = Field(default_factory=list, description="why each of its re-measurements that "
                                            "did not count failed (one a busy machine voided leaves it as it was)")
    over_parent: Optional[float] = Field(None, description="the measurement the search saw over its parent's (the parent's "
                                         "search measurement; 1 for the reference): what expected_speedup forecast")
    expected_speedup: Optional[float] = Field(None, description="the forecast it was measured on: expected speedup over its parent")
    p_faster: Optional[float] = None
    decision: str = ""
    hypothesis: str = Field("", description="why the policy proposed it")
    claimed_speedup: Optional[float] = Field(None, description="the speedup over its parent its LLM plan expected (never measured; "
                                             "scored in forecast_check.plan_claims)")


class FailedRow(BaseModel):
    id: int
    status: str = Field(description="the measurement's status, or 'timing not valid' for a correct one whose timing was void")
    why: str = Field(description="the measurement's message, or what voided its timing")
    file: Optional[str] = Field(None, description="the candidate's kernel file in the run directory (None for a configuration)")
    params: dict[str, Any] = Field(default_factory=dict, description="its tunable parameters or configuration")

    def candidate(self, run_dir: Path | str) -> str:
        """The file to open, relative to the run directory it lies in, or else the configuration measured."""
        if self.file:
            path = Path(self.file)
            return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else self.file
        return ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"


class RunView(BaseModel):
    run_dir: str
    kind: Optional[str] = Field(None, description="problem or space; None when the directory holds no search")
    target: Optional[str] = None
    device: Optional[str] = None
    policy: Optional[str] = None
    surrogate: Optional[str] = None
    status: str = Field(description="finished, failed (the problem could not be measured), running (a live process holds "
                        "the run), unfinished (interrupted), or no search")
    running: Optional[str] = Field(None, description="the process searching in the run now, when one is")
    stop_reason: Optional[str] = None
    stop: Optional[Stop] = Field(None, description="the stop's kind (solved, budget, limit, ...), as `kscout optimize --json` gives it")
    continue_with: Optional[str] = Field(None, description="the command that searches on, as the finished search printed it")
    budget: BudgetStatus
    states: dict[str, int] = Field(default_factory=dict, description="candidates by state")
    considered: int = 0
    considered_per_measurement: float = 0.0
    best: Optional[CandidateRow] = None
    best_file: Optional[str] = None
    top: list[CandidateRow] = Field(default_factory=list, description="candidates with a measured speedup, fastest first "
                                    "(suspect and unconfirmed ones too, named by their state)")
    seed: Optional[int] = Field(None, description="the search's --seed")
    reference: Optional[str] = Field(None, description="what the speedups are over: the problem's Model, or the configuration "
                                     "of a recorded space that the run's seed drew")
    reference_ms: Optional[float] = Field(None, description="the reference's time, median over the run's measurements")
    reference_range_ms: Optional[tuple[float, float]] = Field(None, description="on a code problem, the fastest and slowest "
                                                              "of those timings: how far the machine's pace moved over the run")
    reference_timings: int = Field(0, description="how many timings of the reference reference_ms is the median of")
    space_notes: list[str] = Field(default_factory=list, description="what the recorded space's file says that the search "
                                   "did not replay as written (an objective it does not follow, times for equal work, records with no "
                                   "time), as the search found it")
    surrogate_notes: list[str] = Field(default_factory=list, description="that the LLM surrogate asked for gave no usable "
                                       "forecast at all, so candidates were measured in the policy's order")
    best_runtime_ms: Optional[float] = Field(None, description="the best's time (of its re-measurements, where it has any)")
    best_reference_ms: Optional[float] = Field(None, description="the reference's time in the best's own measurements (the "
                                               "same ones as best_runtime_ms): best_reference_ms / best_runtime_ms is its speedup")
    remeasurements: int = Field(0, description="re-measurements of the best after the search (--confirm), counted or not")
    measured_again: int = Field(0, description="measurements of a candidate measured before in this run: after a void timing "
                                "(a busy machine) or a time below the speed-of-light floor; re-measurements of the best apart")
    failed: int = Field(0, description="candidates whose measurement did not count (failed, or timing not valid)")
    failures: list[FailedRow] = Field(default_factory=list, description="the latest of them, newest first")
    forecast_check: Optional[ForecastCheck] = None
    report: Optional[str] = None
    llm_usage: Optional[UsageState] = Field(None, description="the search's LLM calls: tokens, USD, the caps they ran under "
                                            "and the models counted at $0 for want of a price; None when it made none")
    chat_llm_usage: Optional[UsageState] = Field(None, description="the same for `kscout chat`'s own calls in this run directory")
    measured_files: list[MeasuredFile] = Field(default_factory=list, description="each file measured directly (kscout "
                                               "measure, MCP, chat) with its latest measurement; in a search's folder, which "
                                               "refuses them since 2026-12-06, those an earlier version let in")


def open_run(path: str | Path, read_only: bool = True) -> RunDir:
    """A run directory that exists; never creates one (RunDir would, for a mistyped path). Read-only unless
    asked: reading a run must work in a folder one cannot write to, and must not change it."""
    from kernelscout.agent.headless import is_headless_run

    p = Path(path)
    if is_headless_run(p):
        raise RunViewError(f"{p} is a multi-problem run (kscout run): `kscout show {p}` prints its summary; "
                           f"one problem's search is in {p / 'problems' / 'NAME'}")
    if not (p / "run.db").is_file():
        where = "does not exist" if not p.exists() else "holds no run.db"
        raise RunViewError(f"{p} {where}: give the run directory that `kscout optimize` printed (default runs/<problem>-<time>)")
    try:
        run = RunDir(p, read_only=read_only)
        with run.connect():  # opened now, so a database that cannot be read is this error, not a traceback later
            pass
    except RunDirError as exc:
        raise RunViewError(str(exc)) from None
    return run


def finished_event(folder: Path) -> Optional[dict]:
    """A search folder's last `finished` event, unless a measurement was logged after it (a resume still running
    or killed)."""
    last = None
    for e in read_events(Path(folder) / "events.jsonl"):
        if e.get("event") == "finished":
            last = e
        elif e.get("event") in ("measure", "confirm") and last is not None:
            last = None
    return last


def _row(archive: Archive, rec: CandidateRecord, deciding: dict[int, dict]) -> CandidateRow:
    f = deciding.get(rec.id)
    parent_rec = archive.get(rec.parent_id) if rec.parent_id not in (None, ROOT_ID) else None
    parent = parent_rec.params if parent_rec else {}
    changed = {k: v for k, v in rec.params.items() if k not in parent or parent[k] != v}
    parent_speedup = parent_rec.speedup if parent_rec else 1.0  # as forecast_check scores it
    fc = f["forecast"] if f and f["forecast"].get("informative") else {}
    return CandidateRow(
        id=rec.id, parent="ref" if rec.parent_id in (None, ROOT_ID) else f"#{rec.parent_id}", origin=rec.origin,
        params=rec.params, changed=changed, state=rec.state, speedup=archive.reported_speedup(rec), search_speedup=rec.speedup,
        remeasured=[sp for _, sp in archive.confirmations(rec.id)], remeasured_uncounted=archive.uncounted_confirmations(rec.id),
        over_parent=rec.speedup / parent_speedup if rec.speedup and parent_speedup else None,
        expected_speedup=fc.get("expected_speedup"),
        p_faster=fc.get("p_faster"), decision=(f or {}).get("reason") or "", hypothesis=rec.hypothesis,
        claimed_speedup=plan_claim(rec),
    )


def clip(text: str, width: int) -> str:
    """`text` in at most `width` characters, saying that it was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def what_changed(params_text: str, hypothesis: str, claim: Optional[float], width: int) -> str:
    """A candidate's change in `width` characters: its params; for code with none (an LLM's, a rewrite's), its
    hypothesis and its plan's claim, as `kscout show` and report.html both list it."""
    if params_text:
        return clip(params_text, width)
    said = f" (expected {claim:.2f}x over parent)" if claim is not None else ""
    return clip(hypothesis, width - len(said)) + said


def reference_of(run: RunDir, spec: Any) -> str:
    """What the run's speedups are over. A recorded space's configuration is kept in the run since 2026-12-04; for
    an older run it is drawn again from the space and the seed, as the search drew it."""
    from kernelscout.agent.targets import REPLAY_REFERENCE_KEY, drawn_reference

    if spec.kind != "space":
        return "the problem's Model"
    drawn = run.get_meta(REPLAY_REFERENCE_KEY)
    if drawn is not None:
        config = json.loads(drawn)
    else:
        from kernelscout.sandbox.replay import ReplaySpace

        try:
            config = drawn_reference(ReplaySpace.load(spec.path, spec.objective), spec.settings.seed)
        except (OSError, ValueError):
            config = None
    text = ", ".join(f"{k}={v}" for k, v in config.items()) if config else f"not recorded ({spec.path} cannot be read)"
    return f"the configuration --seed {spec.settings.seed} drew: {text}"


def surrogate_notes(surrogate: str, forecasts: list) -> list[str]:
    """A note when the LLM surrogate asked for gave no usable forecast at all (`forecasts`: the archive's rows): the
    search then measured in the policy's order, which its progress lines said one iteration at a time."""
    if surrogate != "llm" or not forecasts or any(r["forecast"].get("informative", True) for r in forecasts):
        return []
    why = forecasts[-1]["forecast"].get("rationale") or forecasts[-1]["reason"] or ""
    return [f"the LLM surrogate gave no usable forecast for any of the {len(forecasts)} candidates it was asked about, so they "
            f"were measured in the policy's order; the last reason: {why}"]


def space_notes(run: RunDir) -> list[str]:
    """The recorded space's notes as the search read them (kept in the run since 2026-12-05; none for an older run)."""
    from kernelscout.agent.targets import SPACE_NOTES_KEY

    saved = run.get_meta(SPACE_NOTES_KEY)
    return list(json.loads(saved)) if saved else []


def _here(finished: dict, path: Path) -> Optional[str]:
    """The finished search's command to go on, naming the folder as it is now: a run directory copied or
    renamed since would otherwise be told to resume the original."""
    import shlex

    command, then = finished.get("continue_with"), finished.get("run_dir")
    if not command or not then:
        return command
    if shlex.quote(then) in command:
        return command.replace(shlex.quote(then), shlex.quote(str(path)))
    return command.replace(then, shlex.quote(str(path)))  # written unquoted before 2026-12-04


def failure_row(run: RunDir, rec: CandidateRecord, m: Measurement) -> FailedRow:
    """What `kscout show` and the report say of a measurement that did not count: which file (or
    configuration) to open, and why."""
    return FailedRow(id=rec.id, status="timing not valid" if m.timing_voided else m.status.value, why=m.unusable_reason or "",
                     file=rec.path, params=rec.params)


def view_run(path: str | Path, top: int = 10) -> RunView:
    run = open_run(path)
    with run.snapshot():  # a search may be writing: its ledger and archive are read at one moment
        return _view(run, top)


def _view(run: RunDir, top: int) -> RunView:
    from kernelscout.agent.search_spec import SPEC_KEY, SearchSpec

    status = Budget(run).status()
    spec_text = run.get_meta(SPEC_KEY)
    if not spec_text:  # measurements made directly; predict tool forecasts may sit beside them
        return RunView(run_dir=str(run.path), status="no search", budget=status, forecast_check=check_forecasts(Archive(run)),
                       measured_files=measured_files(run), chat_llm_usage=llm_calls(run, CHAT_USAGE_META))
    spec = SearchSpec.model_validate_json(spec_text)
    archive = Archive(run)
    forecasts = archive.forecasts(lazy=True)
    deciding = deciding_forecasts(forecasts)
    candidates = archive.all()
    measured = [c for c in candidates if c.speedup is not None]
    rows = sorted((_row(archive, c, deciding) for c in measured), key=lambda r: (-(r.speedup or 0.0), r.id))
    best = archive.reported_best()
    finished = finished_event(run.path)
    live = holder(run.path)  # a resume in progress may follow an earlier `finished` event
    best_file = next((str(run.path / n) for n in ("best.py", "best.json") if (run.path / n).is_file()), None)
    used = status.used
    considered = len({f["candidate_id"] for f in forecasts})
    failed, failures = archive.failures()
    with run.connect() as db:  # the same key charged twice; a re-measurement of the best has a key of its own
        measured_again = db.execute("SELECT COUNT(*) - COUNT(DISTINCT key) FROM measurements WHERE charged = 1").fetchone()[0]
        remeasurements = db.execute("SELECT COUNT(*) FROM confirmations").fetchone()[0]
    from kernelscout.agent.targets import reference_timings

    reference = reference_of(run, spec)
    timings = reference_timings(run, spec.kind)
    return RunView(
        run_dir=str(run.path), kind=spec.kind, target=spec.path, device=spec.device, policy=spec.policy, surrogate=spec.surrogate,
        status="running" if live else (finished.get("status") or "finished") if finished else "unfinished", running=live,
        stop_reason=None if live else (finished or {}).get("stop_reason"), stop=None if live else recorded_stop(finished), budget=status,
        continue_with=None if live else _here(finished or {}, run.path),
        states=archive.counts(), considered=considered, considered_per_measurement=round(considered / used, 2) if used else 0.0,
        best=_row(archive, best, deciding) if best else None, best_file=best_file if best else None, top=rows[:top],
        failed=failed, failures=[failure_row(run, rec, m) for rec, m in failures], measured_again=measured_again, remeasurements=remeasurements,
        seed=spec.settings.seed, reference=reference, reference_ms=timings.median_ms,
        reference_range_ms=timings.range_ms, reference_timings=timings.count, space_notes=space_notes(run),
        surrogate_notes=surrogate_notes(spec.surrogate, forecasts),
        best_runtime_ms=archive.reported_runtime_ms(best) if best else None,
        best_reference_ms=archive.reported_reference_ms(best) if best else None,
        forecast_check=check_forecasts(archive, forecasts=forecasts),
        report=str(run.path / "report.html") if (run.path / "report.html").is_file() else None,
        llm_usage=llm_calls(run), chat_llm_usage=llm_calls(run, CHAT_USAGE_META),
        measured_files=measured_files(run, exclude_shas={c.sha for c in candidates}),
    )


def llm_calls(run: RunDir, key: str = RUN_USAGE_META) -> Optional[UsageState]:
    """The search's LLM use (or, with CHAT_USAGE_META, the chat's), or None when it made no call: most runs are
    offline, and a line of zeros would be noise."""
    usage = stored_usage(run, key)
    return usage if usage is not None and usage.calls else None
