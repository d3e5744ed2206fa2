"""PNG figures of an evaluation: reliability of P(faster) and risk against coverage.

Rendered with the Agg backend so that it works headless (CI, the device machines).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernelscout.tools.surrogates.evaluation import EvalReport  # noqa: E402


def reliability_diagram(report: EvalReport, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    for name, res in report.spaces.items():
        xs = [b.mean_forecast for b in res.reliability]
        ys = [b.observed for b in res.reliability]
        ax.plot(xs, ys, marker=".", lw=0.8, alpha=0.6, label=f"{name} (ECE {res.ece_p_faster:.3f})")
    pooled = report.reliability_pooled
    ax.plot(
        [b.mean_forecast for b in pooled],
        [b.observed for b in pooled],
        marker="o",
        color="black",
        lw=2,
        label=f"all spaces (mean ECE {report.mean['ece_p_faster']:.3f})",
    )
    ax.set_xlabel("forecast P(child faster than measured parent)")
    ax.set_ylabel("observed frequency")
    ax.set_title(f"Reliability of P(faster): {report.settings.surrogate}, train={report.settings.train}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def risk_coverage_plot(report: EvalReport, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for name, res in report.spaces.items():
        cov, risk = zip(*res.risk_coverage)
        ax.plot(cov, risk, lw=0.8, alpha=0.6, label=f"{name} (AURC {res.aurc:.3f})")
    cov, risk = zip(*report.risk_coverage_mean)
    ax.plot(cov, risk, color="black", lw=2, label=f"mean (AURC {report.mean['aurc']:.3f})")
    ax.set_xlabel("coverage (share of pairs, most confident first)")
    ax.set_ylabel("risk (wrong faster/slower call)")
    ax.set_title(f"Risk-coverage: {report.settings.surrogate}, train={report.settings.train}")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(report: EvalReport, directory: Path, prefix: str = "eval-surrogate") -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [
        reliability_diagram(report, directory / f"{prefix}-reliability.png"),
        risk_coverage_plot(report, directory / f"{prefix}-risk-coverage.png"),
    ]
