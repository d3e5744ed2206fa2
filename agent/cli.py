"""The `kscout` command line: a thin adapter over the tools in kernelscout.tools."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelscout import __version__
from kernelscout.agent.cli_errors import (fail, finish_without_interruption, interrupt_unhandled, interrupted_code, running_as_command,
                                          stop_on_sigterm, validation_message)
from kernelscout.agent.search_config import announce_defaults, help_default, search_config
from kernelscout.sandbox import harness_defaults
from kernelscout.sandbox.objectives import Objective

app = typer.Typer(
    name="kscout",
    help="Make GPU kernels faster while spending as few real measurements as possible.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

EXIT_CODES = {"ok": 0, "incorrect": 1, "runtime_error": 1, "timeout": 1, "crashed": 1, "compile_error": 2, "invalid_problem": 2, "run_dir_unusable": 2, "budget_exhausted": 3}


def _version(value: bool) -> None:
    if value:
        print(f"kscout {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version")) -> None:
    pass


@app.command()
def measure(
    problem: str = typer.Argument(..., help="KernelBench problem file (class Model, get_inputs, get_init_inputs), or a folder holding problem.py"),
    candidate: str = typer.Argument(..., help="candidate module defining class ModelNew"),
    device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda, cuda:N or an installed device plugin's name {help_default('device')}"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run directory holding the budget ledger \\[default: runs/scratch]"),
    budget: Optional[int] = typer.Option(None, min=1, help="measurement cap for the run directory"),
    again: bool = typer.Option(False, "--again", help="measure even if this exact candidate was already measured in the run"),
    timeout: float = typer.Option(harness_defaults.TIMEOUT_S, help="seconds allowed for running the candidate (checks and timing), besides what the reference's own calls take"),
    compile_timeout: float = typer.Option(
        harness_defaults.COMPILE_TIMEOUT_S, "--compile-timeout", help="seconds allowed for importing and constructing the candidate (a Triton kernel builds at its first launch, under --timeout)"),
    timing_budget: float = typer.Option(harness_defaults.TIMING_BUDGET_S, "--timing-budget", help="timed seconds to aim for, both sides together"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Check a candidate against its problem and time both in one sandboxed session."""
    from pydantic import ValidationError

    from pathlib import Path

    from kernelscout.sandbox.harness import HarnessConfig
    from kernelscout.tools.measure import DEFAULT_RUN_DIR, MeasureRequest, refused_folder
    from kernelscout.tools.measure import measure as run_measure

    device = search_config(as_json).pick("device", device)
    try:
        request = MeasureRequest(
            problem=problem, candidate=candidate, device=device, run_dir=run_dir, budget=budget, again=again,
            harness=HarnessConfig(timeout_s=timeout, compile_timeout_s=compile_timeout, timing_budget_s=timing_budget),
        )
    except ValidationError as exc:
        fail(validation_message(exc, _MEASURE_FLAGS), as_json)
    if not as_json and _files_pass_static_checks(problem, candidate) and not refused_folder(Path(run_dir or DEFAULT_RUN_DIR)):
        # else the error comes alone
        err.print(f"[dim]measuring {candidate} against {problem} ...[/dim]", soft_wrap=True)
    try:
        result = run_measure(request)
    except KeyboardInterrupt:  # typer would exit 130 without a word
        where = request.run_dir or "runs/scratch"
        fail(f"interrupted: the measurement stays reserved in {where}'s ledger, and the same `kscout measure` command "
             "takes it up without charging it again", as_json, code=interrupted_code())
    if as_json:
        print(result.model_dump_json())
    elif result.measurement_id is None and not result.charged and result.status.value in ("compile_error", "invalid_problem", "run_dir_unusable"):
        fail(result.message, as_json)  # a file or device refused before anything ran: a usage error, not a measurement
    else:
        _print_measurement(result)
    raise typer.Exit(EXIT_CODES.get(result.status.value, 1))


_MEASURE_FLAGS = {"timeout_s": "--timeout", "compile_timeout_s": "--compile-timeout", "timing_budget_s": "--timing-budget",
                  "budget": "--budget"}


def _files_pass_static_checks(problem: str, candidate: str) -> bool:
    from kernelscout.sandbox.problem import InputFileError, load_candidate, load_problem

    try:
        load_problem(problem)
        load_candidate(candidate)
    except InputFileError:
        return False
    return True


