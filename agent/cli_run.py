"""`kscout run`: many problems in one headless run, and `kscout resume` for such a run.

Kept out of agent/cli.py; cli.py calls `register(app)`, and its `resume` command hands a run
directory holding a manifest to `resume_run`. The work itself is in agent/headless.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kernelscout.agent.cli_errors import fail, interrupted_code, validation_message
from kernelscout.agent.search_config import announce_defaults, help_default, search_config
from kernelscout.agent.search_spec import SOLVED_CHANCE
from kernelscout.tools.runlock import holder
from kernelscout.sandbox.objectives import Objective

err = Console(stderr=True)
out = Console()


FLAGS = {"budget": "--budget", "max_wall_s": "--max-wall", "max_measurements": "--max-measurements", "max_usd": "--max-usd",
         "max_tokens": "--max-tokens", "problem_wall_s": "--problem-wall", "proposals": "--proposals", "patience": "--patience",
         "confirm": "--confirm", "seed": "--seed", "solved_chance": "--solved-chance"}


def _check_rewrite_names(rewrites: list[str]) -> None:
    """Misspelt rewrite names are refused before the night starts; whether `none` leaves each problem something to
    tune (a --start kernel with TUNABLE knobs) is each problem's own check."""
    from kernelscout.agent.runner import check_rewrites

    names = [n for item in rewrites for n in item.split(",") if n.strip() and n.strip().lower() not in ("all", "none")]
    if names:
        check_rewrites(names, "tuner", [], "cuda")


def _exit_code(summary) -> int:
    """0: every problem finished; 1: some problem failed, was skipped or is still pending."""
    return 0 if summary.status == "complete" and set(summary.counts) <= {"finished"} else 1


def print_summary(summary, console: Optional[Console] = None) -> None:
    from kernelscout.agent.headless import HEADERS, summary_rows

    console = console or (out if out.is_terminal else Console(width=150))  # a pipe or a log file gets the full table
    table = Table(title=f"kernelscout run: {Path(summary.run_dir).name} ({summary.status})", title_justify="left")
    for h in HEADERS:
        table.add_column(h, justify="right" if h in ("best speedup", "measurements", "considered", "wall") else "left",
                         overflow="fold")
    colours = {"finished": "green", "failed": "red", "skipped": "yellow"}
    for o, row in zip(summary.problems, summary_rows(summary)):
        c = colours.get(o.status)
        table.add_row(*[row[0], f"[{c}]{row[1]}[/{c}]" if c else row[1], *row[2:]])
    console.print(table)
    fast = "  ".join(f"{k} {v:.3f}" for k, v in summary.fast_p.items())
    console.print(f"{fast}  geomean speedup {summary.geomean_speedup:.3f}x", highlight=False)
    console.print(f"{summary.measurements_used} measurements, {summary.candidates_considered} candidates considered, "
                  f"{summary.wall_s:.0f} s of running" + (f", LLM {summary.llm_tokens} tokens ${summary.llm_usd:.4f}" if summary.llm_tokens else ""),
                  highlight=False)
    for note in summary.notes:
        console.print(f"[dim]{note}[/dim]", highlight=False, soft_wrap=True)
    reports = [p for p in (Path(summary.run_dir) / "summary.md", Path(summary.run_dir) / "index.html") if p.is_file()]
    if reports:  # written when a session ends; an interrupted first session has none yet
        console.print(f"report: {', '.join(map(str, reports))}", highlight=False, soft_wrap=True)


def _check_device(device: str, refs) -> None:
    """HeadlessError for a device the run's code problems cannot use (a name kscout does not know, or CUDA on a
    machine without it): found once, before any problem starts, not as each problem failing in turn."""
    from kernelscout.agent.headless import HeadlessError
    from kernelscout.sandbox.problem import InputFileError
    from kernelscout.tools.measure import resolve_device

    if not any(ref.kind == "problem" for ref in refs):
        return  # recorded spaces are replayed, whatever --device says
    try:
        resolve_device(device)
    except InputFileError as exc:
        raise HeadlessError(f"--device {exc}") from None


