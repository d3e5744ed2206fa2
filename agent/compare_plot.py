"""`kscout show A B ... --plot FILE`: the runs' best times against measurements spent, one line per run.

Why times and not speedups: runs of a recorded space with other seeds, or of other problems, have other references,
and their speedups do not compare; a time does (on the same device). Only the search's own measurements make a
line, each counted once it was correct and its timing valid; a re-measurement of the best after the search checks
a figure rather than finding one, so it is drawn as a marker where the run spent it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from kernelscout.tools.rundir import RunDir  # noqa: E402


class RunCurve(BaseModel):
    label: str
    reference_ms: Optional[float] = Field(None, description="the run's reference time (median of timings that counted): "
                                          "the best before any candidate, drawn at 0 measurements")
    best_ms: list[Optional[float]] = Field(description="after each charged measurement: the best valid time so far "
                                           "among the search's own (None until one counts)")
    remeasured: list[tuple[int, float]] = Field(default_factory=list, description="(measurements spent, time) of each "
                                                "re-measurement of the best after the search")


def run_curve(run: RunDir, label: str) -> RunCurve:
    from kernelscout.agent.targets import reference_ms
    from kernelscout.tools.archive import Archive

    Archive(run)  # its tables, empty where a run stopped before any (read-only: temporary, this connection's)
    with run.connect() as db:
        rows = db.execute("SELECT id, result_json FROM measurements WHERE charged = 1 ORDER BY id").fetchall()
        again = {r[0] for r in db.execute("SELECT measurement_id FROM confirmations WHERE measurement_id IS NOT NULL")}
        suspect = {r[0] for r in db.execute("SELECT measurement_id FROM candidates WHERE state = 'suspect'")}
    ref = reference_ms(run, valid_only=True)
    best: Optional[float] = ref  # until a candidate beats it, the reference is the best
    curve, marks = [], []
    for spent, (mid, text) in enumerate(rows, start=1):
        m = json.loads(text)
        ms = m.get("runtime_ms") if m.get("correct") and m.get("timing_valid") and mid not in suspect else None
        if mid in again:
            if ms is not None:
                marks.append((spent, ms))
        elif ms is not None and (best is None or ms < best):
            best = ms
        curve.append(best)
    return RunCurve(label=label, reference_ms=ref, best_ms=curve, remeasured=marks)


def write_comparison_plot(curves: list[RunCurve], path: str | Path, title: str = "runs compared") -> Path:
    """A PNG (or SVG, PDF) of the curves, each from its reference at 0; a run with no valid time is named in the
    legend with no line."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, c in enumerate(curves):
        color = f"C{i % 10}"
        points = [(0, c.reference_ms)] + list(enumerate(c.best_ms, start=1))
        xs = [n for n, t in points if t is not None]
        ys = [t for _, t in points if t is not None]
        label = c.label if ys else f"{c.label} (no valid time)"
        ax.step(xs, ys, where="post", color=color, label=label)
        if c.remeasured:
            ax.scatter([n for n, _ in c.remeasured], [t for _, t in c.remeasured], marker="D", s=28, color=color)
    if any(c.remeasured for c in curves):
        ax.scatter([], [], marker="D", s=28, color="gray", label="re-measured best")
    shown = [t for c in curves for t in [c.reference_ms, *c.best_ms] if t is not None]
    if shown and max(shown) / min(shown) > 10:  # orders apart: a log axis, labelled 0.5, 1, 2, 5 ..., not 10^0
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measurements spent (0: the reference)")
    ax.set_ylabel("best time so far (ms, measured)")
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best", fontsize=8)
    out = Path(path)
    fig.savefig(out, format=out.suffix.lstrip(".").lower() or "png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
