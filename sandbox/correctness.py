"""Output checks that run inside the sandbox worker.

Each check answers one known way to pass a harness without doing the work: lazy or subclassed
outputs, outputs that alias inputs, NaN/Inf, precision downgrades hidden by loose tolerances,
and references too weak to tell a right answer from zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

# Relative tolerance by dtype. The absolute tolerance is this times the RMS of the reference
# output, so an output of tiny magnitude does not pass by being close to zero.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}


class CheckFailed(Exception):
    """The candidate's output is wrong; the message says how."""


@dataclass
class Comparison:
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    notes: list[str] = field(default_factory=list)


def flatten_outputs(out: Any, who: str) -> list[torch.Tensor]:
    """Outputs must be plain tensors (or a tuple/list of them): subclasses can defer work past the timer."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, item in enumerate(items):
        if type(item) is not torch.Tensor:
            kind = type(item).__module__ + "." + type(item).__qualname__
            raise CheckFailed(f"{who} output {i} is a {kind}, not a plain torch.Tensor")
        if item.is_meta or item.layout != torch.strided:
            raise CheckFailed(f"{who} output {i} is not a materialised dense tensor")
    return items


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def check_no_alias(outputs: list[torch.Tensor], inputs: list[Any]) -> None:
    spans = [_storage_span(x) for x in inputs if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes()]
    for i, out in enumerate(outputs):
        lo, hi = _storage_span(out)
        if hi == lo:
            continue
        for a, b in spans:
            if lo < b and a < hi:
                raise CheckFailed(f"candidate output {i} shares memory with an input (it returns or views its input)")


def compare(cand: list[torch.Tensor], ref: list[torch.Tensor]) -> Comparison:
    """Strict elementwise comparison with dtype-aware tolerances; raises CheckFailed on mismatch."""
    if len(cand) != len(ref):
        raise CheckFailed(f"candidate returned {len(cand)} outputs, the reference {len(ref)}")
    result = Comparison()
    for i, (c, r) in enumerate(zip(cand, ref)):
        if c.shape != r.shape:
            raise CheckFailed(f"output {i} has shape {tuple(c.shape)}, expected {tuple(r.shape)}")
        if c.dtype != r.dtype:
            raise CheckFailed(f"output {i} has dtype {c.dtype}, expected {r.dtype}")
        if c.device != r.device:
            raise CheckFailed(f"output {i} is on {c.device}, expected {r.device}")
        if not (c.is_floating_point() or c.is_complex()):
            if not torch.equal(c, r):
                raise CheckFailed(f"output {i} ({c.dtype}) differs from the reference in {int((c != r).sum())} elements")
            continue
        if not bool(torch.isfinite(c).all()):
            bad = int((~torch.isfinite(c)).sum())
            if bool(torch.isfinite(r).all()) or not torch.equal(torch.isfinite(c), torch.isfinite(r)):
                raise CheckFailed(f"output {i} has {bad} NaN or Inf values")
        tol = TOLERANCE.get(r.dtype, 1e-4)
        r64, c64 = r.double(), c.double()
        finite = torch.isfinite(r64)
        rms = float(r64[finite].pow(2).mean().sqrt()) if bool(finite.any()) else 0.0
        atol = tol * max(rms, 1e-12)
        diff = (c64 - r64).abs()
        diff = torch.where(finite, diff, torch.zeros_like(diff))
        allowed = atol + tol * r64.abs()
        bad = diff > allowed
        if diff.numel():
            result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
            result.max_rel_diff = max(result.max_rel_diff, float((diff / (r64.abs() + atol)).max()))
        if bool(bad.any()):
            n = int(bad.sum())
            raise CheckFailed(
                f"output {i} differs from the reference in {n} of {diff.numel()} elements "
                f"(max abs diff {float(diff.max()):.3g}, tolerance {tol:g} relative, {atol:.3g} absolute for {r.dtype})"
            )
    return result


def weak_reference_reason(per_seed_outputs: list[list[torch.Tensor]], input_scale: float = 0.0) -> str | None:
    """Say why a reference cannot tell a right answer from a cheap wrong one, or None if it can.

    Zeros pass allclose when the true outputs are ~0; a constant passes when they barely vary;
    a cached answer passes when the outputs do not depend on the inputs at all.
    """
    first = per_seed_outputs[0]
    for i, out in enumerate(first):
        if not out.is_floating_point() or out.numel() == 0:
            continue
        x = out.double()
        finite = x[torch.isfinite(x)]
        if finite.numel() == 0:
            return f"reference output {i} is entirely NaN/Inf"
        tol = TOLERANCE.get(out.dtype, 1e-4)
        scale = float(finite.abs().max())
        if scale < 1e-6 * max(input_scale, 1.0):
            return (
                f"reference output {i} is ~0 everywhere (max |value| {scale:.2g} for inputs up to {input_scale:.2g}): "
                "it is numerical noise, so no candidate can be checked against it"
            )
        near_zero = float((finite.abs() <= 1e-3 * scale).double().mean()) if scale else 1.0
        if near_zero > 0.95:
            return f"{near_zero:.0%} of reference output {i} is ~0: zeros would pass the check"
        if finite.numel() >= 16:
            spread = float((finite - finite.mean()).abs().max())
            if spread <= max(1e-6, 10 * tol) * max(scale, 1e-12):
                return f"reference output {i} is nearly constant (spread {spread:.2g} around {float(finite.mean()):.3g})"
    if len(per_seed_outputs) > 1:
        for i, out in enumerate(first):
            if all(torch.equal(out, other[i]) for other in per_seed_outputs[1:]):
                if out.numel() > 1 or out.is_floating_point():
                    return f"reference output {i} is identical for different random inputs: a cached answer would pass"
    return None


def tensor_bytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def describe_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
