"""Which candidate of a code problem to measure first while no forecast can tell them apart.

The learned surrogate forecasts nothing until a problem has 8 timed candidates, so at the budgets
people give a code problem (5 to 10) most measurements are made in this cold start. Measured oldest
first, a search spent them on every variant of the reference's first rewrites before any child of a
kernel that had already won: on conv2d_relu (CPU, budget 10) four torch.compile variants of the
reference, each at 0.82x, while channels_last had measured 1.26x and its six children waited
unmeasured to the end. The order here is the one a person tuning by hand would follow:

* a variant of a rewrite goes to the back once another variant of that rewrite, applied to the same
  parent, lost to the parent (measured more than `LOST` slower, or failed): torch.compile's modes
  rarely rescue a parent that torch.compile made slower;
* then children of faster parents first, so a kernel that won is built on at once;
* then the policy's own order, oldest first (the loop's last tie-break).

An LLM policy's plan says how much faster it expects each experiment to be (GPU Kernel Scientist's
"expected uplift"). With no forecast yet, that claim is the only thing that tells two experiments on the
same parent apart, so there the parent's measured speedup is multiplied by it: the experiment expected to
end fastest goes first. The claim only orders; it is never shown as a speedup.

It only orders what the policy proposed; nothing is dropped, and with a forecast to go on the
forecast decides. Knob moves (`tunable:*`) are not held against each other: one neighbour's loss says
nothing about a different knob's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kernelscout.tools.archive import CandidateRecord
from kernelscout.tools.claim_check import plan_claim

COLD_START_ORDER = "children of faster kernels first, variants of a rewrite that lost last"  # said in the live log
PLANNED_ORDER = "the fastest expected first (the parent's measured speedup times the plan's expected speedup)"
LOST = 0.95  # a child below this fraction of its parent's speedup lost to it (the CPU spread is 10-35 %, docs/benchmarks.md)


def _family(rec: CandidateRecord) -> str | None:
    return rec.origin if rec.origin.startswith("rewrite:") else None


def order_said(candidates: Iterable[CandidateRecord]) -> str:
    """The order in words for the live log: the plans' claims when any candidate carries one."""
    return PLANNED_ORDER if any(plan_claim(rec) is not None for rec in candidates) else COLD_START_ORDER


def cold_start_order(candidates: Iterable[CandidateRecord], archive: Iterable[CandidateRecord],
                     speedup_of: Callable[[int | None], float]) -> dict[int, tuple[int, float]]:
    """A sort key for each candidate, larger first: (its rewrite has not lost under this parent, the parent's speedup
    times the plan's expected speedup over it).

    `archive` is every candidate of the run (read from run.db, so a resume orders as the search that stopped did);
    `speedup_of` gives a parent's measured speedup over the reference (1.0 for the reference itself)."""
    lost: set[tuple[int | None, str]] = set()
    for rec in archive:
        family = _family(rec)
        if family is None:
            continue
        if rec.state == "failed" or (rec.state == "measured" and rec.speedup is not None
                                     and rec.speedup < LOST * speedup_of(rec.parent_id)):
            lost.add((rec.parent_id, family))
    return {rec.id: (int((rec.parent_id, _family(rec)) not in lost), speedup_of(rec.parent_id) * (plan_claim(rec) or 1.0))
            for rec in candidates}
