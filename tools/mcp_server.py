"""The MCP server: kernelscout's tools for an IDE agent (Claude Code, Cursor, VS Code, ...).

`build_server()` returns an `MCPServer` (the official MCP Python SDK, v2) whose tools are thin
adapters over the plain-Python tools in kernelscout.tools; `serve()` runs it over stdio (the
default) or streamable HTTP. Tool outputs are the same pydantic models the CLI prints and the
search loop stores (Measurement, BudgetStatus, SolBounds, Forecast, CandidateRecord), so results
come back as structured content.

What an IDE agent can and cannot do here:

- It measures only through `tools.measure.measure()`, under the run directory's ledger, which is
  shared with every other process using that directory. No tool takes a run directory, a budget or
  harness settings: those are fixed by whoever started the server, so an agent cannot raise the cap,
  switch to an uncapped directory, or weaken the correctness and timing checks.
- A request that could not be measured (budget spent, missing or unusable file, no such device)
  comes back as a tool error carrying the message. A candidate that was measured and failed
  (incorrect, crashed, timed out, failed to build in the sandbox) comes back as a normal result
  with its status, because it was recorded and possibly charged.
- Logs go to stderr. In stdio mode nothing else writes to stdout: the SDK points fd 1 at stderr
  while it serves, and sandbox workers write to their own log files.

HTTP: loopback by default. Another host needs `allow_remote=True` *and* a bearer token; with a
token set, every HTTP request without `Authorization: Bearer <token>` gets 401.
"""

import hmac
import inspect
import ipaddress
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.sandbox.problem import InputFileError, load_problem
from kernelscout.tools.archive import CLEAR_GAIN, Archive, CandidateRecord, clear_gain
from kernelscout.tools.budget import Budget, CapBelowUsed
from kernelscout.tools.forecast_check import ForecastCheck, check_forecasts
from kernelscout.tools.measure import DEFAULT_RUN_DIR, MeasureRequest, measured_files, open_run, refuse_if_searched, resolve_device
from kernelscout.tools.measure import measure as run_measure
from kernelscout.tools.predict_file import CandidateForecast, PredictFileRequest, PredictInputError, llm_surrogate, predict_file, usable_measurements
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import BudgetStatus, Measurement, MeasureStatus
from kernelscout.tools.sol import DEFAULT_TIMEOUT_S, SolBounds, SolRequest

try:  # the SDK is an optional extra: `pip install kernelscout[mcp]`
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the MCP server needs the official MCP SDK, version 2: pip install 'kernelscout[mcp]' (or pip install 'mcp>=2.3,<3')"
    ) from _exc

log = logging.getLogger("kernelscout.mcp")

SERVER_NAME = "kernelscout"
TOKEN_ENV = "KSCOUT_MCP_TOKEN"
DEFAULT_SERVE_BUDGET = 20  # measurements granted when the run directory has no cap and none was given
LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")
AUTO = "auto"

INSTRUCTIONS = """kernelscout measures GPU (or CPU) kernels honestly and cheaply.
A problem is a KernelBench file (class Model, get_inputs, get_init_inputs); a candidate is a file defining class ModelNew
with the same constructor and forward signature. Every measurement is checked for correctness against the reference and
timed against it in one sandboxed session; it spends one unit of a hard measurement budget shared with everything else
using this run directory (budget_status says what is left; you cannot raise it). Measuring the same file again is free
and returns the recorded result. Use predict before measure to skip candidates that are confidently worse, sol_bounds to
know how far from speed-of-light a kernel is, list_candidates / best_candidate to see what has been measured, and
forecast_check to see how well the forecasts so far matched the measurements that followed them."""


# -- boundary models (compositions of the shared ones) ------------------------------------------------------


CandidateState = Literal["proposed", "skipped", "shelved", "measured", "failed", "suspect", "unconfirmed"]


