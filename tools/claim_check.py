"""How well the LLM policy's own claims matched what was measured.

Each experiment in an LLM plan comes with the speedup over its parent the model expects of it
(GPU Kernel Scientist's "expected uplift"). The claim is a prediction like any other: it orders the
cold start (agent/cold_start.py) and is stored beside the measurement, so it can be scored. A user
choosing a model for the policy wants to know whether its claims mean anything and by how much it
overclaims; the surrogate's scores (tools/forecast_check.py) do not say, since the surrogate made
those forecasts, not the policy.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.tools.archive import ROOT_ID, Archive, CandidateRecord
from kernelscout.tools.surrogates import metrics

TIMED = ("measured", "suspect", "unconfirmed")  # a verified time over the parent, as forecast_check scores
CLAIM_KEY = "expected_speedup"  # the feature an LLM plan's experiment carries (agent/policies/llm_policy.py)


def plan_claim(rec: CandidateRecord) -> Optional[float]:
    """The speedup over its parent that the plan behind this candidate expected; None where no plan said."""
    claim = rec.features.get(CLAIM_KEY)
    return float(claim) if isinstance(claim, (int, float)) and not isinstance(claim, bool) and claim > 0 else None


class PlanClaims(BaseModel):
    """The plans' expected speedups against the measured ones, over the same parent."""

    claims: int = Field(description="candidates whose plan said how much faster than its parent it would be")
    measured: int = Field(description="of those, timed and verified correct")
    failed: int = Field(description="of those, measured and failed (wrong, crashed, did not compile)")
    direction_right: Optional[float] = Field(None, description="share where the claim and the measurement fell on the same side of 1x")
    median_overclaim: Optional[float] = Field(None, description="median of claimed / measured speedup over the parent: "
                                                                "above 1 the plans promised more than they gave")
    spearman: Optional[float] = Field(None, description="rank correlation of claimed and measured speedup; None with fewer "
                                                        "than 3, or when every claim or every outcome ties")

    def line(self) -> str:
        """In one sentence, as `kscout show` and report.html say it."""
        head = f"the plans' expected speedups: {self.claims} made, {self.measured} measured" + (
            f", {self.failed} failed" if self.failed else "")
        if self.median_overclaim is None or self.direction_right is None:
            return head + "; none measured yet, so none scored"
        side = "promised more than they gave" if self.median_overclaim > 1.05 else \
            "promised less than they gave" if self.median_overclaim < 1 / 1.05 else "about what they gave"
        spearman = f", rank correlation {self.spearman:.2f}" if self.spearman is not None else ""
        return (f"{head}; direction right {self.direction_right:.0%}, claimed / measured {self.median_overclaim:.2f}x at the "
                f"median (the plans {side}){spearman}")


def check_plan_claims(archive: Archive) -> Optional[PlanClaims]:
    """None for a run whose policy made no claims (the tuner, a recorded space)."""
    records = archive.all()
    speedups = {r.id: r.speedup for r in records}
    claimed, measured, failed = 0, [], 0
    for rec in records:
        claim = plan_claim(rec)
        if claim is None:
            continue
        claimed += 1
        if rec.state == "failed":
            failed += 1
            continue
        parent = 1.0 if rec.parent_id in (None, ROOT_ID) else speedups.get(rec.parent_id)
        if rec.state in TIMED and rec.speedup and parent:
            measured.append((claim, rec.speedup / parent))
    if not claimed:
        return None
    out = PlanClaims(claims=claimed, measured=len(measured), failed=failed)
    if measured:
        c, m = np.asarray(measured).T
        out.direction_right = float(np.mean((c > 1.0) == (m > 1.0)))
        out.median_overclaim = float(np.median(c / m))
        if len(measured) >= 3 and np.ptp(c) > 0 and np.ptp(m) > 0:
            out.spearman = metrics.spearman(c, m)
    return out
