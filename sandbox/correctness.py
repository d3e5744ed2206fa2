"""Output checks that run inside the sandbox worker.

Each check answers one known way to pass a harness without doing the work: lazy or subclassed
outputs, outputs that alias inputs, NaN/Inf, precision downgrades hidden by loose tolerances,
and references too weak to tell a right answer from zeros.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Optional

import torch

# Relative tolerance by dtype. The absolute tolerance is this times the reference output's typical
# magnitude around each element (`_typical_magnitude`), so an output of tiny magnitude does not pass
# by being close to zero.
TOLERANCE: Mapping[torch.dtype, float] = MappingProxyType({  # read-only: candidate code shares the process
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
})


class CheckFailed(Exception):
    """The candidate's output is wrong; the message says how."""


@dataclass
class Comparison:
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    notes: list[str] = field(default_factory=list)


# Deeper nesting than this is a runaway (or self-referential) container, not a model's output.
MAX_NESTING = 16


class Outputs(list):
    """The output tensors in a flat list, remembering how the model nested them.

    ``structure`` is a tuple with "tensor" for each tensor and a tuple for each nested tuple/list
    (tuples and lists count alike, and a bare tensor is kept as a 1-tuple with ``bare`` set); ``paths``
    gives each tensor's index path, e.g. (1, 0) for out[1][0]. A bare tensor and a tuple of one are not
    alike to a caller (`y + 1` works on one of them only), so the comparison tells them apart.
    """

    structure: tuple = ()
    bare: Optional[bool] = None
    paths: list[tuple[int, ...]]


def _path_label(path: tuple[int, ...]) -> str:
    if not path:
        return "output"
    return f"output {path[0]}" + "".join(f"[{j}]" for j in path[1:])


def _label(outputs: list, i: int) -> str:
    paths = getattr(outputs, "paths", None)
    if paths is not None and i < len(paths):
        return _path_label(paths[i])
    return f"output {i}"


def describe_structure(structure: tuple) -> str:
    def show(node: Any) -> str:
        if isinstance(node, tuple):
            return "(" + ", ".join(show(x) for x in node) + ("," if len(node) == 1 else "") + ")"
        return str(node)

    return "[" + ", ".join(show(x) for x in structure) + "]"


def flatten_outputs(out: Any, who: str, materialised: bool = True) -> Outputs:
    """Outputs must be plain tensors, or tuples/lists of them nested to any depth (nn.LSTM returns
    (out, (h, c))): subclasses can defer work past the timer. Tensors come out depth-first, in order.
    `materialised=False` lets meta tensors through: `kscout sol` runs the reference on the meta device
    and checks only the outputs' kinds, so that it does not give bounds for a problem the harness refuses."""
    flat = Outputs()
    flat.paths = []
    flat.bare = not _sequence(out)

    def walk(item: Any, path: tuple[int, ...]) -> Any:
        if _sequence(item):
            if len(path) >= MAX_NESTING:
                raise CheckFailed(f"{who} {_path_label(path)} is nested more than {MAX_NESTING} levels deep")
            # tuple's or list's own iterator, never the subclass's: a review's candidate returned a list
            # subclass whose __iter__ finished 65% of the softmax rows, here, after the timer (5.97x valid)
            items = tuple.__iter__(item) if issubclass(type(item), tuple) else list.__iter__(item)
            return tuple(walk(x, path + (j,)) for j, x in enumerate(items))
        if type(item) is not torch.Tensor:
            kind = type(item).__module__ + "." + type(item).__qualname__
            where = f"{who}'s return value" if flat.bare else f"{who} {_path_label(path)}"
            if isinstance(item, dict):
                hint = " (return a tuple of tensors instead)"
            elif isinstance(item, torch.nn.Parameter):
                hint = " (return it detached, such as self.weight.detach(), or a copy)"
            elif item is None and flat.bare:
                hint = " (a forward that only updates its inputs in place should return them, such as `return param`)"
            else:
                hint = ""
            raise CheckFailed(f"{where} is a {kind}, not a plain torch.Tensor; outputs are tensors, or tuples or lists of "
                              f"them{hint}")
        if (item.is_meta and materialised) or item.layout != torch.strided:
            raise CheckFailed(f"{who} {_path_label(path)} is not a materialised dense tensor")
        flat.append(item)
        flat.paths.append(path)
        return "tensor"

    flat.structure = (walk(out, (0,)),) if flat.bare else walk(out, ())
    return flat