class CandidateEntry(BaseModel):
    """One candidate in the run directory: proposed by a search, or a file measured directly."""

    origin: Literal["search", "measure"] = Field(
        description="search: in the search archive (`kscout optimize`); measure: a file measured directly "
        "(this server's measure tool or `kscout measure`) and not part of a search"
    )
    path: Optional[str] = Field(None, description="candidate file (for a search, its copy under kernels/)")
    problem: Optional[str] = Field(None, description="problem file it belongs to")
    problem_sha: Optional[str] = None
    device: Optional[str] = None
    state: CandidateState = Field(description="search: proposed, skipped, shelved, measured, failed, suspect or unconfirmed (chosen as best, "
                                   "then a re-measurement failed); measure: measured or failed")
    speedup: Optional[float] = Field(None, description="measured speedup over the reference (for a search candidate the search "
                                     "re-measured, the median of its re-measurements); only for a usable measurement, never a forecast")
    record: Optional[CandidateRecord] = Field(None, description="the archive record (search candidates only)")
    measurement: Optional[Measurement] = Field(None, description="for a search candidate, the measurement that chose it "
                                               "(its re-measurements are in confirmed_speedups); for a file, its latest")
    confirmed_speedups: list[float] = Field(default_factory=list, description="a search candidate's successful "
                                            "re-measurements after the search (`--confirm`), oldest first; speedup is "
                                            "their median. Empty: measured once")


class CandidateList(BaseModel):
    run_dir: str
    candidates: list[CandidateEntry] = Field(description="fastest measured first, then the rest in the order they came; "
                                             "at most `limit` of them")
    counts: dict[str, int] = Field(default_factory=dict, description="entries per state, over all of them")
    total: int = Field(0, description="entries that match the filters, before the limit")


class BestCandidate(BaseModel):
    found: bool
    best: Optional[CandidateEntry] = None
    message: str = ""


# -- the server ---------------------------------------------------------------------------------------------

_Problem = Annotated[str, Field(description=MeasureRequest.model_fields["problem"].description)]
_CandidatePath = Annotated[str, Field(description=MeasureRequest.model_fields["candidate"].description)]
_Device = Annotated[Optional[str], Field(description="auto, cpu, cuda, cuda:N or an installed device plugin's name; omitted: the server's device")]
_ProblemFilter = Annotated[Optional[str], Field(description="only candidates of this problem file")]


