"""`kscout eval-surrogate`: how well does a surrogate forecast, on recorded tuning spaces?

Kept apart from agent/cli.py so that the surrogate work registers its command without touching the
main CLI: `register(app)` adds it to any Typer app.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich import box
from rich.table import Table

from typing import TYPE_CHECKING
from kernelscout.sandbox.objectives import Objective

if TYPE_CHECKING:  # scikit-learn takes seconds to import: only the command itself pays for it
    from kernelscout.tools.surrogates.evaluation import EvalReport, SpaceResult

_COLUMNS = (
    ("pairwise_accuracy", "pair acc", "{:.3f}"),
    ("direction_accuracy", "dir acc", "{:.3f}"),
    ("spearman", "spearman", "{:.3f}"),
    ("brier", "brier (bins)", "{:.3f}"),  # over the ordinal bins; `kscout show`'s Brier is of P(faster) alone
    ("rps", "rps", "{:.3f}"),
    ("ece_p_faster", "ECE", "{:.3f}"),
    ("aurc", "AURC", "{:.3f}"),
    ("top10_recovery", "top10%", "{:.3f}"),
)


def _table(report: EvalReport) -> Table:
    s = report.settings
    title = f"{s.surrogate}, {s.train} timed training configs, {s.seeds} seeds" + (
        ", warm start" if s.warm_start else ""
    )
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("space", no_wrap=True, min_width=max(len(n) for n in [*report.spaces, "mean"]))  # convolution_A100 vs _A4000
    for _, head, _ in _COLUMNS:
        table.add_column(head, justify="right", min_width=5)
    for name, res in report.spaces.items():
        table.add_row(name, *[fmt.format(getattr(res, key)) for key, _, fmt in _COLUMNS])
    table.add_row("mean", *[fmt.format(report.mean[key]) for key, _, fmt in _COLUMNS], style="bold")
    return table


def eval_surrogate(
    spaces: list[Path] = typer.Argument(..., help="Kernel Tuner cache files or T4 results (.json/.json.gz), folders of them, or recorded space names (convolution_A100)"),
    train: int = typer.Option(50, "--train", "-n", help="timed training configurations per space and seed"),
    seeds: int = typer.Option(10, "--seeds", "-s", help="random train/held-out splits per space"),
    surrogate: str = typer.Option("learned", "--surrogate", help="learned, plain-rf, none, llm (or a registered one)"),
    warm_start: bool = typer.Option(
        False, "--warm-start", help="use the other given spaces of the same kernel (other GPUs) as priors"
    ),
    pairs: int = typer.Option(20000, "--pairs", help="(parent, child) pairs scored per space and seed"),
    objective: Objective = typer.Option("file", "--objective", help="what is forecast: file (the objective each "
                                                      "cache names, where kscout can follow it) or time (the recorded time per call)"),
    configs: int = typer.Option(60, "--configs", help="llm only: held-out configurations forecast per space and seed "
                                "(two chat calls each)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object with `spaces` and `mean`"),
    plots: Optional[Path] = typer.Option(
        Path("."), "--plots", help="folder for eval-surrogate-reliability.png and -risk-coverage.png"
    ),
    no_plots: bool = typer.Option(False, "--no-plots", help="write no PNG files"),
) -> None:
    """Train a surrogate on N random measured configurations, score its forecasts on the held-out rest."""
    from kernelscout.agent.cli_errors import json_errors

    with json_errors(as_json):
        _eval_surrogate(spaces, train, seeds, surrogate, warm_start, pairs, configs, as_json, plots, no_plots, objective)


def _eval_surrogate(spaces: list[Path], train: int, seeds: int, surrogate: str, warm_start: bool, pairs: int,
                    configs: int, as_json: bool, plots: Optional[Path], no_plots: bool, objective: str = "file") -> None:
    from pydantic import ValidationError

    from kernelscout.sandbox.replay import CacheFileError, load_spaces, resolve_space, space_hint
    from kernelscout.tools.surrogates.evaluation import EvalInputError, EvalSettings, evaluate
    from kernelscout.tools.surrogates.registry import surrogate_names

    model = None
    if surrogate == "llm":
        from kernelscout.agent.llm import require_chat_model

        try:
            model = require_chat_model(None, "the llm surrogate")
        except ValueError as exc:  # LLMConfigError too: a provider asked for but not usable as configured
            raise typer.BadParameter(str(exc), param_hint="--surrogate") from None
    elif surrogate not in surrogate_names():
        raise typer.BadParameter(
            f"surrogate {surrogate!r} is not available; choose from {', '.join(surrogate_names() + ['llm'])}",
            param_hint="--surrogate",
        )
    try:
        settings = EvalSettings(surrogate=surrogate, train=train, seeds=seeds, pairs=pairs, warm_start=warm_start,
                                llm_configs=configs)
    except ValidationError as exc:
        first = exc.errors()[0]
        option = {"llm_configs": "configs"}.get(str(first["loc"][0]), str(first["loc"][0]))
        raise typer.BadParameter(f"{first['msg']} (got {first.get('input')!r})", param_hint=f"--{option}") from None
    spaces = [resolve_space(p) for p in spaces]
    missing = next((p for p in spaces if not p.exists()), None)
    if missing is not None:
        raise typer.BadParameter(f"{missing}: no such recorded space; give Kernel Tuner cache files (.json or .json.gz), "
                                 f"folders of them, or a recorded space's name{space_hint(missing)}", param_hint="SPACES")
    try:
        loaded = load_spaces(spaces, objective)
    except CacheFileError as exc:
        raise typer.BadParameter(f"not a usable Kernel Tuner cache ({exc.reason}); give cache files Kernel Tuner wrote "
                                 "(.json or .json.gz) or folders of them", param_hint="SPACES") from None
    seen: set[str] = set()
    for s in loaded:
        if s.name in seen:  # `load_spaces` names files of the same name apart by their folders
            raise typer.BadParameter(f"{s.path} is given twice; give each space once", param_hint="SPACES")
        seen.add(s.name)
    err = Console(stderr=True)
    for s in loaded:
        for note in s.notes:
            err.print(f"[dim]note: {note}[/dim]")
    if warm_start:
        for s in loaded:
            if int(s.ok_mask.sum()) < 2:
                err.print(f"[dim]note: {s.path}: fewer than two timed configurations, so not used as a --warm-start prior[/dim]")
            elif not any(o.path != s.path and o.same_kernel(s) for o in loaded):
                err.print(f"[yellow]note:[/yellow] {s.name}: no other given space records the same kernel, so --warm-start "
                          "gives it no prior (give the same kernel recorded on other devices)", highlight=False)

    def progress(res: SpaceResult) -> None:
        err.print(
            f"[dim]{res.space}: pair acc {res.pairwise_accuracy:.3f}, ECE {res.ece_p_faster:.3f}, "
            f"top10% {res.top10_recovery:.3f} ({res.seconds:.0f}s)[/dim]"
        )

    from kernelscout.tools.plugins import PluginError

    try:
        report = evaluate(loaded, settings, progress=progress, model=model)
    except EvalInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--train" if "--train" in str(exc) else "SPACE") from None
    except PluginError as exc:  # an installed surrogate that does not load or keep its contract: named, no traceback
        raise typer.BadParameter(str(exc), param_hint="--surrogate") from None
    written = []
    if not no_plots and plots is not None:
        from kernelscout.tools.surrogates.plots import write_plots  # matplotlib only when asked

        written = write_plots(report, plots)
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        table = _table(report)
        console = Console()
        if not console.is_terminal:  # a pipe or a file has no width to respect: never cut a digit or a space name
            console = Console(width=max(console.width, Console(width=400).measure(table).maximum))
        console.print(table)
    for p in written:
        err.print(f"wrote {p}")


def register(app: typer.Typer) -> None:
    """Add `eval-surrogate` to a Typer app (agent/cli.py calls this)."""
    app.command("eval-surrogate")(eval_surrogate)