def portable(outputs: Outputs) -> dict:
    """Flat outputs as plain data on the CPU, for another process to judge (`from_portable`): each tensor
    compacted into a storage of its own, so a view does not carry the rest of its storage along."""
    return {"structure": outputs.structure, "paths": list(outputs.paths),
            "tensors": [t.detach().to("cpu", copy=True).contiguous() for t in outputs]}


def from_portable(data: Any, who: str = "candidate") -> Outputs:
    """The inverse of `portable`, for data another process wrote: anything but that shape is refused."""
    if not isinstance(data, dict) or not isinstance(data.get("tensors"), list):
        raise CheckFailed(f"the {who}'s outputs were not written as outputs")
    flat = Outputs(data["tensors"])
    if any(type(t) is not torch.Tensor for t in flat):
        raise CheckFailed(f"the {who}'s outputs were not written as plain tensors")
    # names for messages only, and the candidate's to write: anything odd about them is dropped, not trusted
    structure, paths = data.get("structure"), data.get("paths")
    flat.structure = structure if isinstance(structure, tuple) else ()
    ok = isinstance(paths, list) and len(paths) == len(flat) and all(
        isinstance(p, (tuple, list)) and all(type(i) is int for i in p) for p in paths)
    flat.paths = [tuple(p) for p in paths] if ok else []
    return flat


def fingerprint(values: list) -> list[list[float]]:
    """Sums and sums of squares of each tensor, in float64: whether two processes made the same inputs."""
    out = []
    for t in values:
        d = t.detach().to(torch.float64) if not t.is_complex() else torch.view_as_real(t.detach()).to(torch.float64)
        out.append([float(d.sum()), float((d * d).sum())])
    return out


def same_fingerprint(a: Any, b: list[list[float]]) -> bool:
    if not isinstance(a, list) or len(a) != len(b):
        return False
    try:
        return all(math.isclose(float(x), y, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(y) and math.isnan(float(x)))
                   for pa, pb in zip(a, b) for x, y in zip(pa, pb, strict=True))
    except (TypeError, ValueError):
        return False


def _sequence(item: Any) -> bool:
    """A tuple or list by its real type (named tuples and torch.return_types included); `isinstance`
    would believe an object that fakes `__class__`."""
    return issubclass(type(item), (tuple, list))


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def aliased_inputs(outputs: list[torch.Tensor], inputs: list[Any]) -> frozenset[tuple[int, int]]:
    """(output index, input index) for each output whose memory overlaps an input tensor's: the output is
    that input, updated in place, or a view of it."""
    spans = [(j, storage_span(x)) for j, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes()]
    pairs = set()
    for i, out in enumerate(outputs):
        lo, hi = storage_span(out)
        if hi == lo:
            continue
        pairs.update((i, j) for j, (a, b) in spans if lo < b and a < hi)
    return frozenset(pairs)


def check_no_alias(outputs: list[torch.Tensor], inputs: list[Any], allowed: frozenset[tuple[int, int]] = frozenset()) -> None:
    """An output may share memory with an input only where the reference's output does (a model that
    updates its input in place and returns it, or returns a view of it); anywhere else the caller's data
    and the result would be one buffer, which a drop-in replacement must not make them."""
    for i, j in sorted(aliased_inputs(outputs, inputs) - allowed):
        where = "; the reference returns a new tensor there" if not any(k == i for k, _ in allowed) else \
            f"; the reference's shares memory only with input {sorted(k for o, k in allowed if o == i)}"
        raise CheckFailed(f"candidate {_label(outputs, i)} shares memory with input tensor {j} "
                          f"(it returns or views its input){where}")


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype.to_real() if dtype.is_complex else dtype


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance for an output dtype; a complex dtype uses its component dtype's."""
    return TOLERANCE.get(_real_dtype(dtype), 1e-4)


def _components(t: torch.Tensor) -> torch.Tensor:
    """float64 copy with a trailing axis of components: (re, im) for complex, one for real."""
    t = t.resolve_conj().resolve_neg()
    if t.is_complex():
        return torch.view_as_real(t).double()
    return t.double().unsqueeze(-1)


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(v) for v in torch.nonzero(mask)[0])