class KernelScoutMCP(MCPServer):
    """An MCPServer bound to one run directory, with one warm worker pool for its measurements."""

    def __init__(self, run_dir: str, device: str = "auto", budget: Optional[int] = None, harness: Optional[HarnessConfig] = None,
                 pool: Optional[WorkerPool] = None, chat_model: Any = AUTO, sol_timeout_s: float = DEFAULT_TIMEOUT_S):
        instructions = INSTRUCTIONS + f"\nRelative paths are resolved against the server's working directory, {os.getcwd()}."
        super().__init__(SERVER_NAME, instructions=instructions, version=_version(), log_level="INFO")
        self.run = open_run(run_dir, budget)
        self.run_dir = str(self.run.path)
        self.device = device
        self.harness = harness or HarnessConfig()
        self.sol_timeout_s = sol_timeout_s
        self._pool = pool
        self._own_pool = pool is None
        self._chat_model = chat_model
        self._surrogate = None
        self._lock = threading.Lock()  # short: creating the pool, the model and the surrogate; pending forecasts
        self._forecast_lock = threading.Lock()  # the LLM surrogate keeps a calibration history: one forecast or update at a time
        # one measurement (or FLOP count, or CPU peak benchmark) at a time: concurrent ones would disturb each other's timings
        self._device_lock = threading.Lock()
        self._sol_cache: dict[tuple[str, str, bool], SolBounds] = {}
        self._pending: dict[tuple[str, str, str], tuple[Optional[float], Optional[str], str]] = {}
        self._takes: dict[str, frozenset[str]] = {}  # each tool's argument names
        self._register_tools()

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def pool(self) -> WorkerPool:
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool()
            return self._pool

    def close(self) -> None:
        """Stop the warm workers this server started (not a pool that was passed in)."""
        with self._lock:
            self._close_pool()

    def close_now(self) -> None:
        """close() for a signal handler: does not wait for a lock that a tool call may hold."""
        self._close_pool()

    def _close_pool(self) -> None:
        pool, self._pool = self._pool, None
        if self._own_pool and pool is not None:
            pool.close()

    # -- tools ----------------------------------------------------------------------------------------------

    def add_tool(self, fn: Any, name: Optional[str] = None, **kwargs: Any) -> None:
        # the SDK drops arguments a tool does not take; here they are refused (see call_tool)
        self._takes[name or fn.__name__] = frozenset(inspect.signature(fn).parameters)
        super().add_tool(fn, name=name, **kwargs)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        """Refuse arguments a tool does not take instead of dropping them: an agent that passes
        `budget` or `timeout_s` to measure must hear that nothing it sent was used, not see a result
        it believes those settings produced."""
        takes = self._takes.get(name)
        unknown = sorted(set(arguments) - takes) if takes is not None else []
        if unknown:
            raise ToolError(f"{name} does not take {', '.join(map(repr, unknown))}; it takes {', '.join(sorted(takes)) or 'no arguments'}. "
                            "Nothing was done. The run directory, budget and harness settings are fixed by whoever started "
                            "the server.")
        return await super().call_tool(name, arguments, context)

    def _register_tools(self) -> None:
        # hints a client may use to approve calls: only measure spends budget, only predict may call out (an LLM)
        reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
        spends = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
        calls_out = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)
        self.add_tool(self.tool_measure, name="measure", annotations=spends, title="Measure a candidate kernel", description=(
            "Check a candidate (class ModelNew) against its problem's reference (class Model) and time both in one sandboxed, "
            "interleaved session. Spends one measurement of the run's hard budget if the candidate ran; a file already measured "
            "here returns its recorded result for free unless again=true. A candidate that fails (incorrect, crashed, timeout, "
            "build error) is a result with that status; a request that cannot be measured (budget spent, missing or invalid "
            "file) is a tool error. Quote a speedup only when timing_valid is true. On a server without a GPU a Triton kernel "
            "runs in Triton's interpreter: its outputs are checked, it is not timed, and it still spends a measurement. "
            "Relative paths resolve against the server's working directory."))
        self.add_tool(self.tool_budget_status, name="budget_status", annotations=reads, title="Measurement budget", description=(
            "The run directory's measurement ledger: cap, used (charged + in flight), in flight, remaining. Shared with every "
            "other process using this run directory."))
        self.add_tool(self.tool_sol_bounds, name="sol_bounds", annotations=reads, title="Speed of light", description=(
            "The least time any kernel could take for a problem on a device: max(FLOPs / peak FLOP/s, minimum bytes / peak "
            "bandwidth). Costs no measurement (FLOPs are counted in a child process, usually on the meta device)."))
        self.add_tool(self.tool_predict, name="predict", annotations=calls_out, title="Forecast a candidate", description=(
            "Forecast a candidate's speedup over its parent (another candidate file measured in this run, or by default the "
            "problem's reference) before spending a measurement: probabilities over speedup bins, P(faster), P(beats the best "
            "so far), expected speedup, confidence. Needs an LLM provider (KSCOUT_PROVIDER); without one the forecast is "
            "marked informative=false and says so. Never a measurement; a file this run already measured comes back with its "
            "measured_speedup beside the forecast."))
        self.add_tool(self.tool_list_candidates, name="list_candidates", annotations=reads, title="Candidates in the run", description=(
            "Candidates in the run directory, fastest measured first: the search archive (`kscout optimize`, with forecasts' "
            "outcomes) and files measured directly (this tool server, `kscout measure`; the latest measurement of each). "
            "Filter by problem or state; `limit` (default 20) caps the list, `total` and `counts` cover all of them."))
        self.add_tool(self.tool_forecast_check, name="forecast_check", annotations=reads, title="Forecasts against measurements", description=(
            "How well this run's forecasts matched what was measured after them: the search's forecasts and this server's "
            "predict calls (scored once the file is measured). Brier score of P(faster), share of directions right, ranked "
            "probability score over the speedup bins, rank correlation, 80 % interval coverage, reliability table. Only "
            "measured candidates can be scored. Costs no measurement."))
        self.add_tool(self.tool_best_candidate, name="best_candidate", annotations=reads, title="Best verified candidate", description=(
            "The fastest candidate measured correct with valid timing (search candidates marked suspect are excluded; once "
            "any search candidate was re-measured, only re-measured ones compete, as kscout show reports it). Pass problem "
            "(or device) when the run directory holds measurements of several problems (or devices)."))

    def tool_measure(self, problem: _Problem, candidate: _CandidatePath, device: _Device = None,
                     again: Annotated[bool, Field(description=MeasureRequest.model_fields["again"].description)] = False) -> Measurement:
        request = MeasureRequest(problem=problem, candidate=candidate, device=device or self.device, run_dir=self.run_dir,
                                 again=again, harness=self.harness)
        log.info("measure %s against %s", candidate, problem)
        with _tool_errors("measure"), self._device_lock:
            result = run_measure(request, pool=self.pool)
        log.info("measure %s: %s%s", candidate, result.status.value,
                 f", {result.speedup:.3f}x" if result.speedup else "")
        if result.status == MeasureStatus.budget_exhausted:
            raise ToolError(f"budget_exhausted: {result.message}. The cap is set by whoever runs the run directory "
                            f"({self.run_dir}); ask them to raise it.")
        if result.measurement_id is None and result.status != MeasureStatus.ok:
            # refused before anything ran: nothing recorded, nothing charged
            raise ToolError(f"{result.status.value}: {result.message}")
        self._observe(result)
        return result

    def tool_budget_status(self) -> BudgetStatus:
        with _tool_errors("budget_status"):
            return Budget(self.run).status()

    def tool_sol_bounds(self, problem: _Problem,
                        device: Annotated[Optional[str], Field(description=SolRequest.model_fields["device"].description + "; omitted: the server's device")] = None,
                        tf32: Annotated[bool, Field(description=SolRequest.model_fields["tf32"].description)] = False) -> SolBounds:
        from kernelscout.tools.sol import sol_bounds

        with _tool_errors("sol_bounds"):
            sha = load_problem(problem).sha
            key = (sha, device or self.device, tf32)
            if key not in self._sol_cache:
                # isolate stays on: counting FLOPs runs the problem's code, which must not run in this process
                with self._device_lock:
                    self._sol_cache[key] = sol_bounds(SolRequest(problem=problem, device=device or self.device, tf32=tf32,
                                                                 isolate=True, timeout_s=self.sol_timeout_s))
            return self._sol_cache[key]

    def tool_predict(self, problem: _Problem, candidate: _CandidatePath,
                     parent: Annotated[Optional[str], Field(description="a candidate file already measured in this run; omitted: the problem's reference Model")] = None,
                     device: _Device = None) -> CandidateForecast:
        with _tool_errors("predict"):
            return self._predict(problem, candidate, parent, device)

    def tool_list_candidates(
        self,
        problem: _ProblemFilter = None,
        state: Annotated[Optional[CandidateState], Field(description="only candidates in this state")] = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="at most this many entries (a search archive holds hundreds)")] = 20,
    ) -> CandidateList:
        with _tool_errors("list_candidates"):
            entries = self._entries(problem)
            counts: dict[str, int] = {}
            for e in entries:
                counts[e.state] = counts.get(e.state, 0) + 1
            if state is not None:
                entries = [e for e in entries if e.state == state]
            # what an agent asks for first: the fastest verified ones (a stable sort keeps the rest in order)
            ranked = sorted(entries, key=lambda e: -(e.speedup or 0.0) if e.state == "measured" else 0.0)
            return CandidateList(run_dir=self.run_dir, candidates=ranked[:limit], counts=counts, total=len(entries))

    def tool_forecast_check(self) -> ForecastCheck:
        with _tool_errors("forecast_check"):
            return check_forecasts(Archive(self.run))

    def tool_best_candidate(self, problem: _ProblemFilter = None,
                            device: Annotated[Optional[str], Field(description="only measurements on this device, as "
                                                                   "list_candidates names it (needed when there are several)")] = None,
                            ) -> BestCandidate:
        with _tool_errors("best_candidate"):
            usable = [e for e in self._entries(problem) if e.state == "measured" and e.speedup is not None]
            if not usable:
                return BestCandidate(found=False, message="no candidate has been measured correct with valid timing in this run"
                                     + (" for that problem" if problem else ""))
            problems = {e.problem_sha for e in usable}
            if len(problems) > 1:
                names = sorted({e.problem or "?" for e in usable})
                raise ToolError(f"this run directory holds measurements of {len(problems)} problems ({', '.join(names)}); "
                                "pass problem to pick one")
            devices = sorted({e.device or "?" for e in usable})
            if len(devices) > 1:  # a speedup on one device says nothing against one on another
                if device is None:
                    raise ToolError(f"this run directory holds measurements on {len(devices)} devices ({', '.join(devices)}); "
                                    "pass device to pick one")
            if device is not None:
                usable = [e for e in usable if e.device == device]
                if not usable:
                    return BestCandidate(found=False, message=f"no candidate was measured correct with valid timing on {device}; "
                                         f"devices with one: {', '.join(devices)}")
            if any(e.confirmed_speedups for e in usable):
                # as `kscout show` reports a search: once any candidate was re-measured, only re-measured ones compete,
                # since one measured once may look faster by luck (tools/archive.py, Archive.reported_best)
                usable = [e for e in usable if e.origin != "search" or e.confirmed_speedups]
            best = max(usable, key=lambda e: e.speedup or 0.0)
            n = len(best.confirmed_speedups)
            how = (f"median of {n} re-measurement{'s' if n > 1 else ''}; the search measured "
                   f"{best.measurement.speedup:.3f}x" if n and best.measurement and best.measurement.speedup else
                   "measured once" if best.origin == "search" else "the file's latest measurement")
            stands = "" if clear_gain(best.speedup) else (  # as `kscout optimize` and `show` judge it
                f"; under {CLEAR_GAIN - 1:.0%} faster than the reference, which re-measuring can undo: the reference stands")
            return BestCandidate(found=True, best=best, message=f"{best.path}: {best.speedup:.3f}x over the reference "
                                 f"({best.origin}, {how}){stands}")

    # -- candidates -----------------------------------------------------------------------------------------

    def _entries(self, problem: Optional[str]) -> list[CandidateEntry]:
        want = load_problem(problem).sha if problem else None
        archive = Archive(self.run)
        with self.run.connect() as db:
            rows = db.execute("SELECT id, key, problem_sha, candidate_sha, problem_path, candidate_path, device, result_json"
                              " FROM measurements ORDER BY id").fetchall()
        by_id = {r[0]: r for r in rows}
        records = archive.all()
        search_shas = {c.sha for c in records}
        spec_path, spec_sha = self._search_problem()
        entries: list[CandidateEntry] = []
        for rec in records:
            row = by_id.get(rec.measurement_id) if rec.measurement_id is not None else None
            m = Measurement.model_validate(json.loads(row[7])) if row else None
            entries.append(CandidateEntry(
                origin="search", path=rec.path, problem=row[4] if row else spec_path, problem_sha=row[2] if row else spec_sha,
                device=row[6] if row else None, state=rec.state,
                speedup=archive.reported_speedup(rec) if rec.state == "measured" else None,  # its re-measurement where it has one
                record=rec, measurement=m, confirmed_speedups=[sp for _, sp in archive.confirmations(rec.id)],
            ))
        for f in measured_files(self.run, exclude_shas=search_shas):  # files measured directly: the latest of each
            entries.append(CandidateEntry(
                origin="measure", path=f.candidate, problem=f.problem, problem_sha=f.problem_sha, device=f.device,
                state="measured" if f.usable else "failed", speedup=f.measurement.speedup if f.usable else None,
                measurement=f.measurement,
            ))
        if want is not None:
            entries = [e for e in entries if e.problem_sha == want]
        return entries

    def _search_problem(self) -> tuple[Optional[str], Optional[str]]:
        """The problem of the search stored in this run directory, if it is a search's."""
        text = self.run.get_meta("search_spec")
        if not text:
            return None, None
        try:
            spec = json.loads(text)
            path = spec.get("path") if spec.get("kind") == "problem" else None
            return (path, load_problem(path).sha) if path else (spec.get("path"), None)
        except (ValueError, InputFileError):
            return None, None

    def _usable(self, problem_sha: str, device: str, candidate_sha: Optional[str] = None) -> list[Measurement]:
        return usable_measurements(self.run, problem_sha, device, candidate_sha)

    # -- predict --------------------------------------------------------------------------------------------

    def _model(self) -> Any:
        if isinstance(self._chat_model, str) and self._chat_model == AUTO:
            from kernelscout.agent.llm import make_chat_model

            self._chat_model = make_chat_model()  # LLMConfigError (provider asked for but unusable) becomes a tool error
            log.info("predict: %s", "LLM surrogate" if self._chat_model is not None else "no LLM provider configured")
        return self._chat_model

    def _predict(self, problem: str, candidate: str, parent: Optional[str], device: Optional[str]) -> CandidateForecast:
        dev = resolve_device(device or self.device)
        with self._lock:
            model = self._model()
        surrogate = self._llm_surrogate(model) if model is not None else None
        sol_text = None
        if surrogate is not None and self._sol_cache:  # the speed of light, if sol_bounds was asked for this problem
            sha = load_problem(problem).sha
            sol = next((b for (s, d, _), b in self._sol_cache.items() if s == sha and d in (dev, device or self.device)), None)
            sol_text = f"{sol.time_ms:.4g} ms ({sol.bound}-bound)" if sol else None
        request = PredictFileRequest(problem=problem, candidate=candidate, parent=parent, device=dev, run_dir=self.run_dir)
        try:
            with self._forecast_lock:
                made = predict_file(request, self.run, surrogate, sol_text)
        except PredictInputError as exc:
            raise ToolError(str(exc)) from None
        if made.forecast.informative:
            with self._lock:
                self._pending[(made.problem_sha, made.candidate_sha, dev)] = (made.raw_p_faster, made.parent_sha, made.label)
        return made.reply()

    def _llm_surrogate(self, model: Any):
        with self._lock:
            if self._surrogate is None:  # taught what the run directory recorded before this server started
                self._surrogate = llm_surrogate(model, self.run)
            return self._surrogate

    def _observe(self, m: Measurement) -> None:
        """Tell the LLM surrogate what a candidate it forecast measured, so later forecasts are recalibrated."""
        if self._surrogate is None or not (m.status == MeasureStatus.ok and m.correct and m.timing_valid and m.speedup):
            return
        with self.run.connect() as db:
            row = db.execute("SELECT problem_sha, candidate_sha, device FROM measurements WHERE id = ?", (m.measurement_id,)).fetchone()
        if row is None:
            return
        with self._lock:
            pending = self._pending.pop((row[0], row[1], row[2]), None)
        if pending is None:
            return
        raw, parent_sha, label = pending
        parent_speedup = 1.0
        if parent_sha is not None:
            measured = self._usable(row[0], row[2], parent_sha)
            if not measured:
                return
            parent_speedup = measured[-1].speedup or 1.0
        with self._forecast_lock:
            self._surrogate.observe(raw, m.speedup / parent_speedup, label=label)


