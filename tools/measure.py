"""The `measure` tool: verify a candidate against its problem and time both, under the run's budget.

Plain Python with pydantic input and output; the CLI, the MCP server and the agent graph all
call `measure()`, so the budget is enforced here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.device_lock import device_turn
from kernelscout.sandbox.harness import HarnessConfig, run_measurement
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.sandbox.problem import InputFileError, SourceFile, load_candidate, load_problem
from kernelscout.tools import runlock
from kernelscout.tools.budget import Budget, BudgetExhausted, CapBelowUsed, InFlight
from kernelscout.tools.rundir import RunDir, RunDirError
from kernelscout.tools.schema import DEVICE_PATTERN, Measurement, MeasureStatus

if TYPE_CHECKING:
    import numpy as np

    from kernelscout.sandbox.replay import ReplaySpace

HARNESS_VERSION = "1"
DEFAULT_RUN_DIR = Path("runs") / "scratch"


class MeasureRequest(BaseModel):
    problem: str = Field(description="path of a KernelBench problem file (class Model, get_inputs, get_init_inputs), or of a folder holding problem.py")
    candidate: str = Field(description="path of a candidate module defining class ModelNew")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or an installed device plugin's name")
    run_dir: Optional[str] = Field(None, description=f"run directory holding the ledger (default {DEFAULT_RUN_DIR})")
    budget: Optional[int] = Field(None, ge=0, description="measurement cap to set on the run directory")
    again: bool = Field(False, description="spend a new measurement even if this exact candidate was measured here")
    repeat: str = Field("", description="label of a deliberate re-measurement (such as the search's confirmation of its best): "
                        "a new measurement under its own key, so a resumed run never spends the same label twice")
    harness: HarnessConfig = Field(default_factory=HarnessConfig)


def resolve_device(device: str) -> str:
    """The device a measurement runs on: `auto` becomes what this machine has; a name it lacks is an error. An
    installed package's device (tools/plugins.py) is taken as named: it measures elsewhere."""
    if device != "auto":
        if not re.match(DEVICE_PATTERN, device):
            from kernelscout.tools import plugins

            if plugins.is_device_plugin(device):
                try:
                    plugins.device_kind(device)
                except plugins.PluginError as exc:
                    raise InputFileError(device, str(exc), "invalid_problem") from None
                return device
            others = plugins.device_names()
            raise InputFileError(device, "unknown device; use auto, cpu, cuda or cuda:N"
                                 + (f", or an installed package's: {', '.join(others)}" if others else ""), "invalid_problem")
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise InputFileError(device, "no CUDA device is visible here; use device cpu or auto", "invalid_problem")
            index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
            if index >= count:
                raise InputFileError(device, f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}", "invalid_problem")
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def measurement_key(problem_sha: str, candidate_sha: str, device: str, repeat: str = "") -> str:
    """Same content on the same device, same key; a `repeat` label makes a deliberate re-measurement its own key."""
    candidate = f"{candidate_sha}|{repeat}" if repeat else candidate_sha
    return hashlib.sha256(f"{HARNESS_VERSION}|{problem_sha}|{candidate}|{device}".encode()).hexdigest()


def _searched_elsewhere(folder: Path, searching: str) -> RunDirError:
    return RunDirError(f"{folder} is in use by a search that is still running ({searching}), and takes only that "
                       "search's measurements: one made here would be charged to its budget; measure into another run "
                       "directory (--run-dir)")


def refuse_if_searched(folder: Path, cap: bool = False) -> None:
    """RunDirError while a search in another process holds `folder`: whatever is about to charge or re-cap it would
    do so under that search (the MCP server's and chat's cap is set before their tools open the folder). `cap`: a cap
    is about to be set, which a folder holding a search refuses even when the search has stopped."""
    searching = runlock.held_elsewhere(folder)
    if searching:
        raise _searched_elsewhere(folder, searching)
    if cap:
        refuse_if_search_folder(folder, cap=True)


