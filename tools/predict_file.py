"""The predict tool for files: a candidate file's forecast speedup over its parent, before any measurement is spent.

The MCP server's `predict`, chat's `/predict` and `kscout predict` are this function with their own wrapping. The
learned surrogate forecasts configurations inside a search, never arbitrary source files, so a file's forecast comes
from an LLM surrogate or not at all: without one the answer is marked informative=false and says why, rather than
inventing a number. Every forecast is recorded in the run directory beside the measurements, so `forecast_check`
and `kscout show` score it once the file is measured, whichever face asked for it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.problem import load_candidate, load_problem
from kernelscout.tools.archive import Archive
from kernelscout.tools.measure import DEFAULT_RUN_DIR, resolve_device
from kernelscout.tools.predict import Forecast, SurrogateCost, uninformative_forecast
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES

AUTO = "auto"
RAW_KEY = "raw_p_faster"  # stored beside a recorded forecast: the LLM's own P(faster), before recalibration
NO_PROVIDER = ("no forecast: no LLM provider is configured, and the learned surrogate forecasts only tunable-parameter "
               "configurations of a search, not arbitrary files. Measure the candidate to know, or configure a provider "
               "(KSCOUT_PROVIDER=anthropic|openai|openai-compatible; see docs/llm.md) for LLM forecasts.")


class PredictFileRequest(BaseModel):
    problem: str = Field(description="KernelBench problem file (class Model), or a folder holding problem.py")
    candidate: str = Field(description="candidate module defining class ModelNew")
    parent: Optional[str] = Field(None, description="a candidate file already measured in this run; omitted: the problem's "
                                  "reference Model")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N: the device the forecast is for")
    run_dir: Optional[str] = Field(None, description="run directory the forecast is recorded in (default runs/scratch, as "
                                   "measure's), to be scored once the file is measured there")


class CandidateForecast(Forecast):
    """What every face of the predict tool answers: the forecast, and what the run already measured of this very file,
    so a caller that asks about a measured file is told the measured number beside the forecast."""

    measured_speedup: Optional[float] = Field(None, description="this file's latest verified speedup over the reference in "
                                              "this run, when it was measured before this call: a measurement, not a forecast")
    note: Optional[str] = Field(None, description="why this forecast will not be scored unless the file is measured again")


def already_measured_note(candidate: str, speedup: float) -> str:
    return (f"{Path(candidate).name} was already measured in this run ({speedup:.3f}x); a forecast is scored by a "
            "measurement after it, so this one is scored only if the file is measured again")


class PredictInputError(ValueError):
    """A request that cannot be forecast (its parent was never measured); the message says what to do."""


@dataclass
class FileForecast:
    """A forecast and what a caller that learns from outcomes (the MCP server's recalibration) needs to match it
    with the measurement that follows: the keys of the candidate's measurement and the surrogate's raw P(faster)."""

    forecast: Forecast
    problem_sha: str
    candidate_sha: str
    parent_sha: Optional[str]
    device: str
    label: str
    candidate: str  # the file as the caller named it
    raw_p_faster: Optional[float] = None
    measured_speedup: Optional[float] = None  # the file's latest usable measurement in this run, if it has one

    def reply(self) -> CandidateForecast:
        """The answer a caller sees; the note only beside a forecast that says something (one that says nothing is
        never scored, measured again or not)."""
        note = already_measured_note(self.candidate, self.measured_speedup) \
            if self.measured_speedup is not None and self.forecast.informative else None
        return CandidateForecast(**self.forecast.model_dump(), measured_speedup=self.measured_speedup, note=note)


def usable_measurements(run: RunDir, problem_sha: str, device: str, candidate_sha: Optional[str] = None) -> list[Measurement]:
    """Correct measurements with valid timing of a problem on a device (of one candidate file, when given), oldest first."""
    with run.connect() as db:
        sql = "SELECT result_json FROM measurements WHERE problem_sha = ? AND device = ? AND status = 'ok'"
        args: tuple = (problem_sha, device)
        if candidate_sha is not None:
            sql += " AND candidate_sha = ?"
            args += (candidate_sha,)
        rows = db.execute(sql + " ORDER BY id", args).fetchall()
    return [m for m in (Measurement.model_validate(json.loads(r[0])) for r in rows) if m.usable]


def request_run(request: PredictFileRequest) -> RunDir:
    """The run directory a request's forecast is recorded in: its own, else measure's default."""
    return RunDir(Path(request.run_dir or DEFAULT_RUN_DIR))


def predict(request: PredictFileRequest, chat_model: Any = AUTO) -> CandidateForecast:
    """The Python face (`ks.predict`): forecast with the configured LLM provider (or `chat_model`; None for none) and
    record the forecast in the request's run directory."""
    if isinstance(chat_model, str) and chat_model == AUTO:
        from kernelscout.agent.llm import make_chat_model

        chat_model = make_chat_model()
    run = request_run(request)
    return predict_file(request, run, surrogate=llm_surrogate(chat_model, run)).reply()


def llm_surrogate(chat_model: Any, run: Optional[RunDir] = None) -> Any:
    """The LLM surrogate over a chat model (None without one), taught what `run` recorded: every earlier file forecast
    that a measurement has since answered becomes a measured example in its prompt and a point of its recalibration,
    so a one-shot `kscout predict`, or a server started again, learns from the run as a long-lived server does."""
    if chat_model is None:
        return None
    from kernelscout.tools.surrogates.llm import LLMSurrogate

    surrogate = LLMSurrogate(chat_model)
    if run is not None and run.db_path.exists():
        for t in Archive(run).tool_forecasts():
            if t["measured_speedup"] is not None and t["parent_speedup"] and t["forecast"].get("informative"):
                surrogate.observe(t["forecast"].get(RAW_KEY), t["measured_speedup"] / t["parent_speedup"], label=t["label"])
    return surrogate


def predict_file(request: PredictFileRequest, run: Optional[RunDir] = None, surrogate: Any = None,
                 sol_text: Optional[str] = None) -> FileForecast:
    """Forecast `request.candidate` against its parent and record the forecast in `run` (by default the request's).

    `surrogate`: an LLMSurrogate (tools/surrogates/llm.py) kept by a caller that recalibrates it, or None when no
    provider is configured. `sol_text`: the problem's speed of light on the device, in words, when the caller has
    computed it (it costs a child process). Raises InputFileError for a bad file or device, PredictInputError for a
    parent that was never measured: both before the LLM is asked or anything is recorded."""
    prob = load_problem(request.problem)
    child = load_candidate(request.candidate)
    par = load_candidate(request.parent) if request.parent else None
    dev = resolve_device(request.device)
    run = run if run is not None else request_run(request)
    label = f"{Path(request.candidate).name} vs {Path(request.parent).name if request.parent else 'reference'}"
    parent_measured = usable_measurements(run, prob.sha, dev, par.sha) if par is not None else []
    if par is not None and not parent_measured:
        raise PredictInputError(f"parent {request.parent} has no valid measurement against {request.problem} on {dev} in this "
                                "run; measure it first, or omit parent to forecast against the problem's reference")
    measured = usable_measurements(run, prob.sha, dev, child.sha)
    out = FileForecast(forecast=uninformative_forecast("none", NO_PROVIDER, DEFAULT_EDGES, SurrogateCost(latency_ms=0.0)), problem_sha=prob.sha, candidate_sha=child.sha,
                       parent_sha=par.sha if par else None, device=dev, label=label, candidate=request.candidate,
                       measured_speedup=measured[-1].speedup if measured else None)
    parent_speedup = 1.0  # an uninformative forecast is never scored, whatever the parent
    if surrogate is not None:
        done = usable_measurements(run, prob.sha, dev)
        ref_times = [m.ref_runtime_ms for m in done if m.ref_runtime_ms]
        ref_ms = statistics.median(ref_times) if ref_times else None
        parent_speedup = (parent_measured[-1].speedup or 1.0) if par is not None else 1.0
        best = max((m.speedup or 0.0 for m in done), default=0.0)
        best = max(best, 1.0) if done else best  # the reference counts as the best so far, as in the search (graph.py)
        out.forecast = surrogate.forecast(
            child_source=child.source, parent_source=par.source if par is not None else prob.source,
            parent_ms=ref_ms / parent_speedup if ref_ms else None, parent_speedup=parent_speedup,
            incumbent_ratio=best / parent_speedup if best > 0 else None, device=dev,
            sol=sol_text or "unknown (not computed; the sol_bounds tool gives it)",
        )
        out.raw_p_faster = getattr(surrogate, "last_raw_p_faster", None)
    stored = out.forecast.model_dump() | ({RAW_KEY: out.raw_p_faster} if out.raw_p_faster is not None else {})
    Archive(run).record_tool_forecast(prob.sha, child.sha, out.parent_sha, dev, parent_speedup, stored, label)
    return out