def _run(headless, as_json: bool) -> None:
    from kernelscout.agent.headless import HeadlessError, RunProgress

    try:
        summary = headless.run(quiet=as_json, progress=RunProgress(len(headless.manifest.problems)))
    except HeadlessError as exc:
        fail(str(exc), as_json)
    except KeyboardInterrupt:
        message = f"interrupted; nothing measured is lost. Continue with: kscout resume {headless.path}"
        if as_json:  # stdout stays one JSON object, as `kscout optimize --json` does
            print(json.dumps({"status": "interrupted", "run_dir": str(headless.path), "message": message,
                              "continue_with": f"kscout resume {headless.path}"}))
        err.print(message, soft_wrap=True, highlight=False)
        raise typer.Exit(interrupted_code())
    _finish(summary, as_json)


def _finish(summary, as_json: bool) -> None:
    if as_json:
        print(summary.model_dump_json())
    else:
        print_summary(summary)
    raise typer.Exit(_exit_code(summary))


def resume_run(run_dir: str, as_json: bool = False, **caps: Optional[float]) -> None:
    """Continue a multi-problem run: finished and failed problems stay as they are, an interrupted one resumes, and
    one skipped for a global cap runs if new `caps` (max_wall_s, max_measurements, max_usd, max_tokens) leave room."""
    from pydantic import ValidationError

    from kernelscout.agent.headless import HeadlessError, HeadlessRun

    try:
        run = HeadlessRun.open(run_dir)
        if any(v is not None for v in caps.values()):
            run.change_caps(**caps)
    except HeadlessError as exc:
        fail(str(exc), as_json)
    except ValidationError as exc:
        fail(validation_message(exc, FLAGS), as_json)
    _run(run, as_json)


