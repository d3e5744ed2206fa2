"""`kscout show RUN_DIR`: a finished or interrupted run at a glance, in the terminal.

The morning-after view of an overnight search: the best kernel with its re-measurements, what the
budget bought, the fastest candidates with the forecasts they were measured on, and how well those
forecasts held up. cli.py calls `register(app)`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from kernelscout.agent.run_view import CandidateRow, RunView, what_changed
from kernelscout.tools.runlock import holder


def _x(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _num(value: Optional[float], fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _params(row: CandidateRow, width: int = 60) -> str:
    return what_changed(", ".join(f"{k}={v}" for k, v in row.changed.items()), row.hypothesis, row.claimed_speedup, width)


def _ms(ms: float) -> str:
    return f"{ms:.4g} ms"


def _best_line(best: CandidateRow) -> str:
    from kernelscout.tools.archive import CLEAR_GAIN, clear_gain

    slower = ""
    if best.speedup is not None and best.speedup <= 1.0:
        slower = "; nothing beat the reference, which stands"
    elif best.speedup is not None and not clear_gain(best.speedup):
        slower = f"; under {CLEAR_GAIN - 1:.0%} faster than the reference, which stands"
    if best.remeasured:
        again = ", ".join(f"{x:.3f}x" for x in best.remeasured)
        return f"#{best.id} {best.origin}: {_x(best.speedup)} (re-measured {again}; {_x(best.search_speedup)} when chosen{slower})"
    if best.remeasured_uncounted:
        from kernelscout.agent.progress import clip_line

        slower += f"; its re-measurement did not count: {clip_line(best.remeasured_uncounted[-1])}"
    return f"#{best.id} {best.origin}: {_x(best.speedup)} (measured once{slower})"


def _llm_rows(head, view: RunView) -> None:
    """What the search's LLM calls, and the chat's in the same folder, used; nothing for a run that made none."""
    from rich.markup import escape

    from kernelscout.agent.llm_pricing import usage_line

    for label, usage in (("LLM", view.llm_usage), ("LLM (chat)", view.chat_llm_usage)):
        if usage:
            head.add_row(label, escape(usage_line(usage)))


def render(view: RunView) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # Piped to a file or a pager: 80 columns would wrap the table a cell a line; nothing else limits it.
        out = Console(width=160)
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")  # a long path or command is folded onto more lines, never cut short with "…"
    head.add_row("run directory", escape(view.run_dir))
    spent = f"{view.budget.used} of {view.budget.cap}" if view.budget.cap is not None else f"{view.budget.used} (uncapped)"
    if view.kind is None:
        head.add_row("search", "none: measurements made with `kscout measure`, the MCP server or the chat")
        head.add_row("measurements", spent)
        _llm_rows(head, view)
        out.print(head)
        if view.measured_files:
            _render_measured_files(out, view.measured_files, "files measured here (the latest measurement of each)")
        if view.forecast_check and view.forecast_check.forecasts:
            _render_check(out, view.forecast_check)
        return
    head.add_row(view.kind, escape(view.target or ""))
    head.add_row("device / policy", f"{view.device} / {view.policy}, surrogate {view.surrogate}")
    raised = (view.status == "finished" and view.stop is not None and view.stop.kind == "budget" and view.budget.cap is not None
              and view.budget.used < view.budget.cap)  # `kscout budget RUN --set N` since it stopped
    head.add_row("status", view.status + (f" ({escape(view.stop_reason)})" if view.stop_reason else "")
                 + (f": {escape(view.running)}" if view.status == "running" else
                    f"; the budget has since been raised to {view.budget.cap}: `kscout resume {escape(view.run_dir)}` goes on"
                    if raised else "" if view.status in ("finished", "failed") else f"; `kscout resume {escape(view.run_dir)}` goes on"))
    flight = f" ({view.budget.reserved} in flight)" if view.budget.reserved else ""
    per = f" ({view.considered_per_measurement:.1f} per measurement)" if view.budget.used else ""
    again = (f"; {view.measured_again} of them of a candidate measured again after a void or suspect timing"
             if view.measured_again else "")
    if view.remeasurements:
        again += (f"; {view.remeasurements} of them " + ("a re-measurement" if view.remeasurements == 1 else "re-measurements")
                  + " of the best after the search")
    outside = (f"; {len(view.measured_files)} file(s) measured here outside the search, listed below"
               if view.measured_files else "")
    head.add_row("measurements", f"{spent}{flight}, {view.considered} candidates considered{per}{again}{outside}")
    # "failed" in the archive covers a correct candidate whose timing was void (a Triton kernel on the CPU, say)
    head.add_row("candidates", ", ".join(f"{n} {_STATE_WORDS.get(s, s)}" for s, n in sorted(view.states.items())))
    if view.reference:
        timed = f"; {_ms(view.reference_ms)} a call, the median over the run" if view.reference_ms else ""
        if view.reference_range_ms:  # the machine's drift, which a speedup cancels and a raw time does not
            low, high = view.reference_range_ms
            timed += (f" ({_ms(low)} to {_ms(high)} over its {view.reference_timings} timings: each speedup is over the "
                      "reference timed beside that candidate)")
        seeded = "; speedups are over it, so compare runs of other seeds by time" if view.kind == "space" else ""
        head.add_row("reference", escape(view.reference + timed + seeded))
    for note in view.space_notes:
        head.add_row("space note", escape(note))
    for note in view.surrogate_notes:
        head.add_row("[yellow]note[/yellow]", escape(note))
    how = "replayed beside it (recorded times)" if view.kind == "space" else "timed beside it"
    beside = f" against the reference's {_ms(view.best_reference_ms)} {how}" if view.best_reference_ms else ""
    best = _best_line(view.best) + (f"; {_ms(view.best_runtime_ms)} a call{beside}" if view.best_runtime_ms else "") if view.best else None
    head.add_row("best", escape(best) if best else "no verified candidate yet")
    if view.best_file:
        head.add_row("best kernel", escape(view.best_file))
    _llm_rows(head, view)
    if view.report:
        head.add_row("report", escape(view.report))
    if view.continue_with:
        head.add_row("to search on", escape(view.continue_with))
    out.print(head)

    if view.top:
        # Forecast columns only where a listed candidate was measured on a forecast: a cold surrogate
        # (no history yet on a new problem) leaves them all "-", which reads as missing data.
        forecasts = any(r.expected_speedup is not None or r.p_faster is not None for r in view.top)
        table = Table(title="fastest measured candidates (speedup over the reference"
                            + ("; measured and forecast over the parent)" if forecasts else ")"), title_justify="left")
        columns = [("id", "right"), ("parent", "right"), ("origin", "left"), ("what changed from the parent", "left"), ("speedup", "right")]
        columns += [("over parent", "right"), ("forecast", "right"), ("P(faster)", "right")] if forecasts else []
        for name, justify in columns + [("state", "left")]:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for r in view.top:
            shown = _x(r.speedup) + (" (re-measured)" if r.remeasured else "")
            cells = [f"#{r.id}", r.parent, escape(r.origin), escape(_params(r)), shown]
            cells += [_x(r.over_parent), _x(r.expected_speedup), _num(r.p_faster, "{:.2f}")] if forecasts else []
            table.add_row(*cells, r.state)
        out.print(table)
        if not forecasts:
            out.print("no forecast columns: none of these was measured on an informative forecast")

    if view.measured_files:  # a version before 2026-12-06 let a server or `kscout measure` measure into a search's folder
        _render_measured_files(out, view.measured_files, "files measured here outside the search (charged to its budget, "
                               "not among its candidates; the latest measurement of each)")

    if view.failures:
        shown = f"the latest {len(view.failures)} of {view.failed}" if view.failed > len(view.failures) else str(view.failed)
        table = Table(title=f"measurements that did not count ({shown})", title_justify="left")
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("candidate", overflow="fold")
        table.add_column("status", no_wrap=True)
        table.add_column("why", overflow="fold")
        for f in view.failures:
            table.add_row(f"#{f.id}", escape(f.candidate(view.run_dir)), f.status, escape(f.why))
        out.print(table)

    if view.forecast_check is not None:
        _render_check(out, view.forecast_check, view.surrogate)
        if view.forecast_check.plan_claims is not None:
            out.print(escape(view.forecast_check.plan_claims.line()), soft_wrap=True)


def _render_measured_files(out, files: list, title: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kernelscout.sandbox.problem import problem_name

    table = Table(title=title, title_justify="left")
    for name in ("candidate", "problem", "device", "status", "speedup", "charged"):
        table.add_column(name, justify="right" if name == "speedup" else "left")
    for f in files:
        m = f.measurement
        status = m.status.value if m.status.value != "ok" else ("ok" if f.usable else
                                                                 "ok, incorrect" if not m.correct else "ok, timing invalid")
        table.add_row(escape(f.candidate or "?"), escape(problem_name(f.problem) if f.problem else "?"), f.device or "-",
                      status, _x(m.speedup) if f.usable else "-", "yes" if m.charged else "no")
    out.print(table)


def _target_name(view: RunView) -> str:
    """examples/softmax for its problem.py, convolution_A100 for its cache: the rows must tell problems apart."""
    from kernelscout.sandbox.problem import problem_name

    if not view.target:
        return "-"
    return problem_name(view.target) if view.kind == "problem" else Path(view.target).name.split(".json")[0]


def _stop_words(stop) -> str:
    """A stop in a table cell: a run that solved its space and one that spent its budget must not read alike."""
    if stop.kind == "limit":
        return f"{stop.setting} reached"
    return {"budget": "budget spent", "solved": "solved", "nothing_left": "nothing left to measure",
            "speed_of_light": "at speed of light", "near_speed_of_light": "near speed of light", "machine_busy": "machine busy",
            "problem_unusable": "problem unusable", "run_dir_unusable": "run directory unusable"}[stop.kind]


def render_comparison(views: list[RunView]) -> None:
    """Runs side by side: what each found, for what it spent, and how good its forecasts were."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=200)
    table = Table(title="runs compared", title_justify="left")
    columns = ["run", "target", "seed", "policy / surrogate", "measurements", "per measurement", "best", "best time",
               "reference time (run median)", "Brier of P(faster)", "status"]
    for name in columns:
        table.add_column(name, justify="right" if name not in ("run", "target", "policy / surrogate", "status") else "left")
    for v in views:
        fc = v.forecast_check
        best = (_x(v.best.speedup) + ("" if v.best.remeasured else " (once)")) if v.best else "-"
        table.add_row(escape(v.run_dir), escape(_target_name(v)), "-" if v.seed is None else str(v.seed),
                      f"{v.policy or '-'} / {v.surrogate or '-'}",
                      f"{v.budget.used} of {v.budget.cap}" if v.budget.cap is not None else str(v.budget.used),
                      f"{v.considered_per_measurement:.1f}" if v.kind else "-", best,
                      _ms(v.best_runtime_ms) if v.best_runtime_ms else "-", _ms(v.reference_ms) if v.reference_ms else "-",
                      _num(fc.brier_p_faster) if fc is not None else "-", v.status + (f" ({_stop_words(v.stop)})" if v.stop else ""))
    out.print(table)
    # one reference per problem file, or per recorded space and seed (the seed draws a space's reference)
    if len({(v.kind, v.target, v.seed if v.kind == "space" else None) for v in views if v.kind}) > 1:
        out.print("the speedups are over different references (another problem, or a recorded space's other --seed): "
                  "compare these runs by their best time", soft_wrap=True)