def refused_folder(folder: Path) -> bool:
    """Whether a measurement from this process into `folder` would be refused for the folder's sake (a search runs
    there, or holds it), by the rules `measure` applies; reads only."""
    return bool(runlock.held_elsewhere(folder) or search_in(folder))


def search_in(folder: Path) -> Optional[str]:
    """What search the folder holds ("a search of PATH"), unless this process is that search: a measurement made
    there from outside would be charged to the search's budget and left out of what `kscout show` and `kscout resume`
    make of it (they read the search's own candidates). Reads only; None for a folder that holds no search."""
    from kernelscout.agent.search_spec import SPEC_KEY, SearchSpec

    if runlock.searching_here(folder) or not (folder / "run.db").is_file():
        return None
    try:
        stored = RunDir(folder, read_only=True).get_meta(SPEC_KEY)
    except (RunDirError, sqlite3.Error):  # not a run directory this can read: the opening that follows says why
        return None
    if not stored:
        return None
    spec = SearchSpec.model_validate_json(stored)
    return f"a search of {spec.path}" + (" (a recorded space)" if spec.kind == "space" else "")


def refuse_if_search_folder(folder: Path, cap: bool = False) -> None:
    """RunDirError when `folder` holds a search other than this process's: a measurement made there would be counted
    as the search's own, and a cap set there would change the search's budget behind its back (`cap`)."""
    search = search_in(folder)
    if not search:
        return
    go_on = f"`kscout budget {folder} --set N && kscout resume {folder}`"
    if cap:
        raise RunDirError(f"{folder} holds {search}, whose budget is the search's own: raise it and go on with the search "
                          f"with {go_on}, or use another run directory (--run-dir)")
    ledger = _ledger_of(folder)
    if ledger is not None and ledger.remaining == 0:  # nothing could be charged: the budget is the reason to say
        charged = f"whose budget is spent ({ledger.used} of {ledger.cap}), and a measurement made there outside it would count as its own"
    else:
        charged = "and a measurement made there outside it would be charged to its budget"
    raise RunDirError(f"{folder} holds {search}, {charged} and be left out of what `kscout show` reports of it; measure into "
                      f"another run directory (--run-dir), or let the search measure more: {go_on}")


def _ledger_of(folder: Path):
    """The folder's budget, read only; None where it cannot be read (the opening that follows says why)."""
    try:
        return Budget(RunDir(folder, read_only=True)).status()
    except (RunDirError, sqlite3.Error):
        return None


def open_run(run_dir: Optional[str], budget: Optional[int]) -> RunDir:
    """The run directory a measurement is charged to, its cap set to `budget` when one is given.

    RunDirError while a search in another process is using the folder: the measurement would be charged
    to that search's budget (and `budget` would change its cap under it: a QA pass saw a search capped at 4
    go on to 12), so it is refused before anything is charged. `measure` also keeps searches out of the
    folder while it runs (runlock.shared); this check is for callers that only open the folder."""
    folder = Path(run_dir or DEFAULT_RUN_DIR)
    refuse_if_searched(folder, cap=budget is not None)
    run = RunDir(folder)
    if budget is not None:
        ledger = Budget(run)
        if budget != ledger.cap:
            try:
                ledger.set_cap(budget)
            except CapBelowUsed as exc:
                raise RunDirError(f"a budget of {budget} is below the {exc.used} measurements {folder} has already used; "
                                  f"give --budget {exc.used} or more, or measure into a new run directory") from None
    return run


