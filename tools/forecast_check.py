"""How well a run's forecasts matched what was then measured: the calibration check the archive keeps possible.

Every forecast is stored next to the candidate it was made for, and a measured candidate's speedup
is stored too, so a finished (or interrupted) run can be scored after the fact, on the GPU it ran on,
with the surrogate it used. The scores are those of GPU Forecasters and `kscout eval-surrogate`:
the Brier score of P(faster than the parent), the ranked probability score over the ordinal speedup
bins (the discrete CRPS), the rank correlation between expected and measured speedup, and how often
the 80 % interval held the measured one.

One caveat is stated in every result rather than hidden: only measured candidates can be scored, and
the decision rule chose them by their forecasts. Skipped candidates never reveal their speed, so these
scores describe the forecasts the run acted on. The rule's audits (skips measured anyway) are the
unbiased sample; they are counted separately.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.tools.archive import ROOT_ID, Archive
from kernelscout.tools.claim_check import PlanClaims, check_plan_claims
from kernelscout.tools.surrogates import metrics

SELECTION_NOTE = ("scored on measured candidates only, which the decision rule chose by their forecasts; "
                  "skipped candidates never reveal their speed")
TOOLS_NOTE = ("scored on the files measured after their predict call (the last call before that measurement counts); "
              "a file never measured is never scored")


class ReliabilityBin(BaseModel):
    forecast: float = Field(description="mean P(faster) of the forecasts in this bin")
    observed: float = Field(description="share of them that measured faster than their parent")
    count: int


class ForecastCheck(BaseModel):
    """This run's forecasts against its measurements. Scores are None when nothing could be scored."""

    forecasts: int = Field(description="forecasts recorded (a candidate left pending is forecast again each iteration)")
    candidates_forecast: int = Field(description="distinct search candidates forecast, plus each predict tool call")
    uninformative: int = Field(description="candidates whose deciding forecast was uninformative (cold start, --surrogate none), and such predict calls")
    scored: int = Field(description="candidates with an informative forecast and then a verified measurement")
    audits: int = Field(0, description="of those, measured only to audit the skip rule (an unbiased sample)")
    from_tools: int = Field(0, description="of those, forecasts asked of the predict tool (MCP server, chat) about a file measured after")
    brier_p_faster: Optional[float] = Field(None, description="mean (P(faster) - outcome)^2; 0.25 for a coin flip, lower is better")
    direction_accuracy: Optional[float] = Field(None, description="share where P(faster) > 0.5 called the direction right")
    ranked_probability_score: Optional[float] = Field(None, description="over the ordinal speedup bins, in [0, 1]; lower is better")
    spearman: Optional[float] = Field(None, description="rank correlation of expected and measured speedup over the parent; "
                                      "None with fewer than 3 scored, or when all forecasts or all outcomes tie")
    interval_80_coverage: Optional[float] = Field(None, description="share of measured speedups inside the forecast's 80 % interval")
    mean_abs_log_error: Optional[float] = Field(None, description="mean |ln(expected / measured speedup)|")
    reliability: list[ReliabilityBin] = Field(default_factory=list)
    last_abstention: Optional[str] = Field(None, description="why the search's latest uninformative forecast said nothing (a cold "
                                                             "start names the measurements it still needs); predict tool calls not included")
    note: str = SELECTION_NOTE
    plan_claims: Optional[PlanClaims] = Field(None, description="the LLM policy's own expected speedups against the measured "
                                              "ones (tools/claim_check.py); None when the policy made no claims")


class _Scores:
    """The (forecast, measured ratio) pairs of one check, gathered from either source."""

    def __init__(self) -> None:
        self.p: list[float] = []
        self.faster: list[bool] = []
        self.probs: list[list[float]] = []
        self.outcome: list[int] = []
        self.expected: list[float] = []
        self.measured: list[float] = []
        self.inside: list[bool] = []

    def add(self, fc: dict, ratio: float) -> None:
        self.p.append(fc["p_faster"])
        self.faster.append(ratio > 1.0)
        edges = fc.get("bin_edges") or []
        if fc.get("bin_probs") and len(fc["bin_probs"]) == len(edges) + 1:
            self.probs.append(fc["bin_probs"])
            self.outcome.append(int(np.searchsorted(np.asarray(edges), ratio, side="right")))
        if fc.get("expected_speedup"):
            self.expected.append(fc["expected_speedup"])
            self.measured.append(ratio)
        if fc.get("speedup_interval_80"):
            lo, hi = fc["speedup_interval_80"]
            self.inside.append(lo <= ratio <= hi)