def _print_measurement(m) -> None:
    colour = "green" if m.status.value == "ok" else "red"
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("status", f"[{colour}]{m.status.value}[/{colour}]")
    table.add_row("correct", str(m.correct))
    if m.runtime_ms is not None:
        table.add_row("candidate", f"{m.runtime_ms:.4g} ms (IQR {m.candidate_timing.iqr_ms:.3g}, {m.candidate_timing.repeats} rounds)")
        table.add_row("reference", f"{m.ref_runtime_ms:.4g} ms (IQR {m.reference_timing.iqr_ms:.3g})")
        table.add_row("speedup", f"{m.speedup:.3f}x" if m.speedup else "-")
    table.add_row("timing valid", "yes" if m.timing_valid else f"[yellow]no[/yellow]: {m.timing_invalid_reason or 'not timed'}")
    table.add_row("charged", str(m.charged))
    table.add_row("device", m.device)
    for warning in m.warnings:
        table.add_row("[yellow]warning[/yellow]", escape(warning))
    out.print(table)
    if m.status.value != "ok":
        out.print(m.message, markup=False, highlight=False, soft_wrap=True)


@app.command()
def budget(
    run_dir: str = typer.Argument(..., help="run directory"),
    set_cap: Optional[int] = typer.Option(None, "--set", min=0, help="set a new measurement cap"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show (or change) the measurement budget of a run directory."""
    from pathlib import Path

    from kernelscout.agent.run_view import RunViewError, open_run
    from kernelscout.tools.budget import Budget, CapBelowUsed
    from kernelscout.tools.rundir import RunDir

    # Reading never creates a run directory (a mistyped path would read as "uncapped"); setting a cap on a
    # new one does, so a cap can be set before the first `kscout measure`, and says so.
    path = Path(run_dir)
    created = set_cap is not None and (not path.exists() or (path.is_dir() and not any(path.iterdir())))
    try:
        ledger = Budget(RunDir(run_dir) if created else open_run(run_dir, read_only=False))
    except RunViewError as exc:
        fail(str(exc), as_json)
    if created and not as_json:
        err.print(f"created run directory {escape(run_dir)}")
    if set_cap is not None:
        try:
            ledger.set_cap(set_cap)
        except CapBelowUsed as exc:
            fail(f"--set {set_cap} is below the {exc.used} measurements already used; --set {exc.used} stops any further "
                 "measurement, a larger cap allows more", as_json)
    status = ledger.status()
    if as_json:
        print(status.model_dump_json())
    else:
        cap = "uncapped" if status.cap is None else str(status.cap)
        out.print(f"measurements: {status.used} used of {cap}" + (f", {status.reserved} in flight" if status.reserved else "")
                  + ("" if status.remaining is None else f", {status.remaining} left"))


@app.command()
def optimize(
    problem: Optional[str] = typer.Argument(None, help="KernelBench problem file, or a folder holding problem.py"),
    space: Optional[str] = typer.Option(None, "--space", help="search a recorded Kernel Tuner space on the replay device instead (a Kernel Tuner cache or T4 results file, or a name such as convolution_A100)"),
    budget: Optional[int] = typer.Option(None, help=f"hard cap on measurements {help_default('budget')}"),
    policy: Optional[str] = typer.Option(None, help=f"auto, tuner, llm or an installed plugin's {help_default('policy')}"),
    surrogate: Optional[str] = typer.Option(None, help=f"auto, learned, llm, none or an installed plugin's {help_default('surrogate')}"),
    device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda, cuda:N or an installed device plugin's name {help_default('device')}"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run directory \\[default: runs/<name>-<time>]"),
    seed: int = typer.Option(0, help="seed of the search policy (0 or more)"),
    proposals: Optional[int] = typer.Option(None, help=f"candidates proposed per iteration {help_default('proposals')}"),
    patience: Optional[int] = typer.Option(None, help=f"stop after this many measurements without a new best (0: never) {help_default('patience')}"),
    solved_chance: Optional[float] = typer.Option(None, "--solved-chance", help="a recorded space: stop once the surrogate gives the "
                                                  "configurations left less than this chance, together, of beating the best by "
                                                  f"more than 2 % (0: measure to the budget) {help_default('solved_chance')}"),
    max_wall: Optional[float] = typer.Option(None, "--max-wall", help="stop after this many seconds"),
    max_device_s: Optional[float] = typer.Option(None, "--max-device-seconds", help="stop after this much measurement time on the device"),
    max_usd: Optional[float] = typer.Option(None, "--max-usd", help="stop when LLM calls have cost this much"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="stop when LLM calls have used this many tokens"),
    warm_start: list[str] = typer.Option([], "--warm-start", help="recorded space of the same kernel on another device (repeatable)"),
    objective: Objective = typer.Option("file", "--objective", help="a recorded space: file (the objective the cache names, a throughput "
                                  "such as GFLOP/s followed for the same work per call) or time (the shortest recorded time per call)"),
    start: list[str] = typer.Option([], "--start", help="your own kernel (a ModelNew file) to measure first and tune from (repeatable)"),
    history: list[str] = typer.Option([], "--history", help="folder of earlier runs (e.g. runs/) whose measurements on this device "
                                      "make the learned surrogate's prior on a code problem (repeatable; none: no prior) "
                                      "\\[default: no prior, or \\[search] history in kscout.toml]"),
    rewrites: list[str] = typer.Option([], "--rewrites", help="generic rewrites the offline tuner may try: all (the default), "
                                       "none (tune only the TUNABLE knobs of your --start kernels), or names, comma-separated: "
                                       "torch_compile, jit_freeze, channels_last, cuda_graphs, inference_mode"),
    confirm: Optional[int] = typer.Option(None, "--confirm", help="measurements kept to re-measure the best once the search stops; "
                                          "the re-measurement is what is reported (default: 1 for a problem with --budget 5 or more, else 0)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="measure on N workers at once (local processes; with --ray, N actors)"),
    ray: Optional[str] = typer.Option(None, "--ray", help="measure on a Ray cluster: auto, local, or its address (needs kernelscout\\[ray])"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end"),
) -> None:
    """Search for a faster verified kernel within a hard measurement budget."""
    from kernelscout.agent.runner import OptimizeError, SearchInterrupted, start_search

    cfg = search_config(as_json)
    budget, policy, surrogate = cfg.pick("budget", budget), cfg.pick("policy", policy), cfg.pick("surrogate", surrogate)
    device, proposals, patience = cfg.pick("device", device), cfg.pick("proposals", proposals), cfg.pick("patience", patience)
    confirm, workers = cfg.pick("confirm", confirm), cfg.pick("workers", workers)
    history = history or (None if space else cfg.pick("history", None))  # a file's history is for code problems only
    solved_chance = cfg.pick("solved_chance", solved_chance) if space else solved_chance  # start_search refuses it on code
    announce_defaults(cfg, as_json)
    try:
        result = start_search(problem=problem, space=space, budget=budget, policy=policy, surrogate=surrogate, device=device,
                              run_dir=run_dir, seed=seed, proposals=proposals, patience=patience, max_wall=max_wall,
                              warm_start=warm_start, quiet=as_json, max_device_s=max_device_s, max_usd=max_usd,
                              max_llm_tokens=max_tokens, workers=workers, ray=ray, start=start, confirm=confirm,
                              history=history or None, rewrites=rewrites or None, solved_chance=solved_chance,
                              objective=objective)
    except SearchInterrupted as exc:
        _interrupted(exc, as_json)
    except OptimizeError as exc:
        fail(str(exc), as_json)
    _finish_search(result, as_json)


@app.command()
def resume(
    run_dir: str = typer.Argument(..., help="run directory of an interrupted or finished search"),
    max_usd: Optional[float] = typer.Option(None, "--max-usd", help="a new LLM cost limit for this search"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="a new LLM token limit"),
    max_wall: Optional[float] = typer.Option(None, "--max-wall", help="a new wall-clock limit in seconds (the time "
                                                                      "between a stop and this resume does not count)"),
    max_device_s: Optional[float] = typer.Option(None, "--max-device-seconds", help="a new limit on measurement time"),
    patience: Optional[int] = typer.Option(None, help="a new number of measurements without a new best to stop after (0: never)"),
    solved_chance: Optional[float] = typer.Option(None, "--solved-chance", help="a recorded space: a new chance under which the "
                                                  "search stops as solved (lower it, or 0, to go on after that stop)"),
    max_measurements: Optional[int] = typer.Option(None, "--max-measurements", help="a run of many problems: a new global "
                                                   "measurement cap (a single search's budget: `kscout budget RUN_DIR --set N`)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end"),
) -> None:
    """Continue a search after an interruption: no measurement lost, none repeated, no budget spent twice.

    A search that stopped at a limit goes on when the limit is given here higher than it was (--solved-chance: lower,
    or 0); one that spent its measurement budget goes on after `kscout budget RUN_DIR --set N`. A run of many problems (`kscout run`) takes new
    global caps (--max-wall, --max-measurements, --max-usd, --max-tokens), and a problem skipped for one runs."""
    from kernelscout.agent.runner import OptimizeError, SearchInterrupted, resume_search

    from kernelscout.agent.headless import is_headless_run

    limits = {"max_usd": max_usd, "max_llm_tokens": max_tokens, "max_wall": max_wall, "max_device_s": max_device_s, "patience": patience,
              "solved_chance": solved_chance}
    if is_headless_run(run_dir):  # a multi-problem `kscout run`: resume it as a whole
        from kernelscout.agent.cli_run import resume_run

        if max_device_s is not None or patience is not None or solved_chance is not None:
            fail(f"{run_dir} is a run of many problems, whose per-problem limits are fixed when it starts; resume it "
                 "without --max-device-seconds, --patience or --solved-chance (its global caps can change: --max-wall, --max-measurements, "
                 "--max-usd, --max-tokens)", as_json)
        return resume_run(run_dir, as_json, max_wall_s=max_wall, max_measurements=max_measurements, max_usd=max_usd,
                          max_tokens=max_tokens)
    if max_measurements is not None:
        fail(f"--max-measurements is a cap over the problems of a `kscout run`; {run_dir} is one search, whose budget "
             f"changes with `kscout budget {run_dir} --set N`", as_json)
    try:
        result = resume_search(run_dir, quiet=as_json, **limits)
    except SearchInterrupted as exc:
        _interrupted(exc, as_json)
    except OptimizeError as exc:
        fail(str(exc), as_json)
    _finish_search(result, as_json)


def _interrupted(exc, as_json: bool) -> None:
    """Ctrl-C: say where the run stands and how to go on (stdout stays JSON under --json)."""
    if as_json:
        import shlex

        print(json.dumps({"status": "interrupted", "run_dir": str(exc.run_dir), "measurements_used": exc.used,
                          "budget": exc.cap, "message": str(exc), "continue_with": f"kscout resume {shlex.quote(str(exc.run_dir))}"}))
    err.print(str(exc), soft_wrap=True, highlight=False)
    raise typer.Exit(interrupted_code())


def _finish_search(result, as_json: bool) -> None:
    finish_without_interruption()  # the result is complete and stored: what is left is to say it
    if as_json:
        print(result.model_dump_json())
    else:
        _print_search(result)
    if result.status == "failed":  # the problem itself could not be measured: unusable input
        raise typer.Exit(2)


def _print_search(result) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # paths and commands are folded onto more lines, never cut short with "…"
    table.add_row("result", escape(result.message) if result.status == "finished" else f"[red]{escape(result.message)}[/red]")
    table.add_row("stopped because", escape(result.stop_reason or "-"))
    table.add_row("measurements", str(result.measurements_used))
    per = f" ({result.considered_per_measurement:.1f} per measurement)" if result.measurements_used else ""
    table.add_row("considered", f"{result.candidates_considered}{per}")
    if result.llm_tokens:  # in `kscout show`'s words: calls, tokens in and out, and which models were counted at $0
        from kernelscout.agent.llm_pricing import stored_usage, usage_line
        from kernelscout.tools.rundir import RunDir

        usage = stored_usage(RunDir(result.run_dir))
        table.add_row("LLM", escape(usage_line(usage)) if usage else f"{result.llm_tokens:,} tokens, ${result.llm_usd:.4f}")
    if result.best_path:
        table.add_row("best kernel", result.best_path)
    table.add_row("run directory", result.run_dir)
    for note in result.notes:  # said at the start too; repeated here, where a long search's output ends
        table.add_row("[yellow]note[/yellow]", escape(note))
    out.print(table)
    if result.continue_with:  # one line the terminal may wrap, so it can be copied whole
        out.print(f"to search on: {escape(result.continue_with)}", soft_wrap=True, highlight=False)


def _register_tool_commands() -> None:
    from kernelscout.agent import cli_serve, cli_sol, cli_surrogate

    cli_sol.register(app)
    from kernelscout.agent import cli_predict; cli_predict.register(app)  # noqa: E702
    cli_surrogate.register(app)
    cli_serve.register(app)
    from kernelscout.agent import cli_chat; cli_chat.register(app)  # noqa: E702
    from kernelscout.agent import cli_run; cli_run.register(app)  # noqa: E702
    from kernelscout.agent import cli_bench; cli_bench.register(app)  # noqa: E702
    from kernelscout.agent import cli_show; cli_show.register(app)  # noqa: E702
    from kernelscout.agent import cli_slot; cli_slot.register(app)  # noqa: E702


_register_tool_commands()


def main() -> None:
    stop_on_sigterm()
    running_as_command()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(interrupted_code())
    except SystemExit as exc:
        if interrupt_unhandled(exc.code):  # say so, and 143 after SIGTERM
            err.print("interrupted")
            sys.exit(interrupted_code())
        finish_without_interruption()
        raise


if __name__ == "__main__":
    main()