def measure(request: MeasureRequest, pool: Optional[WorkerPool] = None,
            execute: Optional[Callable[[SourceFile, SourceFile, HarnessConfig], Measurement]] = None) -> Measurement:
    """Measure one candidate. Never raises for bad input: the status and message say what went wrong.

    `execute` runs the sandbox part on a scale-out worker (agent/dispatch.py); checks, key and ledger stay here.
    """
    try:
        device = keyed_device(request.device, scaled_out=execute is not None)
        problem = load_problem(request.problem)
        candidate = load_candidate(request.candidate)
    except InputFileError as exc:
        return Measurement(status=MeasureStatus(exc.kind), message=str(exc), device=request.device)
    folder = Path(request.run_dir or DEFAULT_RUN_DIR)
    try:
        # held from the check to the charge, so a search cannot start in the folder in between
        with runlock.shared(folder):
            try:
                run = open_run(str(folder), request.budget)
                refuse_if_search_folder(folder)
            except RunDirError as exc:
                return Measurement(status=MeasureStatus.run_dir_unusable, message=str(exc), device=device)
            return _measure_in(run, request, problem, candidate, device, pool, execute)
    except runlock.RunBusy as exc:
        return Measurement(status=MeasureStatus.run_dir_unusable, message=str(_searched_elsewhere(folder, exc.holder)), device=device)


def _measure_in(run: RunDir, request: MeasureRequest, problem: SourceFile, candidate: SourceFile, device: str,
                pool: Optional[WorkerPool], execute: Optional[Callable[[SourceFile, SourceFile, HarnessConfig], Measurement]]) -> Measurement:
    from kernelscout.tools import plugins

    key = measurement_key(problem.sha, candidate.sha, device, request.repeat)
    run.save_kernel(candidate.sha, candidate.source)
    plugin = plugins.is_device_plugin(device)
    config = request.harness.model_copy(update={"device": plugins.device_kind(device)[0]})

    def run_in_sandbox() -> Measurement:
        if execute is not None:
            return execute(problem, candidate, config)
        if plugin:  # an installed package's device: one job, shipped where it measures
            from kernelscout.agent.dispatch import open_dispatcher

            try:
                dispatcher = open_dispatcher(run, device)
            except plugins.PluginError as exc:  # the package's to fix, and nothing was shipped
                return Measurement(status=MeasureStatus.invalid_problem, charged=False, message=str(exc), device=device)
            with dispatcher:
                try:
                    return dispatcher.code(problem, candidate, config)
                except plugins.PluginError as exc:
                    return Measurement(status=MeasureStatus.crashed, charged=True, device=device,
                                       message=f"{exc}; charged, since the job was handed to the device and may have run")
        own_pool = pool is None
        active = pool or WorkerPool(spares=False)
        try:
            with device_turn(device):  # other kscout processes on this machine wait, not overlap
                return run_measurement(active, problem, candidate, config)
        finally:
            if own_pool:
                active.close()

    record = MeasurementRecord(key=key, problem_sha=problem.sha, candidate_sha=candidate.sha, problem_path=str(problem.path),
                               candidate_path=str(candidate.path), device=device)
    from kernelscout.sandbox.slot import WorkersGone

    try:
        return ledgered(run, record, run_in_sandbox, again=request.again)
    except WorkersGone as exc:  # the reservation stays in flight: asking again once the device is back adopts it
        if execute is not None:
            raise  # a search's: it stops, and its resume asks again
        return Measurement(status=MeasureStatus.crashed, charged=False, device=device, candidate_sha=candidate.sha,
                           message=f"{exc}; its reservation stays in flight, and measuring the same candidate again once "
                                   "the device is back uses it (nothing more is spent)")


class MeasurementRecord(BaseModel):
    """What identifies a measurement in the run's table; the key makes repeats and resumes idempotent."""

    key: str
    problem_sha: str
    candidate_sha: str
    problem_path: str
    candidate_path: str
    device: str


SAME_KEY_POLL_S = 0.5
SAME_KEY_WAIT_S = 3600.0  # longer than any one measurement is allowed to take (compile plus run timeouts)


def would_charge(run: RunDir, problem: str, candidate: str, device: str, again: bool = False) -> bool:
    """Whether `measure` of this file now would spend budget, by the same rules `open_run` and `ledgered` apply: not
    when it is refused (unusable input, a search running in the folder, no budget left), and not when a result
    is already recorded (free unless `again`). For adapters that ask a person before spending (`kscout chat`)."""
    try:
        key = measurement_key(load_problem(problem).sha, load_candidate(candidate).sha, resolve_device(device))
    except InputFileError:
        return False
    if refused_folder(run.path) or Budget(run).status().remaining == 0:
        return False
    return again or find_measurement(run, key) is None


