"""`kscout predict`: the predict tool for files as a command, beside `kscout measure`.

It is the function the MCP server's `predict` and chat's `/predict` call (tools/predict_file.py), so a forecast asked
for from a script is recorded where `kscout measure` will put the measurement (runs/scratch unless --run-dir says
otherwise), and `kscout show` scores it once the file is measured. It never measures and never spends budget.
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from kernelscout.agent.search_config import help_default, search_config

_out = Console(highlight=False)


def render_forecast(f) -> str:
    """A forecast in a few lines: what the chance of a speedup is and how sure the surrogate is, then the bins."""
    if not f.informative:
        return f.rationale if f.rationale.startswith("no forecast") else f"no forecast ({f.surrogate}): {f.rationale}"
    lines = [f"P(faster) {f.p_faster:.2f}, confidence {f.confidence:.2f} ({f.surrogate})"]
    if f.expected_speedup is not None:
        spread = (f" (80 %: {f.speedup_interval_80[0]:.2f}x to {f.speedup_interval_80[1]:.2f}x)"
                  if f.speedup_interval_80 else "")
        lines.append(f"expected speedup over the parent {f.expected_speedup:.2f}x{spread}")
    if f.p_beats_incumbent is not None:
        lines.append(f"P(beats the best measured so far) {f.p_beats_incumbent:.2f}")
    lines.append("bins: " + ", ".join(f"{label} {p:.2f}" for label, p in zip(f.bin_labels, f.bin_probs)))
    if f.rationale:
        lines.append(f"why: {f.rationale}")
    lines.append("a forecast, not a measurement: `kscout measure` gives the speedup")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `predict` command to a typer app."""

    @app.command("predict")
    def predict(
        problem: str = typer.Argument(..., help="KernelBench problem file (class Model, get_inputs, get_init_inputs), or a folder holding problem.py"),
        candidate: str = typer.Argument(..., help="candidate module defining class ModelNew"),
        parent: Optional[str] = typer.Option(None, help="a candidate file already measured in the run directory (default: the problem's reference)"),
        device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda or cuda:N {help_default('device')}"),
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run directory the forecast is recorded in, to be scored once the file is measured \\[default: runs/scratch]"),
        provider: Optional[str] = typer.Option(None, help="anthropic, openai or openai-compatible (see docs/llm.md)"),
        model: Optional[str] = typer.Option(None, help="model name"),
        base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1"),
        as_json: bool = typer.Option(False, "--json", help="print the forecast as one JSON object"),
    ) -> None:
        """Forecast a candidate's speedup over its parent without measuring it (needs an LLM provider to say anything)."""
        from pydantic import ValidationError

        from kernelscout.agent.cli_errors import fail, validation_message
        from kernelscout.agent.llm_config import LLMConfig, LLMConfigError
        from kernelscout.agent.llm_pricing import BudgetExceeded
        from kernelscout.sandbox.problem import InputFileError
        from kernelscout.tools.predict_file import PredictFileRequest, PredictInputError, llm_surrogate, predict_file, request_run
        from kernelscout.tools.rundir import RunDirError

        device = search_config(as_json).pick("device", device)
        try:
            flags = LLMConfig(provider=provider, model=model, base_url=base_url)
        except ValidationError as exc:
            fail(validation_message(exc, {"provider": "--provider", "model": "--model", "base_url": "--base-url"}), as_json)
        has_flags = any(v is not None for v in (provider, model, base_url))
        try:
            from kernelscout.agent.llm import make_chat_model

            chat_model = make_chat_model(flags if has_flags else None)
        except (LLMConfigError, ValueError) as exc:
            fail(str(exc), as_json)
        try:
            request = PredictFileRequest(problem=problem, candidate=candidate, parent=parent, device=device, run_dir=run_dir)
            run = request_run(request)
            made = predict_file(request, run, surrogate=llm_surrogate(chat_model, run))
        except (InputFileError, PredictInputError, RunDirError, LLMConfigError, BudgetExceeded) as exc:
            # a provider that refuses the call (401, 404, an unknown model) or a spending cap: what to fix, nothing recorded
            fail(str(exc), as_json)
        if as_json:
            print(made.reply().model_dump_json())
            return
        _out.print(escape(render_forecast(made.forecast)), soft_wrap=True)
        reply = made.reply()
        if reply.note:
            _out.print(escape(f"note: {reply.note} (kscout measure --again)"), soft_wrap=True)