def _elements(n: int) -> str:
    return "1 element is" if n == 1 else f"{n} elements are"


def _nonfinite_mismatches(c: torch.Tensor, r: torch.Tensor) -> list[str]:
    """Where the reference is NaN the candidate must be NaN, where it is +inf/-inf the same
    infinity, and where it is finite finite. c and r have a trailing component axis; each entry
    says which kind of mismatch, how many elements and the first index."""
    inf = float("inf")
    r_fin, c_fin = torch.isfinite(r), torch.isfinite(c)
    c_nan = torch.isnan(c)
    found = []
    for what, mask in (
        ("NaN in the reference but not in the candidate", torch.isnan(r) & ~c_nan),
        ("+inf in the reference but not in the candidate", (r == inf) & (c != inf)),
        ("-inf in the reference but not in the candidate", (r == -inf) & (c != -inf)),
    ):
        el = mask.any(-1)
        if bool(el.any()):
            found.append(f"{_elements(int(el.sum()))} {what} (first at index {_first_index(el)})")
    el = (r_fin & ~c_fin).any(-1)
    if bool(el.any()):
        n_nan = int((r_fin & c_nan).any(-1).sum())
        n_inf = int((r_fin & ~c_fin & ~c_nan).any(-1).sum())
        found.append(
            f"{_elements(int(el.sum()))} NaN or Inf in the candidate where the reference is finite "
            f"({n_nan} NaN, {n_inf} Inf; first at index {_first_index(el)})"
        )
    return found


# A slice (all elements that share one index on one axis: a row, a column, a channel) of fewer
# elements than this says little about the output's scale there: a few values near zero together
# are a matter of chance, not of the output's layout.
MIN_SLICE = 32
# The rank-one estimate is taken this many times larger: the RMS of a slice of a few dozen ordinary
# values can be half the whole's by chance, and a tolerance meant to forgive reordering error should
# only tighten where the output really has quiet regions (outlier channels are 100 to 10^4 times apart).
# 16 rather than 4 leaves honest kernels more room where rows differ in scale for reasons the output cannot
# show: a row centred from inputs near 1000 carries the reference's own rounding error (eps x 1000) on values
# near 0.05. That case (QA, 2026-12-05) still fails at 16: an error set by the inputs' size needs the inputs'
# scale, and the largest input is no such scale where a problem passes a -1e9 mask (the tolerance would grow
# a billionfold). `judge` settles it instead, with a float64 run of the reference as a second opinion.
SLICE_SLACK = 16.0
# The absolute tolerance is never scaled below this share of the whole output's RMS, so that a slice
# that is near zero throughout (a masked row, a constant input row less its mean) does not demand
# exact agreement from a kernel that sums in another order.
SLICE_FLOOR = 0.01


def _typical_magnitude(mag: torch.Tensor, whole: Optional[torch.Tensor]) -> torch.Tensor:
    """Each element's scale for the absolute tolerance: the whole output's RMS times, for every axis, the
    RMS of the element's slice on that axis over the whole's (a rank-one model of the magnitudes: exact where
    they are a product of a row's and a column's scale), SLICE_SLACK times that, kept between SLICE_FLOOR and
    1 times the whole's RMS.

    Why not the whole output's RMS alone: with a few outlier channels (LLM activations 10^4 times the rest)
    it is above every ordinary element's value, so any error in the ordinary channels passed (a QA candidate
    off by 0.1 everywhere but the outliers was judged correct). Why not the quietest slice alone: a matmul with
    one outlier token row makes errors along that row that its columns, mostly ordinary rows, do not
    reflect. Reordering error, what the absolute tolerance forgives, scales with the magnitudes an element is
    computed from, which the product of its slices' scales follows in both cases. Capped at the whole's RMS,
    no element's tolerance is looser than it was."""
    square = mag.square()
    if whole is None:  # finite everywhere
        overall = float(square.mean().sqrt())
    else:
        overall = float(square[whole].mean().sqrt()) if bool(whole.any()) else 0.0
    overall = max(overall, 1e-12)
    scale = None
    for axis, size in enumerate(mag.shape):
        if size < 2 or mag.numel() // size < MIN_SLICE:
            continue
        others = [d for d in range(mag.dim()) if d != axis]
        ratio = square.mean(dim=others, keepdim=True).sqrt() / overall
        scale = ratio if scale is None else scale * ratio
    if scale is None:
        return torch.tensor(overall, dtype=mag.dtype)
    return (scale * (SLICE_SLACK * overall)).clamp_(min=SLICE_FLOOR * overall, max=overall)


