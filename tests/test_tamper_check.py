"""The tamper check against CUDA's own lazy start, checked without a GPU.

On a GPU host a CPU measurement begins with CUDA uninitialised. torch.compile queries the GPU while
it compiles, which initialises CUDA and replaces ``torch.cuda.default_generators``; on a lent H200
every correct torch.compile rewrite measured on the CPU was judged tampering because of it
(docs/gpu-validation.md, 2026-11-27). Here ``torch.cuda.is_initialized`` is stood in for, before
the snapshot so that the stand-in is part of the baseline.
"""

import pytest
import torch

from kernelscout.sandbox import integrity


@pytest.fixture
def cuda_state(monkeypatch):
    state = {"initialized": False}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(torch.cuda, "default_generators", ())
    return state


def test_cuda_starting_during_a_cpu_measurement_is_not_tampering(cuda_state, monkeypatch):
    before = integrity.snapshot()
    cuda_state["initialized"] = True  # what torch.cuda._lazy_init does
    monkeypatch.setattr(torch.cuda, "default_generators", (object(),))
    assert integrity.changed_since(before) == []


def test_swapping_the_cuda_generators_without_cuda_starting_is_tampering(cuda_state, monkeypatch):
    before = integrity.snapshot()
    monkeypatch.setattr(torch.cuda, "default_generators", (object(),))
    assert integrity.changed_since(before) == ["torch.cuda.default_generators"]


def test_swapping_the_cuda_generators_after_cuda_started_is_tampering(cuda_state, monkeypatch):
    cuda_state["initialized"] = True  # a CUDA measurement: CUDA runs before the candidate loads
    before = integrity.snapshot()
    monkeypatch.setattr(torch.cuda, "default_generators", (object(),))
    assert integrity.changed_since(before) == ["torch.cuda.default_generators"]


def test_cuda_starting_excuses_only_what_it_replaces(cuda_state, monkeypatch):
    before = integrity.snapshot()
    cuda_state["initialized"] = True
    monkeypatch.setattr(torch.cuda, "default_generators", (object(),))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    assert integrity.changed_since(before) == ["torch.cuda.synchronize"]