def ledgered(run: RunDir, record: MeasurementRecord, do_measure: Callable[[], Measurement], again: bool = False) -> Measurement:
    """Reserve, measure, then settle and store in one transaction: the one path every device goes through."""
    ledger = Budget(run)
    waited_since, waiting = time.monotonic(), False
    while True:
        if not again:
            previous = find_measurement(run, record.key)
            if previous is not None:
                previous.charged = False
                previous.message = f"already measured in this run (measurement #{previous.measurement_id}); ask again (--again, or again=true) to spend a new one. {previous.message}"
                return previous
        try:
            # another process measuring the same candidate is waited for, not paid again; but a process that
            # reuses a dead owner's pid would look busy for ever, so after SAME_KEY_WAIT_S this one pays
            reservation = ledger.reserve(record.key, share=again or time.monotonic() - waited_since > SAME_KEY_WAIT_S)
            break
        except InFlight as exc:
            if not waiting:
                run.event("measure_wait", candidate=record.candidate_path, owner_pid=exc.pid)
                waiting = True
            time.sleep(SAME_KEY_POLL_S)
        except BudgetExhausted as exc:
            run.event("budget_exhausted", candidate=record.candidate_path, budget=exc.status.model_dump())
            return Measurement(status=MeasureStatus.budget_exhausted, message=str(exc), device=record.device,
                               candidate_sha=record.candidate_sha)
    run.event("measure_start", candidate=record.candidate_path, problem=record.problem_path, device=record.device,
              reservation=reservation.id, adopted=reservation.adopted)
    # If this raises or the process dies, the reservation stays: it counts as spent and a later
    # request for the same key adopts it, so nothing is over-spent or paid twice.
    result = do_measure()
    result.candidate_sha = record.candidate_sha
    with run.transaction() as db:
        ledger.settle(reservation, result.charged, db=db)
        cur = db.execute(
            "INSERT INTO measurements (ledger_id, key, problem_sha, candidate_sha, problem_path, candidate_path, device, status, charged, speedup, result_json, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (reservation.id, record.key, record.problem_sha, record.candidate_sha, record.problem_path, record.candidate_path, record.device,
             result.status.value, int(result.charged), result.speedup, "", time.time()),
        )
        result.measurement_id = cur.lastrowid
        db.execute("UPDATE measurements SET result_json = ? WHERE id = ?", (result.model_dump_json(), result.measurement_id))
    run.event("measure_end", measurement_id=result.measurement_id, status=result.status.value, charged=result.charged,
              speedup=result.speedup, timing_valid=result.timing_valid)
    return result


def measure_replay(space: "ReplaySpace", config: dict, run: RunDir, reference: Optional[dict] = None,
                   rng: Optional["np.random.Generator"] = None, again: bool = False,
                   execute: Optional[Callable[[int], Measurement]] = None, repeat: str = "") -> Measurement:
    """Measure a configuration of a recorded space under the same ledger as a real device.

    `execute(seed)` replays it on a scale-out worker instead (agent/dispatch.py); the ledger stays here.
    """
    import numpy as np

    from kernelscout.sandbox.replay import ReplayDevice

    device = ReplayDevice(space)
    if space.index_of(config) is None:  # outside the space: nothing would have run, nothing is charged
        return device.measure(config, rng or np.random.default_rng())
    record = replay_record(space, config, reference, repeat)
    seed = int(record.key[:8], 16)  # replaying the same key after a crash draws the same repeats
    if execute is not None:
        return ledgered(run, record, lambda: execute(seed), again=again)
    return ledgered(run, record, lambda: device.measure(config, rng or np.random.default_rng(seed), reference=reference), again=again)