# A quantised output may differ from the reference by exactly 1 in at most one element in this many (none
# in an output of fewer elements): quantised kernels round float math whose last bits depend on the order
# of a sum, and an honest split-K int8 GEMM came out one step apart in 1 of 16,384 elements.
INTEGER_TIES = 1000
# What a quantised output is stored in. int64 is left out: it is what indices (argmax, topk, sort) and counts
# come in, where a neighbouring value is simply wrong; so are unsigned 64-bit values, which int64 cannot hold.
QUANTISED_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32})
# A quantised output takes many levels; one with fewer distinct values (counts that are mostly 0, flags) is not
# the rounding of a float, and a candidate that returns zeros must not pass it a step at a time.
QUANTISED_LEVELS = 8


def _rounded_at_ties(c: torch.Tensor, r: torch.Tensor) -> Optional[int]:
    """How many elements are one step apart, when that is all that differs and few enough to be ties; else None."""
    if c.dtype not in QUANTISED_DTYPES:
        return None
    apart = c != r
    count = int(apart.sum())
    if count > c.numel() // INTEGER_TIES:
        return None
    if torch.unique(r).numel() < QUANTISED_LEVELS:
        return None
    if not bool(((c[apart].long() - r[apart].long()).abs() == 1).all()):  # 32 bits at most: no wrap in int64
        return None
    return count


