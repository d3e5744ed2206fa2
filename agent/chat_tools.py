"""The chat agent's tools: the same tool functions the MCP server exposes, plus file helpers for a conversation.

measure, predict, budget_status, sol_bounds, list_candidates, best_candidate and forecast_check are the MCP server's own
methods (`KernelScoutMCP`, used here without any transport), so a chat session and an IDE agent see the
same pydantic results, the same recorded-is-free rule and the same budget ledger. What a conversation needs
on top of that lives here: reading a file, diffing two candidates and writing a new candidate into the run
directory. None of them runs candidate code: files are only parsed (`load_candidate`), and measuring them
is the sandbox's job.

Every tool returns a :class:`ToolResult`; a failure is a result with the error text, never an exception,
because the model should read the message and correct itself, and the REPL should print it and go on.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field, ValidationError

from kernelscout.agent.llm import ToolSpec
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.sandbox.problem import InputFileError, load_candidate, load_problem
from kernelscout.tools.measure import would_charge
from kernelscout.tools.rundir import RunDir

log = logging.getLogger("kernelscout.chat")

CANDIDATES_DIR = "candidates"
MAX_READ_BYTES = 100_000
MAX_DIFF_LINES = 400
REFERENCE = "reference"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# -- arguments (what the model sends) -------------------------------------------------------------------------


class NoArgs(BaseModel):
    pass


class MeasureArgs(BaseModel):
    candidate: str = Field(description="candidate file (class ModelNew): a path, or the name given to write_candidate")
    again: bool = Field(False, description="spend a new measurement even though this exact file was measured in this run")


class PredictArgs(BaseModel):
    candidate: str = Field(description="candidate file to forecast: a path, or the name given to write_candidate")
    parent: Optional[str] = Field(None, description="a candidate already measured in this run to compare against; "
                                                    "omitted: the problem's reference Model")


class DiffArgs(BaseModel):
    a: str = Field(description="first file: a path, a name given to write_candidate, or 'reference' for the problem")
    b: str = Field(description="second file, as for a")


class ReadArgs(BaseModel):
    path: str = Field(description="a .py file: a path, a name given to write_candidate, or 'reference' for the problem")


class WriteArgs(BaseModel):
    name: str = Field(description="short file name for the new candidate, e.g. 'splitk_v1' (letters, digits, _ . -)")
    source: str = Field(description="the complete module: imports and class ModelNew(nn.Module) with the reference's "
                                    "constructor and forward signature")


# -- results of the chat-only tools ----------------------------------------------------------------------------


class FileText(BaseModel):
    path: str
    lines: int
    text: str


class DiffResult(BaseModel):
    a: str
    b: str
    identical: bool
    added: int = Field(description="lines only in b")
    removed: int = Field(description="lines only in a")
    diff: str = Field(description="unified diff, cut after a few hundred lines")
    truncated: bool = False


class WrittenCandidate(BaseModel):
    name: str
    path: str
    sha: str
    lines: int
    message: str


class ToolResult(BaseModel):
    """One tool call as it happened: what the model (or a slash command) asked and what came back."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    kind: str = Field("", description="the result's model name: Measurement, Forecast, BudgetStatus, ...")
    result: Optional[dict[str, Any]] = None
    error: Optional[str] = None
    declined: bool = Field(False, description="a measurement the user said no to: not run, nothing spent")

    def for_model(self) -> str:
        """The text the model reads: the result as JSON, or the error."""
        if not self.ok:
            return f"Error: {self.error}"
        return json.dumps(self.result, default=str)


class ToolFailure(Exception):
    """A tool could not do what was asked; the message says why and what to do instead."""


# -- the toolbox -----------------------------------------------------------------------------------------------


