"""report.html for a run: what was measured, what was forecast, and how well the two agree.

Plots are PNGs embedded in one self-contained HTML file, so a report can be mailed or archived.
Every number in it comes from run.db; forecasts are shown only next to measurements.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from kernelscout.agent.llm_pricing import UsageState, usage_line  # noqa: E402
from kernelscout.agent.run_view import clip, failure_row, llm_calls, what_changed  # noqa: E402
from kernelscout.tools.archive import ROOT_ID, Archive  # noqa: E402
from kernelscout.tools.budget import Budget  # noqa: E402
from kernelscout.tools.claim_check import plan_claim  # noqa: E402
from kernelscout.tools.forecast_check import ForecastCheck, check_forecasts, deciding_forecasts, scored_search_forecasts  # noqa: E402
from kernelscout.tools.rundir import RunDir  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _measurements(run: RunDir) -> list[dict]:
    with run.connect() as db:
        rows = db.execute("SELECT id, candidate_sha, status, charged, device, result_json FROM measurements ORDER BY id").fetchall()
    return [{"id": r[0], "sha": r[1], "status": r[2], "charged": bool(r[3]), "device": r[4], **json.loads(r[5])} for r in rows]


def best_so_far(speedups: list[Optional[float]], remeasured: list[bool]) -> list[float]:
    """The search's best after each measurement, the reference (1.0) until something beats it."""
    best, out = 1.0, []
    for s, again in zip(speedups, remeasured):
        if s and not again:
            best = max(best, s)
        out.append(best)
    return out


def best_so_far_plot(speedups: list[Optional[float]], remeasured: Optional[list[bool]] = None) -> str:
    """The search's best-so-far as a step; re-measurements of the best are drawn apart and left out of the step,
    since they check a figure rather than find a new one."""
    remeasured = remeasured or [False] * len(speedups)
    xs, ys = list(range(1, len(speedups) + 1)), best_so_far(speedups, remeasured)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.step([0] + xs, [1.0] + ys, where="post", color="tab:blue", label="search's best (each measured once)")
    ax.scatter(xs, [s if s and not again else float("nan") for s, again in zip(speedups, remeasured)], s=12, color="tab:gray",
               label="each measurement")
    if any(remeasured):
        ax.scatter(xs, [s if s and again else float("nan") for s, again in zip(speedups, remeasured)], s=30, marker="D",
                   color="tab:orange", label="re-measured best")
    ax.set_xlabel("measurements spent")
    ax.set_ylabel("speedup over reference")
    ax.set_title("best found so far" + (" and its re-measurement" if any(remeasured) else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # measurements come whole
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def _nothing_yet(ax, why: str) -> None:
    """An empty frame says why it is empty, rather than look like a plot that failed."""
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=9)


def forecast_plot(pairs: list[tuple[float, float]]) -> str:
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    if pairs:
        f, m = zip(*pairs)
        ax.scatter(f, m, s=14)
        lo, hi = min(min(f), min(m)), max(max(f), max(m))
        ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
        if hi / lo > 4:  # a log axis over less than a few-fold range labels only its minor ticks, one over the other
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # 0.2, 0.5, 1, 2, 5: labelled
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())
    else:
        _nothing_yet(ax, "no forecast scored yet:\nnone was followed by a\nmeasurement of the same candidate")
        ax.set_xticks([])  # no scale to read
        ax.set_yticks([])
    ax.set_xlabel("forecast speedup over parent")
    ax.set_ylabel("measured speedup over parent")
    ax.set_title("forecast vs measured")
    return _png(fig)


def calibration_plot(reliability: list) -> str:
    """The reliability bins of `check_forecasts`, so the plot shows the figures printed under it and by `kscout show`."""
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8)
    if reliability:
        ax.scatter([b.forecast for b in reliability], [b.observed for b in reliability], s=[20 + 10 * b.count for b in reliability])
    else:
        _nothing_yet(ax, "no forecast scored yet")
    ax.set_xlabel("forecast P(faster than parent)")
    ax.set_ylabel("observed frequency")
    ax.set_title("calibration in this run")
    return _png(fig)


def forecast_line(check: ForecastCheck) -> str:
    """The forecast scores in one sentence, the same figures `kscout show` prints."""
    if check.scored == 0:
        return "Forecasts against measurements: none scored yet (no informative forecast was followed by a measurement)."

    def num(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)

    return (f"Forecasts against measurements ({check.scored} measured candidates): Brier of P(faster) {num(check.brier_p_faster)} "
            f"(0.25 is a coin flip), ranked probability score {num(check.ranked_probability_score)}, rank correlation "
            f"{num(check.spearman)}, 80 % interval held {num(check.interval_80_coverage, '{:.0%}')}; {check.note}.")


def llm_paragraph(usage: Optional[UsageState]) -> str:
    """What the search's LLM calls used, in the words `kscout show` prints; nothing for a run that made none."""
    return "" if usage is None else f"<p>LLM use: {html.escape(usage_line(usage))}.</p>\n"