def deciding_forecasts(forecasts: list[dict]) -> dict[int, dict]:
    """Each candidate's deciding forecast: the last one it was measured on, else its last. A pending
    candidate is forecast again every iteration; the forecast that got it measured is the one to judge."""
    deciding: dict[int, dict] = {}
    for f in forecasts:  # oldest first
        held = deciding.get(f["candidate_id"])
        if held is None or f["decision"] == "measure" or held["decision"] != "measure":
            deciding[f["candidate_id"]] = f
    return deciding


def scored_search_forecasts(archive: Archive, deciding: Optional[dict[int, dict]] = None) -> list[tuple[dict, float]]:
    """(deciding forecast row, measured speedup over its parent) for each search candidate that had an
    informative forecast and then a verified measurement: what the scores, and the report's plots, judge."""
    deciding = deciding_forecasts(archive.forecasts(lazy=True)) if deciding is None else deciding
    speedups = {c.id: c.speedup for c in archive.all()}
    pairs = []
    for row in deciding.values():
        if not row["forecast"].get("informative"):  # cold start or --surrogate none: nothing was forecast
            continue
        child = row["measured_speedup"]
        parent = 1.0 if row["parent_id"] in (None, ROOT_ID) else speedups.get(row["parent_id"])
        if child is None or not parent or row["state"] not in ("measured", "suspect", "unconfirmed"):
            continue
        pairs.append((row, child / parent))
    return pairs


def check_forecasts(archive: Archive, bins: int = 5, forecasts: Optional[list[dict]] = None) -> ForecastCheck:
    """Score each measured candidate's deciding forecast (the one it was measured on, else its last)
    against its measured speedup over the parent it was forecast against; and each `predict` tool
    forecast against the first measurement of its file taken after it. `forecasts`: `archive.forecasts(lazy=True)`,
    where the caller has read them already."""
    forecasts = archive.forecasts(lazy=True) if forecasts is None else forecasts
    deciding = deciding_forecasts(forecasts)
    scores, audits = _Scores(), 0
    for row, ratio in scored_search_forecasts(archive, deciding):
        audits += (row.get("reason") or "").startswith("audit")
        scores.add(row["forecast"], ratio)
    uninformative = sum(1 for row in deciding.values() if not row["forecast"].get("informative"))
    tool = archive.tool_forecasts()
    from_tools = 0
    for t in tool:
        if not t["forecast"].get("informative"):
            uninformative += 1
        elif t["measured_speedup"] is not None and t["parent_speedup"]:
            from_tools += 1
            scores.add(t["forecast"], t["measured_speedup"] / t["parent_speedup"])

    n = len(scores.p)
    last_silent = archive.last_abstention() or {}
    check = ForecastCheck(forecasts=sum(1 + f.get("repeats", 0) for f in forecasts) + len(tool), candidates_forecast=len(deciding) + len(tool),
                          uninformative=uninformative, scored=n, audits=audits, from_tools=from_tools,
                          last_abstention=last_silent.get("rationale") or None, note=TOOLS_NOTE if tool and not forecasts else SELECTION_NOTE,
                          plan_claims=check_plan_claims(archive))
    if n == 0:
        return check
    pa, fa = np.asarray(scores.p, dtype=float), np.asarray(scores.faster, dtype=float)
    check.brier_p_faster = float(np.mean((pa - fa) ** 2))
    check.direction_accuracy = metrics.direction_accuracy(pa, fa.astype(bool))
    check.reliability = [ReliabilityBin(forecast=m, observed=o, count=c) for m, o, c in metrics.reliability_bins(pa, fa, bins)]
    if scores.probs and len({len(x) for x in scores.probs}) == 1:
        check.ranked_probability_score = metrics.ranked_probability_score(np.asarray(scores.probs), np.asarray(scores.outcome))
    if len(scores.expected) >= 3:
        e, m = np.asarray(scores.expected), np.asarray(scores.measured)
        # undefined, not zero, when every forecast (or every outcome) was the same
        check.spearman = metrics.spearman(e, m) if np.ptp(e) > 0 and np.ptp(m) > 0 else None
        check.mean_abs_log_error = float(np.mean(np.abs(np.log(e / m))))
    if scores.inside:
        check.interval_80_coverage = float(np.mean(scores.inside))
    return check
