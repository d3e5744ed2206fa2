"""The reference widened to float64, for a second opinion on a candidate that fails by rounding (`correctness.judge`).

The copy is made in the candidate's own worker, where the candidate's code has run, so nothing the copy goes
through is taken on trust. A red-team candidate (2026-12-05) rebound `copy.deepcopy`, or set `__deepcopy__` on
the reference through `gc`, so that the "float64 run" was its own wrong answer. So the copy and the widening use
functions bound when the harness was imported, before any candidate, and the copy is checked against the live
reference before it runs: the same class for every submodule, the same attributes, hooks and submodules, and every
parameter and buffer equal to the reference's once rounded back to its dtype. A copy that differs in anything is
not used, and the first verdict stands. This does not make the candidate's worker trustworthy (see
sandbox/referee.py); it keeps the float64 run from being an easier way around the check than the reference itself.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Optional

import torch

# bound at import, before any candidate loads: a candidate that rebinds copy.deepcopy or nn.Module.double later
# changes neither (the harness's own modules are watched for rebinding from load to unload)
_deepcopy = copy.deepcopy
_apply = torch.nn.Module._apply
_PLAIN = (int, float, complex, str, bool, bytes, type(None), torch.dtype, torch.device)
_SHARED = (types.FunctionType, types.BuiltinFunctionType, type)  # deepcopy hands these back as they are


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.complex128) if t.is_complex() else t.double() if t.is_floating_point() else t


def in_float64(t: torch.Tensor) -> torch.Tensor:
    """A copy of one tensor for the float64 run: floats widened, everything else as it is."""
    return _widen(t) if t.is_floating_point() or t.is_complex() else t.clone()


def widened(reference: torch.nn.Module) -> Optional[torch.nn.Module]:
    """A float64 copy of the reference, or None when it cannot be made or is not the reference's copy."""
    try:
        wide = _deepcopy(reference)
        if not isinstance(wide, torch.nn.Module):
            return None
        _apply(wide, _widen)
        return wide if _same_model(wide, reference) else None
    except Exception:
        return None


def _same_tensor(wide: Any, narrow: Any) -> bool:
    """The copy's tensor is the reference's, widened or as it was (a plain tensor attribute is not widened)."""
    if narrow is None or wide is None:
        return wide is None and narrow is None
    if type(wide) is not type(narrow) or wide.shape != narrow.shape or wide.device != narrow.device:
        return False
    return wide.dtype in (narrow.dtype, _widen(narrow).dtype) and torch.equal(wide.to(narrow.dtype), narrow)


def _same_value(key: str, wide: Any, narrow: Any) -> bool:
    if type(wide) is not type(narrow):
        return False
    if key in ("_parameters", "_buffers"):
        return wide.keys() == narrow.keys() and all(_same_tensor(wide[k], narrow[k]) for k in narrow)
    if key == "_modules":
        return list(wide) == list(narrow)  # the submodules themselves are compared one by one
    if isinstance(narrow, _PLAIN):
        return wide == narrow
    if isinstance(narrow, _SHARED):
        return wide is narrow
    if isinstance(narrow, torch.Tensor):
        return _same_tensor(wide, narrow)
    if isinstance(narrow, dict) and not any(isinstance(v, (torch.Tensor, torch.nn.Module)) for v in narrow.values()):
        # hook tables and the like: deepcopy keeps functions as they are, so the same entries are the same objects
        return list(wide) == list(narrow) and all(a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)
                                                 for a, b in zip(wide.values(), narrow.values()))
    return True  # an object of the same class: what it holds is the problem's own


def _same_model(wide: torch.nn.Module, narrow: torch.nn.Module) -> bool:
    """The widened copy is the reference: every submodule of the same class, with the same attribute names, the
    same plain values and hooks, and tensors equal to the reference's once rounded back."""
    a = list(wide.named_modules(remove_duplicate=False))
    b = list(narrow.named_modules(remove_duplicate=False))
    if [(n, type(m)) for n, m in a] != [(n, type(m)) for n, m in b]:
        return False
    for (_, w), (_, n) in zip(a, b):
        mine, theirs = vars(w), vars(n)
        if mine.keys() != theirs.keys():
            return False
        if not all(_same_value(k, mine[k], v) for k, v in theirs.items()):
            return False
    return True