def build_server(run_dir: Optional[str] = None, device: str = "auto", budget: Optional[int] = None,
                 harness: Optional[HarnessConfig] = None, pool: Optional[WorkerPool] = None, chat_model: Any = AUTO,
                 sol_timeout_s: float = DEFAULT_TIMEOUT_S) -> KernelScoutMCP:
    """The MCP server for one run directory.

    budget: sets the run directory's cap (as `kscout measure --budget` does); None leaves it as it is.
    harness: how measurements check and time (the CLI's defaults when None); tools cannot change it.
    pool: a WorkerPool to share (the server starts its own, lazily, otherwise; `close()` stops it).
    chat_model: the LLM for predict; "auto" resolves the configured provider on first use, None means none.
    """
    return KernelScoutMCP(str(run_dir or DEFAULT_RUN_DIR), device=device, budget=budget, harness=harness, pool=pool,
                          chat_model=chat_model, sol_timeout_s=sol_timeout_s)


def ensure_cap(run_dir: str, budget: Optional[int], default_more: int = DEFAULT_SERVE_BUDGET) -> BudgetStatus:
    """The cap `kscout serve` runs under: --budget if given, else the directory's own, else `default_more` beyond what it has used."""
    if budget is not None and budget < 0:  # said before RunDir makes the folder, not after
        raise ValueError(f"--budget {budget}: a measurement budget cannot be negative; give 0 (measure nothing) or more")
    refuse_if_searched(Path(run_dir), cap=budget is not None)  # before the cap: a search there would go on under the new one
    ledger = Budget(RunDir(run_dir))
    if budget is not None:
        try:
            ledger.set_cap(budget)
        except CapBelowUsed as exc:
            raise ValueError(f"--budget {budget} is below the {exc.used} measurements {run_dir} has already used; give "
                             f"--budget {exc.used} or more, or use another run directory (--run-dir)") from None
    elif ledger.cap is None:
        ledger.set_cap(ledger.status().used + default_more)
    return ledger.status()