class ChatToolbox:
    """The tools of one chat session: one problem, one run directory, one device, one warm worker pool."""

    def __init__(self, problem: str | Path, run_dir: str | Path, device: str = "auto", harness: Optional[HarnessConfig] = None,
                 pool: Optional[WorkerPool] = None, predict_model: Any = None):
        try:
            from kernelscout.tools.mcp_server import build_server
        except ImportError as exc:  # the SDK is an optional extra; its message says what to install
            raise ToolFailure(str(exc)) from exc

        self.problem = Path(load_problem(problem).path)
        self.run = RunDir(run_dir)
        self.candidates_dir = self.run.path / CANDIDATES_DIR
        self.device = device
        # predict_model=None: no LLM, so predict says honestly that it has no forecast (the server's rule)
        self._server = build_server(str(self.run.path), device=device, harness=harness, pool=pool, chat_model=predict_model)
        # tool name -> (arguments model, method name, description); methods are looked up per call
        self._tools: dict[str, tuple[type[BaseModel], str, str]] = {
            "predict": (PredictArgs, "predict", (
                "Forecast the candidate's speedup over the reference (or over a measured parent) before spending a "
                "measurement: P(faster), expected speedup, confidence. Costs no measurement.")),
            "measure": (MeasureArgs, "measure", (
                "Check the candidate against the reference and time both in the sandbox. Spends ONE measurement of the "
                "hard budget (a file already measured in this run is free unless again=true). Status ok with correct=true "
                "and timing_valid=true is the only usable result.")),
            "budget_status": (NoArgs, "budget", "The measurement budget: cap, used, in flight, remaining."),
            "sol_bounds": (NoArgs, "sol", (
                "Speed-of-light bound of the problem on this device: the least time any kernel could take. No measurement.")),
            "list_candidates": (NoArgs, "list_candidates", (
                "Every candidate measured (or searched) in this run directory with its status and measured speedup.")),
            "best_candidate": (NoArgs, "best", "The fastest candidate measured correct with valid timing in this run."),
            "forecast_check": (NoArgs, "forecast_check", (
                "How well the forecasts so far (predict calls, a search's forecasts) matched the measurements that "
                "followed them: Brier score, directions right, rank correlation. Use it to judge how far to trust predict.")),
            "diff": (DiffArgs, "diff", "Unified diff of two files (candidates or 'reference')."),
            "read_file": (ReadArgs, "read_file", "The source of a .py file (a candidate, an example, or 'reference')."),
            "write_candidate": (WriteArgs, "write_candidate", (
                "Save a new candidate module in the run directory (never overwrites) and check its structure "
                "without running it. Returns its path for predict and measure.")),
        }

    def close(self) -> None:
        """Stop the worker pool the toolbox started (not one passed in)."""
        self._server.close()

    # -- for the model -----------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self, exclude: tuple[str, ...] = ()) -> list[ToolSpec]:
        return [ToolSpec(name=name, description=desc, parameters=args.model_json_schema())
                for name, (args, _, desc) in self._tools.items() if name not in exclude]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool by name; never raises for bad arguments or a failing tool."""
        if name not in self._tools:
            return ToolResult(name=name, arguments=arguments, ok=False,
                              error=f"unknown tool {name!r}; the tools are: {', '.join(self._tools)}")
        args_model, method, _ = self._tools[name]
        try:
            args = args_model.model_validate(arguments or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return ToolResult(name=name, arguments=arguments, ok=False, error=f"bad arguments for {name}: {problems}")
        try:
            value = getattr(self, method)(**args.model_dump())
        except ToolFailure as exc:
            return ToolResult(name=name, arguments=arguments, ok=False, error=str(exc))
        except Exception as exc:  # the MCP methods raise ToolError with the message; anything else is logged too
            if type(exc).__name__ != "ToolError":
                log.exception("chat tool %s failed", name)
            return ToolResult(name=name, arguments=arguments, ok=False, error=str(exc) or type(exc).__name__)
        return ToolResult(name=name, arguments=arguments, ok=True, kind=type(value).__name__,
                          result=value.model_dump(mode="json", exclude_none=True))

    # -- the tools ---------------------------------------------------------------------------------------------

    def measure(self, candidate: str, again: bool = False):
        return self._server.tool_measure(str(self.problem), str(self.resolve(candidate)), again=again)

    def predict(self, candidate: str, parent: Optional[str] = None):
        parent_path = str(self.resolve(parent)) if parent and parent != REFERENCE else None
        return self._server.tool_predict(str(self.problem), str(self.resolve(candidate)), parent=parent_path)

    def budget(self):
        return self._server.tool_budget_status()

    def sol(self):
        return self._server.tool_sol_bounds(str(self.problem))

    def list_candidates(self):
        return self._server.tool_list_candidates(str(self.problem))

    def best(self):
        return self._server.tool_best_candidate(str(self.problem))

    def forecast_check(self):
        return self._server.tool_forecast_check()

    def read_file(self, path: str) -> FileText:
        file = self._readable(path)
        text = file.read_text(errors="replace")
        return FileText(path=str(file), lines=text.count("\n") + 1, text=text)

    def diff(self, a: str, b: str) -> DiffResult:
        fa, fb = self._readable(a), self._readable(b)
        la, lb = fa.read_text(errors="replace").splitlines(), fb.read_text(errors="replace").splitlines()
        lines = list(difflib.unified_diff(la, lb, fromfile=_label(a, fa), tofile=_label(b, fb), lineterm=""))
        added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
        removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
        truncated = len(lines) > MAX_DIFF_LINES
        text = "\n".join(lines[:MAX_DIFF_LINES]) + (f"\n... {len(lines) - MAX_DIFF_LINES} more lines" if truncated else "")
        return DiffResult(a=str(fa), b=str(fb), identical=not lines, added=added, removed=removed, diff=text, truncated=truncated)

    def write_candidate(self, name: str, source: str) -> WrittenCandidate:
        stem = name[:-3] if name.endswith(".py") else name
        if not _NAME.match(stem):
            raise ToolFailure(f"candidate name {name!r} is not usable: use letters, digits, '_', '.' or '-' (at most 64), "
                              "e.g. 'splitk_v1'")
        self.candidates_dir.mkdir(parents=True, exist_ok=True)
        path = self.candidates_dir / f"{stem}.py"
        if path.exists():
            if path.read_text(errors="replace") == source:
                checked = load_candidate(path)
                return WrittenCandidate(name=stem, path=str(path), sha=checked.sha, lines=source.count("\n") + 1,
                                        message="already written with this exact source")
            raise ToolFailure(f"a different candidate named {stem!r} already exists ({path}); choose a new name, so every "
                              "measured file keeps the source it was measured with")
        tmp = path.with_name(f".{stem}.{os.getpid()}.tmp.py")
        tmp.write_text(source)
        try:
            checked = load_candidate(tmp)  # parses it and looks for ModelNew; nothing runs (sha is of the source alone)
        except InputFileError as exc:
            tmp.unlink(missing_ok=True)
            raise ToolFailure(f"not written: {str(exc).replace(str(tmp), stem + '.py')}") from exc
        os.replace(tmp, path)
        return WrittenCandidate(name=stem, path=str(path), sha=checked.sha, lines=source.count("\n") + 1,
                                message=f"written to {path}; pass this path (or the name {stem!r}) to predict or measure")

    # -- helpers -----------------------------------------------------------------------------------------------

    def resolve(self, ref: str) -> Path:
        """A path as given, 'reference' for the problem, or the name of a candidate written in this session."""
        if ref == REFERENCE:
            return self.problem
        path = Path(ref).expanduser()
        if path.exists():
            return path.resolve()
        for guess in (self.candidates_dir / ref, self.candidates_dir / f"{ref}.py"):
            if guess.is_file():
                return guess
        return path  # missing: the tool's own check says "no such file"

    def would_spend(self, candidate: str, again: bool = False) -> bool:
        """Whether measuring this file now would spend budget (so asking the user first means something): the
        measure tool's own rule (`measure.would_charge`)."""
        return would_charge(self.run, str(self.problem), str(self.resolve(candidate)), self.device, again=again)

    def _readable(self, ref: str) -> Path:
        path = self.resolve(ref)
        if not path.is_file():
            raise ToolFailure(f"{ref}: no such file (give a path, a name passed to write_candidate, or 'reference')")
        if path.suffix != ".py":
            raise ToolFailure(f"{ref}: only .py files can be read here")
        if path.stat().st_size > MAX_READ_BYTES:
            raise ToolFailure(f"{ref}: larger than {MAX_READ_BYTES // 1000} kB; not shown")
        return path


def _label(ref: str, path: Path) -> str:
    return REFERENCE if ref == REFERENCE else str(path)