def _render_check(out, fc, surrogate: Optional[str] = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    if fc.scored == 0 and surrogate == "none":  # never anything to score, not "nothing yet"
        out.print("forecasts: none to score: --surrogate none measures every candidate the policy proposes, unforecast")
        return
    if fc.scored == 0:
        why = f"; the surrogate's last abstention: {escape(fc.last_abstention)}" if fc.last_abstention else ""
        said = f"forecasts: {fc.forecasts} for {fc.candidates_forecast} candidate{'s' if fc.candidates_forecast != 1 else ''}"
        if fc.candidates_forecast and fc.uninformative >= fc.candidates_forecast:  # none said anything: none ever will be scored
            out.print(f"{said}; none informative, and a forecast that says nothing is never scored{why}", soft_wrap=True)
        else:
            out.print(f"{said}; none informative and then measured, so nothing to score yet{why}", soft_wrap=True)
        return
    score = Table(title=f"forecasts against measurements ({fc.scored} measured candidate{'s' if fc.scored != 1 else ''} scored"
                        + (f", {fc.audits} of them audits" if fc.audits else "")
                        + (f", {fc.from_tools} from predict tool calls" if fc.from_tools else "") + ")", title_justify="left", show_header=False)
    score.add_row("Brier of P(faster)", _num(fc.brier_p_faster), "0.25 is a coin flip; lower is better")
    score.add_row("direction right", _num(fc.direction_accuracy, "{:.0%}"), "P(faster) on the right side of 1/2")
    score.add_row("ranked probability score", _num(fc.ranked_probability_score), "over the speedup bins (discrete CRPS); lower is better")
    score.add_row("rank correlation", _num(fc.spearman), "Spearman, expected against measured speedup")
    score.add_row("80 % interval held", _num(fc.interval_80_coverage, "{:.0%}"), "should be near 80 %")
    out.print(score)
    if fc.reliability:
        rel = Table(title="reliability of P(faster)", title_justify="left")
        for name in ("forecast", "measured faster", "count"):
            rel.add_column(name, justify="right")
        for b in fc.reliability:
            rel.add_row(f"{b.forecast:.2f}", f"{b.observed:.2f}", str(b.count))
        out.print(rel)
    out.print(f"[dim]{escape(fc.note)}[/dim]")


_STATE_WORDS = {"failed": "did not count"}


def _write_plot(views: list[RunView], path: str, as_json: bool) -> None:
    from kernelscout.agent.cli_errors import fail
    from kernelscout.agent.compare_plot import run_curve, write_comparison_plot
    from kernelscout.agent.run_view import open_run

    curves = []
    for v in views:
        seed = f", seed {v.seed}" if v.seed is not None else ""
        label = f"{Path(v.run_dir).name}: {_target_name(v)} ({v.policy or '-'} / {v.surrogate or '-'}{seed})"
        curves.append(run_curve(open_run(v.run_dir), label))
    problems = {(v.kind, v.target) for v in views}
    title = "runs compared" if len(problems) == 1 else "runs of different problems: their times do not compare"
    try:
        written = write_comparison_plot(curves, path, title=title)
    except OSError as exc:
        fail(f"--plot {path}: cannot write it ({exc.strerror or exc}); give a path in a folder you can write to", as_json)
    typer.echo(f"plot: {written}", err=True)


def register(app: typer.Typer) -> None:
    """Add the `show` command to a typer app."""

    @app.command("show")
    def show(
        run_dirs: list[str] = typer.Argument(..., metavar="RUN_DIR...", help="run directory of a search (kscout optimize or "
                                             "resume); give two or more to compare them side by side"),
        top: int = typer.Option(10, "--top", min=0, help="how many of the fastest measured candidates to list"),
        report: bool = typer.Option(False, "--report", help="rewrite the run's report.html from what is recorded now"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        plot: Optional[str] = typer.Option(None, "--plot", metavar="FILE", help="with two or more runs: write their best "
                                           "times against measurements spent to FILE (.png, .svg or .pdf)"),
    ) -> None:
        """What a run found and what it cost, with its forecasts scored against its measurements.

        Changes nothing in the run's record (--report rewrites only its report.html)."""
        from kernelscout.agent.cli_errors import fail
        from kernelscout.agent.run_view import RunViewError, view_run

        from kernelscout.agent.headless import HeadlessRun, is_headless_run

        if plot is not None and len(run_dirs) < 2:
            fail("--plot draws runs side by side: give two or more run directories (one run's plots are in its "
                 "report.html, `kscout show RUN --report`)", as_json)
        if plot is not None and Path(plot).suffix.lower() not in (".png", ".svg", ".pdf"):
            fail(f"--plot {plot}: give a file name ending in .png, .svg or .pdf", as_json)
        if len(run_dirs) > 1:
            if report:
                fail("--report rewrites one run's report: give one run directory with it", as_json)
            try:
                views = [view_run(d, top=top) for d in run_dirs]
            except RunViewError as exc:
                fail(str(exc), as_json)
            if plot is not None:
                _write_plot(views, plot, as_json)
            if as_json:
                print(json.dumps([v.model_dump(mode="json") for v in views]))
            else:
                render_comparison(views)
            return
        run_dir = run_dirs[0]
        if is_headless_run(run_dir):  # a `kscout run` of many problems: its summary, read again from each ledger
            from kernelscout.agent.cli_run import print_summary

            summary = HeadlessRun.open(run_dir).summary()
            if report:
                typer.echo(f"note: --report writes one problem's report: kscout show {Path(run_dir) / 'problems' / 'NAME'} "
                           "--report", err=True)
            if as_json:
                print(summary.model_dump_json())
            else:
                print_summary(summary)
                typer.echo(f"one problem in detail: kscout show {Path(run_dir) / 'problems' / 'NAME'}")
                if (summary.status == "incomplete" or summary.counts.get("skipped")) and holder(run_dir) is None:  # not running
                    typer.echo(f"to go on: kscout resume {run_dir}" + (" (with higher global caps, such as --max-measurements "
                               "N, for problems skipped for a cap)" if summary.counts.get("skipped") else ""))
            return
        try:
            view = view_run(run_dir, top=top)
            if report and view.kind is not None:
                from kernelscout.agent.report import write_report

                view.report = str(write_report(run_dir, title=f"kernelscout: {Path(view.target or run_dir).name}"))
            elif report:
                typer.echo("note: no report written: a report follows a search (its lineage and forecasts), and this folder "
                           "holds only measurements made outside one, which are listed below", err=True)
        except RunViewError as exc:
            fail(str(exc), as_json)
        if as_json:
            print(json.dumps(view.model_dump(mode="json")))
            return
        render(view)