def register(app: typer.Typer) -> None:
    """Add the `run` command to a typer app."""

    @app.command("run")
    def run(
        problems: list[str] = typer.Argument(..., help="problem files or folders: a folder with problem.py is one problem, "
                                                      "a folder of such folders (or of KernelBench .py files, or of recorded spaces .json.gz) is many"),
        budget: Optional[int] = typer.Option(None, help=f"measurement budget of each problem {help_default('budget')}"),
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="top run directory \\[default: runs/run-<time>]"),
        policy: Optional[str] = typer.Option(None, help=f"auto, tuner, llm or an installed plugin's (auto uses the tuner for recorded spaces) {help_default('policy')}"),
        surrogate: Optional[str] = typer.Option(None, help=f"auto, learned, llm, none or an installed plugin's {help_default('surrogate')}"),
        device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda, cuda:N or an installed device plugin's name {help_default('device')}"),
        seed: int = typer.Option(0, help="seed of the search policy (0 or more)"),
        proposals: Optional[int] = typer.Option(None, help=f"candidates proposed per iteration {help_default('proposals')}"),
        patience: Optional[int] = typer.Option(None, help=f"stop a problem after this many measurements without a new best (0: never) {help_default('patience')}"),
        solved_chance: Optional[float] = typer.Option(None, "--solved-chance", help="each recorded space: stop once the surrogate "
                                                      "gives the configurations left less than this chance, together, of beating "
                                                      f"the best by more than 2 % (0: measure to the budget) {help_default('solved_chance')}"),
        objective: Objective = typer.Option("file", "--objective", help="each recorded space: file (the objective "
                                                          "its cache names, where kscout can follow it) or time (the recorded time per call)"),
        confirm: Optional[int] = typer.Option(None, "--confirm", help="measurements kept to re-measure each problem's best "
                                              "(default: 1 for a problem with a budget of 5 or more, else 0)"),
        problem_wall: Optional[float] = typer.Option(None, "--problem-wall", help="stop each problem's search after this many seconds"),
        max_wall: Optional[float] = typer.Option(None, "--max-wall", help="global: stop starting or continuing problems after this many seconds"),
        max_measurements: Optional[int] = typer.Option(None, "--max-measurements", help="global: measurements over all problems"),
        max_usd: Optional[float] = typer.Option(None, "--max-usd", help="global: LLM spend over all problems"),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="global: LLM tokens over all problems"),
        start: list[str] = typer.Option([], "--start", help="your own kernels, a glob relative to each problem's folder "
                                        "({name}: the problem's name), measured first and tuned from (repeatable)"),
        history: list[str] = typer.Option([], "--history", help="folder of earlier runs whose measurements on this device make the "
                                          "learned surrogate's prior on each code problem (repeatable; this run's own --run-dir: "
                                          "each problem learns from those before it; none: no prior) "
                                          "\\[default: no prior, or \\[search] history in kscout.toml]"),
        rewrites: list[str] = typer.Option([], "--rewrites", help="generic rewrites the offline tuner may try on each code "
                                           "problem, as kscout optimize takes them: all, none (only the knobs of the --start "
                                           "kernels) or names, comma-separated"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end"),
    ) -> None:
        """Search many problems in one headless run, each with its own budget, all under optional global caps."""
        from pydantic import ValidationError

        from kernelscout.agent.headless import HeadlessError, HeadlessRun, RunCaps, RunManifest, attach_start, discover, run_history

        cfg = search_config(as_json)
        try:
            refs = attach_start(discover(problems), start)
        except HeadlessError as exc:
            fail(str(exc), as_json)
        budget, policy, surrogate = cfg.pick("budget", budget), cfg.pick("policy", policy), cfg.pick("surrogate", surrogate)
        device, proposals, patience = cfg.pick("device", device), cfg.pick("proposals", proposals), cfg.pick("patience", patience)
        confirm = cfg.pick("confirm", confirm)
        # a recorded space's setting: refused as a flag, and a file's value not announced, for a run of code problems only
        on_space = any(ref.kind == "space" for ref in refs)
        if solved_chance is not None and not on_space:
            fail("--solved-chance stops the search of a recorded space, and none of these problems is one: leave the flag out", as_json)
        if objective != "file" and not on_space:
            fail("--objective chooses what a recorded space is searched for, and none of these problems is one: leave the flag out", as_json)
        solved_chance = cfg.pick("solved_chance", solved_chance) if on_space else SOLVED_CHANCE
        history = cfg.pick("history", history or None)
        announce_defaults(cfg, as_json)
        from kernelscout.agent.search_config import policy_choices, surrogate_choices

        if policy not in policy_choices() or surrogate not in surrogate_choices():
            fail(f"--policy takes {', '.join(policy_choices())}; --surrogate takes {', '.join(surrogate_choices())}", as_json)
        from kernelscout.agent.runner import OptimizeError, check_llm, check_plugins, resolve_choices

        try:  # before the night starts, not once per problem
            check_llm(policy, surrogate)
            check_plugins(*resolve_choices(policy, surrogate)[:2])  # `auto` with a provider set up wrongly; a broken plugin
            _check_rewrite_names(rewrites)
        except OptimizeError as exc:
            fail(str(exc), as_json)
        path = run_dir or str(Path("runs") / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            folders = run_history(history, path)
            _check_device(device, refs)  # before the night starts, not once per problem
            manifest = RunManifest(problems=refs, budget=budget, policy=policy, surrogate=surrogate, device=device, seed=seed,
                                   proposals=proposals, patience=patience, solved_chance=solved_chance, confirm=confirm, problem_wall_s=problem_wall, history=folders,
                                   rewrites=rewrites or None, objective=objective,
                                   caps=RunCaps(max_wall_s=max_wall, max_measurements=max_measurements, max_usd=max_usd, max_tokens=max_tokens))
            headless = HeadlessRun.create(path, manifest)
        except HeadlessError as exc:
            fail(str(exc), as_json)
        except ValidationError as exc:
            fail(validation_message(exc, FLAGS), as_json)
        if not as_json and holder(headless.path) is None:  # a run busy elsewhere is refused next, this line unsaid
            err.print(f"[dim]{len(refs)} problem{'' if len(refs) == 1 else 's'}, budget {budget} each; run directory {headless.path}[/dim]",
                      soft_wrap=True, highlight=False)
        _run(headless, as_json)
