"""Triton on a machine without a GPU: kernels run in Triton's CPU interpreter, so their outputs are
checked and their time is never reported. Whether a side ran the interpreter is what it launched,
not what its file imports."""

import pytest

from conftest import TEST_DEVICE

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="about Triton's CPU interpreter")

ADD_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return x + y

def get_inputs():
    return [torch.randn(3001), torch.randn(3001)]

def get_init_inputs():
    return []
'''

ADD_KERNEL = '''
@triton.jit
def add_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def triton_add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out
'''

TRITON_REFERENCE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl
''' + ADD_KERNEL + '''

class Model(nn.Module):
    """An existing Triton kernel to beat."""
    def forward(self, x, y):
        return triton_add(x, y)

def get_inputs():
    return [torch.randn(3001), torch.randn(3001)]

def get_init_inputs():
    return []
'''


def test_a_triton_reference_is_never_timed_against_native_code(measure_source):
    # interpreted Python against torch's add read 124x, "timing valid"
    m = measure_source("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x, y):\n        return x + y\n",
                       problem=TRITON_REFERENCE)
    assert m.status.value == "ok" and m.correct
    assert not m.timing_valid and m.speedup is None
    assert "reference runs Triton kernels under the CPU interpreter" in m.timing_invalid_reason


def test_triton_reached_through_importlib_is_still_seen_running(measure_source):
    candidate = '''
import importlib
import torch, torch.nn as nn
triton = importlib.import_module("triton")
tl = importlib.import_module("triton.language")
''' + ADD_KERNEL + '''
class ModelNew(nn.Module):
    def forward(self, x, y):
        return triton_add(x, y)
'''
    m = measure_source(candidate, problem=ADD_PROBLEM)
    assert m.status.value == "ok" and m.correct
    assert not m.timing_valid and m.speedup is None
    assert "CPU interpreter" in m.timing_invalid_reason


def test_a_candidate_that_imports_triton_but_runs_torch_on_the_cpu_is_timed(measure_source):
    candidate = '''
import torch, torch.nn as nn
import triton
import triton.language as tl
''' + ADD_KERNEL + '''
class ModelNew(nn.Module):
    def forward(self, x, y):
        if x.is_cuda:
            return triton_add(x, y)
        return torch.add(x, y)
'''
    m = measure_source(candidate, problem=ADD_PROBLEM)
    assert m.status.value == "ok" and m.correct
    assert "interpreter" not in (m.timing_invalid_reason or "")
    assert m.candidate_timing is not None and m.candidate_timing.repeats > 0


def test_a_triton_kernel_that_would_not_build_is_a_compile_error_pointing_at_its_line(measure_source):
    candidate = '''
import torch, torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    z = tl.fancy_add(tl.load(x_ptr + offs, mask=m), tl.load(y_ptr + offs, mask=m))
    tl.store(o_ptr + offs, z, mask=m)

class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out
'''
    m = measure_source(candidate, problem=ADD_PROBLEM)
    assert m.status.value == "compile_error"
    assert "Triton kernel does not build" in m.message and "fancy_add" in m.message
    assert "line 10: z = tl.fancy_add" in m.message  # the kernel's line, not the launch's


def test_an_autotuned_kernel_on_the_cpu_says_why_it_cannot_run(measure_source):
    candidate = '''
import torch, torch.nn as nn
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 512}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def add_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        add_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, out, x.numel())
        return out
'''
    m = measure_source(candidate, problem=ADD_PROBLEM)
    assert m.status.value == "runtime_error"
    assert "autotuner times its configurations on a GPU" in m.message