def _magnitude_and_error(name: str, c: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(|reference|, |candidate - reference|, where the reference is finite: None for everywhere), in float64.

    A real output that is finite on both sides, nearly every output, takes a shorter way than the general one
    (complex components, non-finite values matched in kind): on a 16M-element float32 output the check took
    1.6 s on this CPU, and a measurement makes it in every trial and every re-checked round."""
    if not r.is_complex() and r.numel():
        r64 = r.double()
        diff = c.double().sub_(r64).abs_()
        mag = r64.abs_()
        if math.isfinite(float(mag.max()) + float(diff.max())):  # a NaN anywhere carries through max
            return mag, diff, None
        del r64, diff, mag
    c64, r64 = _components(c), _components(r)
    mismatches = _nonfinite_mismatches(c64, r64)
    if mismatches:
        raise CheckFailed(f"{name} has NaN/Inf where the reference does not agree: " + "; ".join(mismatches))
    whole = torch.isfinite(r64).all(-1)
    # Non-finite values match in kind by now (and the candidate's are only where the
    # reference's are): they drop out of the numeric comparison as zeros on both sides.
    r64 = r64.nan_to_num(0.0, 0.0, 0.0)
    c64 = c64.nan_to_num(0.0, 0.0, 0.0)
    return torch.linalg.vector_norm(r64, dim=-1), torch.linalg.vector_norm(c64 - r64, dim=-1), whole


def _check_structure(cand: list, ref: list) -> None:
    cb, rb = getattr(cand, "bare", None), getattr(ref, "bare", None)
    if cb is not None and rb is not None and cb != rb:
        kinds = {True: "a bare tensor", False: "a tuple or list of tensors"}
        raise CheckFailed(f"the candidate returns {kinds[cb]}, the reference {kinds[rb]}; return what the reference "
                          "returns, so that the candidate can replace it in its callers")
    cs, rs = getattr(cand, "structure", None), getattr(ref, "structure", None)
    if cs is not None and rs is not None and cs != rs:
        raise CheckFailed(
            f"candidate outputs are nested as {describe_structure(cs)}, the reference's as {describe_structure(rs)}"
        )


def compare(cand: list[torch.Tensor], ref: list[torch.Tensor], slack: Optional[list[float]] = None) -> Comparison:
    """Strict elementwise comparison with dtype-aware tolerances; raises CheckFailed on mismatch.

    Complex outputs are compared on both components: the error is |candidate - reference| as a
    complex number, against the tolerance times |reference|. Non-finite values must match exactly
    in kind (NaN, +inf, -inf), and a candidate may not produce them where the reference is finite.
    `slack`, per output, is an absolute allowance added to the tolerance (`judge`: the reference's own error).
    """
    if len(cand) != len(ref):
        raise CheckFailed(f"candidate returned {len(cand)} outputs, the reference {len(ref)}")
    _check_structure(cand, ref)
    result = Comparison()
    for i, (c, r) in enumerate(zip(cand, ref)):
        name = _label(ref, i)
        if c.shape != r.shape:
            raise CheckFailed(f"{name} has shape {tuple(c.shape)}, expected {tuple(r.shape)}")
        if c.dtype != r.dtype:
            raise CheckFailed(f"{name} has dtype {c.dtype}, expected {r.dtype}")
        if c.device != r.device:
            raise CheckFailed(f"{name} is on {c.device}, expected {r.device}")
        if not (c.is_floating_point() or c.is_complex()):
            if torch.equal(c, r):
                continue
            ties = _rounded_at_ties(c, r)
            if ties is None:
                hint = (" (integer outputs are compared exactly: if these are indices from a sort, topk or argmax, tied values "
                        "must come out in the reference's order, e.g. stable=True only if the reference sorts stably)") if c.dtype == torch.int64 else ""
                raise CheckFailed(f"{name} ({c.dtype}) differs from the reference in {int((c != r).sum())} elements{hint}")
            result.notes.append(
                f"{name} ({c.dtype}) differs from the reference by 1 in {ties} of {c.numel()} elements, allowed for quantised "
                f"outputs in up to 1 element in {INTEGER_TIES}: a float result rounded to an integer (quantisation) comes out "
                "one step apart where the two sides' rounding differs at a tie")
            continue
        tol = tolerance(r.dtype)
        mag, diff, whole = _magnitude_and_error(name, c, r)
        atol = _typical_magnitude(mag, whole).mul_(tol)
        if slack is not None and slack[i]:
            atol = atol + slack[i]
        allowed = torch.add(atol, mag, alpha=tol)
        bad = diff > allowed
        if diff.numel():
            result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
            result.max_rel_diff = max(result.max_rel_diff, float((diff / (mag + atol)).max()))
        if bool(bad.any()):
            n = int(bad.sum())
            first = _first_index(bad)
            raise CheckFailed(
                f"{name} differs from the reference in {n} of {diff.numel()} elements, first at index {first} "
                f"(there {float(diff[first]):.3g} off a value of {float(mag[first]):.3g}; max abs diff {float(diff.max()):.3g}; "
                f"tolerance {tol:g} relative, {float(atol.expand(mag.shape)[first]):.3g} absolute there for {r.dtype})"
            )
    return result


# How far the reference may be from its float64 run for that run to count as the same function: the RMS of their
# difference against the RMS of the output, at most this share or twice the dtype's tolerance, whichever is larger. The
# reference's own rounding error is what the run is there to show, and on ill-conditioned inputs it is many tolerances
# (rows near 1000 centred to values near 0.05: 10 to 20); a run that computes something else (a forward that branches
# on its weights' dtype) is off by about the output's own size.
EXACT_GUARD = 0.01
# Judged against the float64 run, a candidate may be off by the tolerance plus this many times the RMS of the
# reference's own error over the whole output: a float32 kernel that sums in another order is about as far from exact
# as the reference, and held to the reference the two errors add up. The whole output's RMS, not each row's: where the
# reference happened to round well (a row's mean nearly exact) an honest candidate need not (QA, 2026-12-05: a blocked
# sum failed 2 measurements in 8 against an allowance taken row by row).
ERROR_SLACK = 4.0


def _rounding_can_explain(cand: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    """Whether a float64 run of the reference could change the verdict: the outputs agree in everything but
    their values, and some are floats narrower than float64, whose rounding the reference also suffers."""
    if len(cand) != len(ref):
        return False
    try:
        _check_structure(cand, ref)
    except CheckFailed:
        return False
    narrow = False
    for c, r in zip(cand, ref):
        if c.shape != r.shape or c.dtype != r.dtype or c.device != r.device:
            return False
        narrow |= (r.is_floating_point() or r.is_complex()) and _real_dtype(r.dtype) != torch.float64
    return narrow


def _lines_up(exact: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    """The float64 run's outputs match the reference's in number, shape, device and kind (float, complex, integer)."""
    if len(exact) != len(ref):
        return False
    for e, r in zip(exact, ref):
        if e.shape != r.shape or e.device != r.device or e.is_complex() != r.is_complex():
            return False
        if (r.is_floating_point() or r.is_complex()) != (e.is_floating_point() or e.is_complex()):
            return False
    return True


def _rms(t: torch.Tensor) -> float:
    return float(t.square().mean().sqrt()) if t.numel() else 0.0


def _own_error(ref: torch.Tensor, exact: torch.Tensor) -> Optional[float]:
    """The RMS over the output of the reference's error against its float64 run (finite elements; 0 for an integer
    output), or None when the two are further apart than EXACT_GUARD allows, and so compute different functions."""
    if not (ref.is_floating_point() or ref.is_complex()):
        return 0.0
    r64, e64 = _components(ref), _components(exact)
    finite = (torch.isfinite(r64).all(-1) & torch.isfinite(e64).all(-1)).unsqueeze(-1)
    r64, e64 = r64.nan_to_num(0.0, 0.0, 0.0) * finite, e64.nan_to_num(0.0, 0.0, 0.0) * finite
    err = _rms(torch.linalg.vector_norm(r64 - e64, dim=-1))
    if err > max(EXACT_GUARD, 2 * tolerance(ref.dtype)) * _rms(torch.linalg.vector_norm(e64, dim=-1)):
        return None
    return err


def judge(cand: list[torch.Tensor], ref: list[torch.Tensor],
          exact: Optional[Callable[[], Optional[list[torch.Tensor]]]] = None) -> Comparison:
    """`compare`, with a second opinion where the reference's own rounding may be to blame.

    A reference computed in float32 from ill-conditioned inputs (rows near 1000 centred to values near 0.05)
    carries rounding error above the tolerance, and a candidate that is more accurate (a float64 mean) was
    judged wrong by it. When the candidate fails and only float values differ, `exact()` runs the reference in
    float64 on the same inputs (sandbox/exact_reference.py). The candidate passes if it is within the usual
    tolerance of that run, rounded to the output's dtype, plus ERROR_SLACK times the RMS of the reference's own
    error, provided the reference is within EXACT_GUARD of the run (so that the run computes the reference's
    function, not another). Otherwise the first failure stands, with its message; so it does when the second
    look cannot be afforded (memory). A note says the candidate was judged this way, for the measurement's warnings."""
    try:
        return compare(cand, ref)
    except CheckFailed as failure:
        if exact is None or not _rounding_can_explain(cand, ref):
            raise
        outputs = exact()
        try:
            if outputs is None or not _lines_up(outputs, ref):
                raise failure
            errors = [_own_error(r, e) for r, e in zip(ref, outputs)]
            if any(e is None for e in errors):
                raise failure
            rounded = [e.to(r.dtype) if r.is_floating_point() or r.is_complex() else r for e, r in zip(outputs, ref)]
            result = compare(cand, rounded, slack=[ERROR_SLACK * e for e in errors])
        except Exception:  # not within it, or no memory left for a second look: the first verdict stands
            raise failure from None
        result.notes.append(
            f"outside the tolerance of the reference ({failure}), but as close to the reference run in float64 on the "
            f"same inputs as the reference itself is (the tolerance plus {ERROR_SLACK:g} times the RMS of the reference's "
            "own rounding error): the inputs are ill-conditioned for the output's dtype, and the reference's rounding is "
            "no standard a kernel must repeat")
        return result


def check_inputs_kept(cand_inputs: list[torch.Tensor], ref_inputs: list[torch.Tensor],
                      originals: Optional[Callable[[], list[torch.Tensor]]] = None) -> None:
    """After both calls, the candidate's inputs must be as the reference leaves its own (both started
    equal). A kernel that writes into its arguments destroys its caller's data, so it is no drop-in
    replacement, whatever its output; one whose reference updates an input in place must do the same.
    `originals` makes the inputs again as they were before either call, only to say which side wrote."""
    for i, (c, r) in enumerate(zip(cand_inputs, ref_inputs)):
        if c.shape != r.shape or c.dtype != r.dtype:
            raise CheckFailed(f"the candidate changed input tensor {i} in place (now shape {tuple(c.shape)}, {c.dtype})")
        if torch.equal(c, r) or ((c.is_floating_point() or c.is_complex()) and _passes([c], [r])):
            continue  # an integer input (token ids, indices) must be left exactly as it was
        before = originals()[i] if originals is not None else None
        if before is not None and before.shape == c.shape and torch.equal(c, before):
            raise CheckFailed(f"the reference updates input tensor {i} (shape {tuple(c.shape)}) in place and the candidate "
                              "left it unchanged: a drop-in replacement must make the same update")
        if before is not None and before.shape == r.shape and torch.equal(r, before):
            raise CheckFailed(f"the candidate wrote into input tensor {i} (shape {tuple(c.shape)}), which the reference "
                              "leaves unchanged. A kernel must leave its caller's tensors as the reference does")
        raise CheckFailed(f"the candidate wrote into input tensor {i} (shape {tuple(c.shape)}): after the call it differs "
                          "from the reference's copy. A kernel must leave its caller's tensors as the reference does")


def _passes(cand: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    try:
        compare(cand, ref)
    except CheckFailed:
        return False
    return True


def finite_input_scale(inputs: list[Any]) -> float:
    """Largest finite |value| among the floating-point (or complex) input tensors; an additive
    -inf mask does not make the scale infinite."""
    scale = 0.0
    for x in inputs:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.numel():
            a = x.detach().abs()
            a = a[torch.isfinite(a)]
            if a.numel():
                scale = max(scale, float(a.max()))
    return scale


# A constant or a cached answer is only judged on outputs with at least this many elements: a
# scalar (a loss) always equals its own mean, and one that concentrates is no cheap guess.
MIN_ELEMENTS_TO_JUDGE = 16


def weak_reference_reason(per_seed_outputs: list[list[torch.Tensor]], input_scale: float = 0.0) -> str | None:
    """Say why a reference cannot tell a right answer from a cheap wrong one, or None if it can.

    The question is asked of compare() itself: would all zeros, a constant, or another input's
    answer (a cached one) pass the check against the reference's output? Cheap answers keep the
    reference's NaN/Inf where it has them, so a mask alone does not make an output checkable.
    Separately, an output below the rounding error of the inputs (every |value| under the
    dtype's epsilon times the largest finite input) is numerical noise no candidate can match.
    """
    first = per_seed_outputs[0]
    if first and all(out.numel() == 0 for out in first):
        return ("every reference output is empty (0 elements), so there is nothing to check a candidate against: "
                "give get_inputs() sizes above zero")
    for i, out in enumerate(first):
        if not (out.is_floating_point() or out.is_complex()) or out.numel() == 0:
            continue
        name = _label(first, i)
        finite = torch.isfinite(out)
        if not bool(finite.any()):
            return f"reference {name} is entirely NaN/Inf"
        magnitude = out[finite].abs().double()
        scale = float(magnitude.max())
        zeros = torch.where(finite, torch.zeros_like(out), out)
        if _passes([zeros], [out]):
            return f"reference {name} is ~0 within the check's tolerance (max |value| {scale:.2g}): all zeros would pass the check"
        eps = torch.finfo(_real_dtype(out.dtype)).eps
        if math.isfinite(input_scale) and scale <= eps * input_scale:
            return (
                f"reference {name} is ~0 everywhere (max |value| {scale:.2g} for inputs up to {input_scale:.2g}, "
                f"below their rounding error in {out.dtype}): it is numerical noise, so no candidate can be checked against it"
            )
        if out.numel() < MIN_ELEMENTS_TO_JUDGE:
            continue
        mean = out[finite].mean()
        constant = torch.where(finite, mean.expand_as(out), out)
        if _passes([constant], [out]):
            return f"reference {name} is nearly constant: a constant {complex(mean) if out.is_complex() else float(mean):.4g} would pass the check"
    if len(per_seed_outputs) > 1:
        for i, out in enumerate(first):
            name = _label(first, i)
            others = [other[i] for other in per_seed_outputs[1:] if i < len(other)]
            if not others:
                continue
            inexact = out.is_floating_point() or out.is_complex()
            if out.numel() and (out.numel() > 1 or inexact) and all(torch.equal(out, o) for o in others):
                return f"reference {name} is identical for different random inputs: a cached answer would pass"
            if (
                inexact
                and out.numel() >= MIN_ELEMENTS_TO_JUDGE
                and all(o.shape == out.shape and o.dtype == out.dtype and _passes([out], [o]) for o in others)
            ):
                return (
                    f"reference {name} barely depends on the inputs: the answer for one input passes the check "
                    "against another's, so a cached answer would pass"
                )
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
