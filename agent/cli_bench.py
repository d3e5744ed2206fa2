"""`kscout bench search`: a thin command over agent/bench.py; cli.py calls `register(app)`."""

from __future__ import annotations

import json
from typing import Optional

import typer

from kernelscout.sandbox.objectives import Objective


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give comma-separated integers, e.g. 20,50,100", param_hint="--budgets") from None
    if not values or min(values) < 1:
        raise typer.BadParameter("budgets must be positive integers, e.g. 20,50,100", param_hint="--budgets")
    return values


def render_table(result) -> str:
    """Mean over spaces, then each space: fraction of the optimum per budget, ± its standard error over
    seeds, (considered per measurement)."""
    budgets = [str(b) for b in result.budgets]
    width = max(len(m) for m in result.mean) + 2

    def block(title: str, methods: dict) -> list[str]:
        lines = [title, f"{'method':<{width}}" + "".join(f"{'@' + b:>23}" for b in budgets)]
        for m, cells in methods.items():
            row = f"{m:<{width}}"
            for b in budgets:
                c = cells[b]
                extra = f" ({c.considered_per_measurement:.1f})" if c.considered_per_measurement is not None else ""
                se = f" ±{c.stderr:.3f}" if c.stderr is not None else ""
                row += f"{c.frac_of_opt:>10.3f}{se:>7}{extra:>6}"
            lines.append(row)
        return lines

    lines = block(f"mean over {len(result.spaces)} spaces, {result.seeds} seeds: fraction of the optimum ± standard error (considered per measurement)", result.mean)
    for space, methods in result.spaces.items():
        lines += [""] + block(space, methods)
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Benchmarks against other tools, on recorded GPU spaces.", no_args_is_help=True)

    @bench.command("search")
    def search(
        spaces: list[str] = typer.Argument(..., help="Kernel Tuner cache files or T4 results (.json or .json.gz), folders of them, or recorded space names (convolution_A100)"),
        budgets: str = typer.Option("20,50,100", help="measurement budgets, comma-separated"),
        seeds: int = typer.Option(10, min=1, help="seeds per space and method (the published table uses 10)"),
        baselines: str = typer.Option("kernel_tuner", help="kernel_tuner, or none for kernelscout alone"),
        no_predict: bool = typer.Option(True, "--surrogate-none/--no-surrogate-none", help="also run kernelscout with --surrogate none (what predict buys)"),
        out: Optional[str] = typer.Option(None, help="keep every run directory under this folder"),
        jobs: int = typer.Option(2, min=1, help="parallel worker processes"),
        objective: Objective = typer.Option("file", "--objective", help="what both tools search and are scored for: file (the objective "
                                      "each cache names, where kscout can follow it) or time (the shortest recorded time per call)"),
        as_json: bool = typer.Option(False, "--json", help='print {space: {method: {budget: {"frac_of_opt", "considered_per_measurement", "stderr"}}}}'),
    ) -> None:
        """Compare kernelscout's search with Kernel Tuner's strategies at the same budgets and seeds."""
        from rich.console import Console

        from kernelscout.agent.bench import BenchError, BenchRequest, run_bench

        from kernelscout.agent.cli_errors import fail, json_errors

        err = Console(stderr=True)
        names = [] if baselines.strip() in ("", "none") else [b.strip() for b in baselines.split(",")]
        with json_errors(as_json):
            req = BenchRequest(spaces=spaces, budgets=_ints(budgets), seeds=seeds, baselines=names, no_predict=no_predict, out=out, jobs=jobs,
                               objective=objective)

        def progress(done: int, total: int, trace) -> None:
            err.print(f"[dim]{done}/{total}[/dim] {trace.space} {trace.method} seed {trace.seed}: {len(trace.times)} measured, {trace.wall_s:.1f} s")

        try:
            result = run_bench(req, progress=progress)
        except BenchError as exc:
            fail(str(exc), as_json)
        if as_json:
            typer.echo(json.dumps(result.as_json(), indent=2))
        else:
            typer.echo(render_table(result))

    app.add_typer(bench, name="bench")