def write_report(run_dir: Path | str, title: str = "kernelscout run") -> Path:
    run = RunDir(run_dir)
    archive = Archive(run)
    candidates = archive.all()
    measurements = _measurements(run)
    charged = [m for m in measurements if m["charged"]]
    speedups = [m.get("speedup") if m.get("correct") and m.get("timing_valid") else None for m in charged]
    with run.connect() as db:
        confirmation_ids = {r[0] for r in db.execute("SELECT measurement_id FROM confirmations")}
    remeasured = [m["id"] in confirmation_ids for m in charged]
    forecasts = archive.forecasts(lazy=True)
    last_forecast = {f["candidate_id"]: f for f in forecasts}  # in id order, so the last one wins
    # the forecasts `kscout show` scores: each measured candidate's deciding one, informative ones only
    forecast_pairs = [(row["forecast"]["expected_speedup"], ratio)
                      for row, ratio in scored_search_forecasts(archive, deciding_forecasts(forecasts))
                      if row["forecast"].get("expected_speedup")]
    check = check_forecasts(archive, forecasts=forecasts)
    status = Budget(run).status()
    best = archive.reported_best()
    failed, failures = archive.failures(limit=max(1, len(candidates)))
    failed_rows = [failure_row(run, rec, m) for rec, m in failures]  # newest first
    did_not_count = {f.id: f.status for f in failed_rows}  # "failed" alone misleads
    rows = []
    for c in candidates:
        decision = last_forecast.get(c.id)
        state = f"did not count ({did_not_count[c.id]})" if c.id in did_not_count else c.state
        again = [sp for _, sp in archive.confirmations(c.id)] if c.speedup is not None else []
        measured = "" if c.speedup is None else f"{c.speedup:.3f}x"
        if again:  # the figure `kscout show` reports, with the single measurement that chose it beside it
            measured = f"{archive.reported_speedup(c):.3f}x re-measured ({c.speedup:.3f}x once)"
        rows.append(
            f"<tr><td>#{c.id}</td><td>{'ref' if c.parent_id in (None, ROOT_ID) else '#' + str(c.parent_id)}</td>"
            f"<td>{html.escape(c.origin)}</td><td>{html.escape(what_changed(json.dumps(c.params, default=str) if c.params else '', c.hypothesis, plan_claim(c), 120))}</td><td>{html.escape(state)}</td>"
            f"<td>{measured}</td>"
            f"<td>{html.escape(decision['reason']) if decision else ''}</td></tr>"
        )
    shown = failed_rows[:50]
    failure_rows = "".join(
        f"<tr><td>#{f.id}</td><td>{html.escape(f.candidate(run.path))}</td><td>{f.status}</td>"
        f"<td>{html.escape(clip(f.why, 400))}</td></tr>" for f in shown)
    failure_table = "" if not shown else (
        f"<h2>Measurements that did not count ({failed if failed == len(shown) else f'the latest {len(shown)} of {failed}'})</h2>"
        f"<table><tr><th>id</th><th>candidate</th><th>status</th><th>why</th></tr>{failure_rows}</table>")
    best_line = (f"best verified: #{best.id} at {best.speedup:.3f}x, measured once (not re-measured)" if best
                 else "no verified candidate beat the reference")
    confirmed = [sp for _, sp in archive.confirmations(best.id)] if best else []
    if confirmed:
        best_line = (f"best verified: #{best.id} at {archive.reported_speedup(best):.3f}x, re-measured after the search "
                     f"({', '.join(f'{x:.3f}x' for x in confirmed)}; {best.speedup:.3f}x when it was chosen)")
    best_ms, beside_ms = (archive.reported_runtime_ms(best), archive.reported_reference_ms(best)) if best else (None, None)
    if best_ms and beside_ms:  # the two times the speedup is the ratio of, as `kscout show` gives them
        best_line += f", {best_ms:.4g} ms a call against the reference's {beside_ms:.4g} ms in the same measurements"
    from kernelscout.agent.search_spec import SPEC_KEY

    spec_text = run.get_meta(SPEC_KEY)
    over = ""
    if spec_text:  # what the speedups are over, as `kscout show` says it
        from kernelscout.agent.run_view import reference_of
        from kernelscout.agent.search_spec import SearchSpec
        from kernelscout.agent.targets import reference_timings

        spec = SearchSpec.model_validate_json(spec_text)
        timed = reference_timings(run, spec.kind)
        drift = (f", from {timed.range_ms[0]:.4g} to {timed.range_ms[1]:.4g} ms: each speedup is over the reference timed "
                 "beside that candidate" if timed.range_ms else "")
        over = (f" Speedups are over {html.escape(reference_of(run, spec))}"
                + (f" (median {timed.median_ms:.4g} ms a call over the search's measurements{drift})." if timed.median_ms else "."))
        if spec.kind == "space":  # no kernel ran: say whose timings these are
            device = next((m["device"] for m in measurements if m.get("device")), "")
            recorded_on = f" on {html.escape(device.split(':', 1)[-1])}" if device.startswith("replay:") else ""
            over += (f" Every time here is a recorded timing{recorded_on}, replayed from {html.escape(Path(spec.path).name)}: "
                     "the search measured by looking it up.")
            from kernelscout.agent.run_view import space_notes

            notes = space_notes(run)
            if notes:
                over += " What the file holds that was not replayed: " + html.escape("; ".join(notes)) + "."
    said = check.plan_claims.line() if check.plan_claims else ""
    claims = f"<p>{html.escape(said[:1].upper() + said[1:])}.</p>" if said else ""
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}} img{{margin:0.5em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{best_line}. Measurements used: {status.used} of {status.cap if status.cap is not None else 'uncapped'};
candidates considered: {len([c for c in candidates])}.{over} Every speedup below was measured; forecasts only chose what to measure.</p>
{llm_paragraph(llm_calls(run))}<img src="data:image/png;base64,{best_so_far_plot(speedups, remeasured)}">
<img src="data:image/png;base64,{forecast_plot(forecast_pairs)}">
<img src="data:image/png;base64,{calibration_plot(check.reliability)}">
<p>{html.escape(forecast_line(check))}</p>{claims}
<h2>Lineage</h2><table><tr><th>id</th><th>parent</th><th>origin</th><th>what changed</th><th>state</th><th>measured</th><th>last decision</th></tr>
{''.join(rows)}</table>{failure_table}</body></html>"""
    path = run.path / "report.html"
    path.write_text(body)
    return path