def replay_record(space: "ReplaySpace", config: dict, reference: Optional[dict] = None, repeat: str = "") -> MeasurementRecord:
    """The ledger's record of a configuration replayed against `reference`; its key is what a repeat finds."""
    from kernelscout.sandbox.replay import ReplayDevice

    config_text = json.dumps({k: config[k] for k in space.param_names}, default=str)
    sha = hashlib.sha256(config_text.encode()).hexdigest()
    space_sha = space.content_sha  # not its path: the same space replays the same way wherever it lies
    ref_text = json.dumps(reference, sort_keys=True, default=str) if reference else ""
    device = ReplayDevice(space).device
    return MeasurementRecord(key=measurement_key(space_sha, sha + ref_text, device, repeat), problem_sha=space_sha, candidate_sha=sha,
                             problem_path=str(space.path), candidate_path=config_text, device=device)


def keyed_device(device: str, scaled_out: bool = False) -> str:
    """The device a measurement is keyed and recorded under: a scale-out worker's node has the GPU, not necessarily
    this one, so a device named for it is taken as named."""
    return device if scaled_out and device != "auto" else resolve_device(device)


def code_key(problem: str, candidate: str, device: str, scaled_out: bool = False) -> Optional[str]:
    """The ledger key `measure` gives this file (None if either file cannot be read, or the device is unknown here)."""
    try:
        return measurement_key(load_problem(problem).sha, load_candidate(candidate).sha, keyed_device(device, scaled_out))
    except InputFileError:
        return None


def stored_measurement_id(run: RunDir, key: Optional[str]) -> Optional[int]:
    """The measurement a request for `key` would be handed back instead of paying again (`find_measurement`), by id."""
    if key is None:
        return None
    with run.connect() as db:
        row = db.execute("SELECT id FROM measurements WHERE key = ? AND charged = 1 ORDER BY id DESC LIMIT 1", (key,)).fetchone()
    return row[0] if row else None


def find_measurement(run: RunDir, key: str) -> Optional[Measurement]:
    """The recorded measurement a repeat request gets instead of paying again. Only a charged one: an
    uncharged result (did not import or build, its build out of time) says more about the machine or
    the limits than about the candidate, and measuring it again spends nothing unless it now runs."""
    with run.connect() as db:
        row = db.execute(
            "SELECT result_json FROM measurements WHERE key = ? AND charged = 1 ORDER BY id DESC LIMIT 1", (key,)
        ).fetchone()
    return Measurement.model_validate(json.loads(row[0])) if row else None


def list_measurements(run: RunDir) -> list[Measurement]:
    with run.connect() as db:
        rows = db.execute("SELECT result_json FROM measurements ORDER BY id").fetchall()
    return [Measurement.model_validate(json.loads(r[0])) for r in rows]


class MeasuredFile(BaseModel):
    """A file measured directly (`kscout measure`, the MCP server, the chat): its latest measurement."""

    problem: Optional[str] = None
    problem_sha: Optional[str] = None
    candidate: Optional[str] = None
    candidate_sha: Optional[str] = None
    device: Optional[str] = None
    usable: bool = Field(description="correct, with a valid timing and a speedup")
    measurement: Measurement


def measured_files(run: RunDir, exclude_shas: frozenset[str] | set[str] = frozenset()) -> list[MeasuredFile]:
    """The latest measurement of each (problem, file, device) in the run, in the order the files were
    first measured, leaving out the candidates in `exclude_shas` (a search's own, which its archive
    describes better)."""
    with run.connect() as db:
        rows = db.execute("SELECT key, problem_sha, candidate_sha, problem_path, candidate_path, device, result_json"
                          " FROM measurements ORDER BY id").fetchall()
    latest: dict[str, tuple] = {}
    for r in rows:
        if r[2] not in exclude_shas:
            latest[r[0]] = r
    out = []
    for key, psha, csha, ppath, cpath, device, result in latest.values():
        m = Measurement.model_validate(json.loads(result))
        out.append(MeasuredFile(problem=ppath, problem_sha=psha, candidate=cpath, candidate_sha=csha, device=device,
                                usable=m.usable, measurement=m))
    return out
