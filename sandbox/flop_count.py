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
TORCH_NAMESPACES = frozenset({"aten"})  # prims too is open to torch.library definitions


def tensors_of(x: Any) -> list[torch.Tensor]:
    """Every tensor in a value, depth first through lists, tuples and dicts (an operator's arguments, a model's outputs)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in tensors_of(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in tensors_of(item)]
    return []


def _shape_formulas() -> dict:
    """Products torch's counter has no formula for, in its formulas' form (operand shapes in, FLOPs out): without
    them a matrix-vector product or an in-place GEMM would count as nothing in a strict count."""
    aten = torch.ops.aten

    def mv(mat, vec, *args, out_shape=None, **kwargs) -> int:
        return 2 * mat[0] * mat[1]

    def addmv(self, mat, vec, *args, out_shape=None, **kwargs) -> int:
        return 2 * mat[0] * mat[1]

    def dot(a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0]

    def addmm(self, a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0] * a[1] * b[1]

    def batched(self, a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0] * a[1] * a[2] * b[2]

    def addr(self, a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0] * b[0]

    def attention(q, k, v, *args, out_shape=None, **kwargs) -> int:  # torch prices the GPU kernels, not the CPU one
        batch = 1
        for d in q[:-2]:
            batch *= d
        return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])

    table = {"_scaled_dot_product_flash_attention_for_cpu": attention, "mv": mv, "addmv": addmv, "addmv_": addmv, "dot": dot, "vdot": dot, "addmm_": addmm, "addbmm": batched,
             "addbmm_": batched, "baddbmm_": batched, "addr": addr, "addr_": addr, "outer": lambda a, b, *r, **k: a[0] * b[0],
             "ger": lambda a, b, *r, **k: a[0] * b[0]}
    return {getattr(aten, name): fn for name, fn in table.items() if hasattr(aten, name)}


# Operators a strict count prices by their first input's elements times this: fused normalisations and scans
# that torch runs as one kernel (none of them can hide a product's FLOPs).
_PER_ELEMENT = {"_softmax": 5, "_log_softmax": 5, "native_layer_norm": 8, "native_group_norm": 8, "native_batch_norm": 8,
                "_native_batch_norm_legit": 8, "_native_batch_norm_legit_no_training": 4, "cumsum": 1, "cumprod": 1,
                "logsumexp": 3, "_safe_softmax": 5, "linalg_vector_norm": 2, "norm": 2,
                # windowed and selecting reductions: at least an element of input each
                "max_pool2d_with_indices": 1, "max_pool3d_with_indices": 1, "avg_pool2d": 1, "avg_pool3d": 1,
                "adaptive_max_pool2d": 1, "adaptive_max_pool3d": 1, "_adaptive_avg_pool2d": 1, "_adaptive_avg_pool3d": 1,
                "topk": 1, "sort": 1, "kthvalue": 1, "median": 1, "mode": 1, "cummax": 1, "cummin": 1}
# Operators that move or make data and compute nothing (views are told by their schema).
_MOVEMENT = frozenset({
    "copy_", "_to_copy", "clone", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_", "scalar_tensor", "arange",
    "cat", "stack", "index", "index_select", "gather", "scatter", "scatter_", "index_put", "index_put_", "index_copy",
    "constant_pad_nd", "repeat", "flip", "roll", "tril", "triu", "embedding", "masked_select", "nonzero", "slice_scatter",
    "select_scatter", "_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "resize_", "set_", "_unsafe_view",
    "contiguous", "masked_scatter", "diag_embed", "diagonal_scatter", "as_strided_scatter", "_reshape_copy",
    "_unsafe_index", "randn", "rand", "randint", "randperm", "normal", "normal_", "uniform_", "bernoulli_", "random_",
    "exponential_", "randn_like", "rand_like", "randint_like",
})


def _overloads(func_packet: Any) -> list[Any]:
    """The packet's overloads: the counter is handed the packet, whose `default` may be a scalar overload
    (aten::add.default adds two numbers), so a tag or schema is read from all of them."""
    names = func_packet.overloads() if hasattr(func_packet, "overloads") else []
    return [o for o in (getattr(func_packet, n, None) for n in names) if o is not None]


def _tagged(overloads: list[Any], tag: Any) -> bool:
    return any(tag in o.tags for o in overloads)


def _is_view(overloads: list[Any]) -> bool:
    """Every overload that returns tensors returns aliases it does not write: a view."""
    seen = False
    for o in overloads:
        returns = [r for r in o._schema.returns if "Tensor" in str(r.type)]
        if not returns:
            continue
        seen = True
        if not all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return False
    return seen


def _numel(x: Any) -> int:
    return sum(t.numel() for t in tensors_of(x))


class DtypeFlopCounter(FlopCounterMode):
    """A FlopCounterMode that also splits the count by operand dtype (fp16 and fp32 FLOPs have different peaks),
    names the operators it saw from outside aten (`foreign`) and, when strict, those it could not price."""

    def __init__(self, strict: bool = False) -> None:
        """strict: a candidate's count. Elementwise work and reductions count too (an element each, the
        normalisations a few), and an operator the count cannot price makes it uncovered: a GEMM run as a
        broadcast multiply and a sum, or through an in-place product, still counts as a GEMM's work. The
        reference's count, which the speed-of-light bound has always used, counts only products."""
        super().__init__(display=False, custom_mapping=_shape_formulas() if strict else {})
        self.strict = strict
        self.by_dtype: Counter[str] = Counter()
        self.foreign: set[str] = set()
        self.unpriced: set[str] = set()
        self.elementwise = 0
        self._hooked = False

    # A private hook, called with every operator the mode runs; if a torch release drops it, by_dtype stays
    # empty and the total still holds, but nothing is seen run, so `uncovered` then says the count is not whole.
    def _count_flops(self, func_packet, out, args, kwargs):
        self._hooked = True
        name = str(getattr(func_packet, "_qualified_op_name", "") or "")
        if name.split("::")[0] not in TORCH_NAMESPACES:
            self.foreign.add(name or type(func_packet).__name__)  # a Triton kernel arrives as its JITFunction
        before = self.get_total_flops()
        result = super()._count_flops(func_packet, out, args, kwargs)
        added = self.get_total_flops() - before
        if self.strict and func_packet not in self.flop_registry:
            self.elementwise += self._priced(func_packet, name, out, args)
        if added:
            dtypes = [t.dtype for t in tensors_of(list(args)) if t.is_floating_point()]
            self.by_dtype[str(dtypes[0]).removeprefix("torch.") if dtypes else "unknown"] += added
        return result

    def _priced(self, func_packet: Any, name: str, out: Any, args: Any) -> int:
        overloads = _overloads(func_packet)
        short = name.split("::")[-1]
        if _tagged(overloads, torch.Tag.pointwise):
            return _numel(out)
        if _tagged(overloads, torch.Tag.reduction):
            return _numel(tensors_of(list(args))[:1])
        if short in _PER_ELEMENT:
            return _PER_ELEMENT[short] * _numel(tensors_of(list(args))[:1])
        if short in _MOVEMENT or _is_view(overloads):
            return 0
        self.unpriced.add(name or type(func_packet).__name__)
        return 0

    def total(self) -> int:
        """Products by their formulas, and in a strict count the elementwise work too."""
        return int(self.get_total_flops()) + self.elementwise

    def uncovered(self) -> str | None:
        """Why the count may miss work the call did, or None when every operator it ran was torch's own."""
        if self.foreign:
            return "it ran operators from outside torch (" + ", ".join(sorted(self.foreign)[:3]) + ")"
        if self.unpriced:
            return ("it ran operators the count has no price for (" + ", ".join(sorted(self.unpriced)[:3])
                    + "), which could hide a product's work")
        if not self._hooked:  # work done outside torch entirely (numpy, say), or a torch without the hook
            return "the flop counter saw no torch operator run"
        return None
