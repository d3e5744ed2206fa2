"""FLOPs of one call as torch's flop counter counts them, split by operand dtype, and what it could not see.

The speed-of-light bound counts the reference's FLOPs this way (tools/sol.py). A worker counts a candidate's
own the same way when its time came in under the reference's bound: a candidate that does less work (an
algebraic simplification: a GEMM followed by a sum is a matrix-vector product) is bounded by its own FLOPs,
not the reference's. The count covers only operators torch dispatches; a Triton, custom or native kernel
does its work out of the counter's sight, so a call that ran one is reported as not covered.

This module lives in the sandbox package so that the worker's integrity check watches it, and the worker
imports it before a candidate loads when a count is asked for, so torch's flop registry is snapshotted
before the candidate could change it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

# operators torch itself defines; anything else was registered by someone (a custom op may hide any amount of work)
TORCH_NAMESPACES = frozenset({"aten", "prims", "prim"})


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


class DtypeFlopCounter(FlopCounterMode):
    """A FlopCounterMode that also splits the count by operand dtype (fp16 and fp32 FLOPs have different peaks)
    and names the operators it saw from outside torch (`foreign`)."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.by_dtype: Counter[str] = Counter()
        self.foreign: set[str] = set()

    # A private hook, called with every operator the mode runs; if a torch release drops it, by_dtype stays
    # empty and the total still holds, but `foreign` sees nothing, so `covers_call` then says no.
    def _count_flops(self, func_packet, out, args, kwargs):
        self._hooked = True
        name = str(getattr(func_packet, "_qualified_op_name", "") or "")
        if name.split("::")[0] not in TORCH_NAMESPACES:
            self.foreign.add(name or type(func_packet).__name__)  # a Triton kernel arrives as its JITFunction
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        added = self.get_total_flops() - before
        if added:
            dtypes = [t.dtype for t in _tensors(list(args)) if t.is_floating_point()]
            self.by_dtype[str(dtypes[0]).removeprefix("torch.") if dtypes else "unknown"] += added
        return result

    def uncovered(self) -> str | None:
        """Why the count may miss work the call did, or None when every operator it ran was torch's own."""
        if self.foreign:
            return "it ran operators from outside torch (" + ", ".join(sorted(self.foreign)[:3]) + ")"
        if not getattr(self, "_hooked", False):  # work done outside torch entirely (numpy, say), or a torch without the hook
            return "the flop counter saw no torch operator run"
        return None