# -- transports ---------------------------------------------------------------------------------------------


class ServeConfigError(ValueError):
    """The server was asked to run in a way that is not allowed; the message says what to change."""


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(token: Optional[str], env: Optional[dict] = None) -> Optional[str]:
    value = token if token else (env if env is not None else os.environ).get(TOKEN_ENV)
    return value or None


def check_bind(host: str, allow_remote: bool, token: Optional[str]) -> None:
    """Loopback is always allowed; anything else needs --allow-remote and a token."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ServeConfigError(f"refusing to listen on {host}, which is not loopback: pass --allow-remote and set a token "
                               f"({TOKEN_ENV} or --token) to serve beyond this machine")
    if not token:
        raise ServeConfigError(f"refusing to listen on {host} without a token: set {TOKEN_ENV} (or --token); every request "
                               "must then carry 'Authorization: Bearer <token>'")
    if len(token) < 16:
        raise ServeConfigError("the token is too short for a server reachable from other machines; use at least 16 characters "
                               "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")


class BearerTokenMiddleware:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`, or it gets 401."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and not self._authorized(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            body = json.dumps({"error": "unauthorized", "error_description": "missing or wrong bearer token"}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="kernelscout"'),
            ]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                scheme, _, credential = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)
        return False


def http_app(server: MCPServer, host: str = "127.0.0.1", token: Optional[str] = None, path: str = "/mcp") -> Any:
    """The streamable HTTP ASGI app, behind the bearer-token check when a token is set."""
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    return BearerTokenMiddleware(app, token) if token else app


def configure_logging(level: str = "INFO") -> None:
    """Everything to stderr: in stdio mode stdout carries the protocol and nothing else."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


