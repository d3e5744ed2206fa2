"""Pydantic models that cross a boundary: CLI JSON, MCP structured content, LangGraph state, SQLite rows.

One definition serves all three faces of each tool, so a field added here shows up everywhere.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import BaseModel, Field

# The device names every face accepts: kscout.toml checks them with this pattern, `resolve_device` too
# before it asks the machine what it has.
DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"


class MeasureStatus(str, Enum):
    ok = "ok"
    incorrect = "incorrect"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    crashed = "crashed"
    budget_exhausted = "budget_exhausted"
    invalid_problem = "invalid_problem"
    run_dir_unusable = "run_dir_unusable"  # the run directory refused it (a search holds it, ...): nothing ran or was charged


class TimingStats(BaseModel):
    """Per-call times of one side (reference or candidate), in milliseconds."""

    median_ms: float = Field(description="median per-call time, balanced over the call order: the geometric mean of the "
                             "medians of the calls made first in their round and of those made right after the other side's")
    iqr_ms: float
    mean_ms: float
    min_ms: float
    repeats: int


class Measurement(BaseModel):
    """What one `measure` call found. Every runtime here was measured, never predicted."""

    status: MeasureStatus
    correct: bool = False
    runtime_ms: Optional[float] = Field(None, description="median per-call time of the candidate")
    ref_runtime_ms: Optional[float] = Field(None, description="median per-call time of the reference, same session")
    speedup: Optional[float] = Field(None, description="ref_runtime_ms / runtime_ms, a same-run ratio; not a result to "
                                     "quote unless status is ok, correct is true and timing_valid is true")
    timing_valid: bool = Field(False, description="the candidate was timed and its time counts")
    timing_invalid_reason: Optional[str] = Field(None, description="what voided the time of a candidate that ran and was "
                                                 "correct; None when it was never timed (status is not ok, or the output was "
                                                 "wrong: status and message say why)")
    charged: bool = False
    device: str = "cpu"
    message: str = ""
    candidate_timing: Optional[TimingStats] = None
    reference_timing: Optional[TimingStats] = None
    reference_alone_ms: Optional[float] = Field(None, description="median per-call time of the reference alone in a "
                                                "second worker that never loaded the candidate (set when that worker timed it)")
    candidate_flops: Optional[int] = Field(None, description="FLOPs of one candidate call, as torch's flop counter counts "
                                           "the reference's for the speed-of-light bound; counted only when asked for (a time "
                                           "under the reference's bound) and only where the count covers the call")
    flops_uncounted: Optional[str] = Field(None, description="why candidate_flops was asked for and not counted (a Triton, "
                                           "custom or native kernel does work the counter cannot see)")
    checks: list[str] = Field(default_factory=list, description="correctness and integrity checks that ran")
    warnings: list[str] = Field(default_factory=list)
    measurement_id: Optional[int] = None
    candidate_sha: Optional[str] = None
    wall_s: Optional[float] = Field(None, description="supervisor-side wall time of the whole measurement")

    @property
    def usable(self) -> bool:
        """A speedup that may be reported: it ran, was correct and its timing is valid."""
        return self.status == MeasureStatus.ok and self.correct and self.timing_valid and self.speedup is not None

    @property
    def timing_voided(self) -> bool:
        """Correct, but its timing does not count."""
        return self.status == MeasureStatus.ok and self.correct and not self.timing_valid

    @property
    def unusable_reason(self) -> Optional[str]:
        """Why it gives no speedup to report (None when `usable`): what voided the timing of a correct
        one, else its message. The search's log line, `kscout show` and the report say this."""
        if self.usable:
            return None
        return (self.timing_invalid_reason if self.timing_voided else None) or self.message


class BudgetStatus(BaseModel):
    """The measurement ledger of a run directory."""

    cap: Optional[int] = Field(None, description="measurement cap; None means uncapped")
    used: int = 0
    reserved: int = 0
    remaining: Optional[int] = None