def serve(server: KernelScoutMCP, http: bool = False, host: str = "127.0.0.1", port: int = 8000, token: Optional[str] = None,
          allow_remote: bool = False, path: str = "/mcp", log_level: str = "INFO") -> None:
    """Run until the client goes away (stdio) or the process is stopped (HTTP)."""
    import anyio

    try:
        if not http:
            log.info("kernelscout MCP server on stdio, run directory %s", server.run_dir)
            anyio.run(server.run_stdio_async)
            return
        check_bind(host, allow_remote, token)
        import uvicorn

        app = http_app(server, host=host, token=token, path=path)
        where = f"[{host}]" if ":" in host else host
        log.info("kernelscout MCP server on http://%s:%d%s, run directory %s%s", where, port, path, server.run_dir,
                 ", bearer token required" if token else "")
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None, log_level=log_level.lower())).run()
    finally:
        server.close()


class _tool_errors:
    """Turn an exception inside a tool into a tool error that carries its message (the SDK would hide it)."""

    def __init__(self, tool: str):
        self.tool = tool

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, ToolError) or not isinstance(exc, Exception):
            return False
        if isinstance(exc, (InputFileError, ValueError, KeyError, FileNotFoundError)):
            log.info("%s: %s", self.tool, exc)
        else:
            log.exception("%s failed", self.tool)
        raise ToolError(f"{type(exc).__name__}: {exc}" if not isinstance(exc, InputFileError) else str(exc)) from exc


def _version() -> str:
    try:
        from kernelscout import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover
        return ""


__all__ = [
    "BearerTokenMiddleware", "BestCandidate", "CandidateEntry", "CandidateList", "KernelScoutMCP", "ServeConfigError",
    "build_server", "check_bind", "configure_logging", "ensure_cap", "http_app", "is_loopback", "resolve_token", "serve",
]
