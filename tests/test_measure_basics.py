"""`measure` on honest candidates: a correct one is verified and timed in the same session."""

import pytest

from kernelscout.sandbox.problem import InputFileError
from kernelscout.tools.measure import resolve_device
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, QUICK


def test_correct_candidate_is_verified_and_timed(measure_source):
    m = measure_source(GOOD_CANDIDATE)
    assert m.status == MeasureStatus.ok, m.message
    assert m.correct and m.charged
    assert m.timing_valid, m.timing_invalid_reason
    assert m.runtime_ms > 0 and m.ref_runtime_ms > 0
    assert abs(m.speedup - m.ref_runtime_ms / m.runtime_ms) < 1e-9
    assert m.candidate_timing.repeats >= 5
    assert any("re-checked" in c for c in m.checks)


def test_wrong_answer_is_incorrect_and_charged(measure_source):
    m = measure_source(GOOD_CANDIDATE.replace("0.5 * x", "0.51 * x"))
    assert m.status == MeasureStatus.incorrect
    assert not m.correct and m.charged
    assert "differs from the reference" in m.message


def test_exception_in_forward_is_a_runtime_error_with_the_line(measure_source):
    m = measure_source(GOOD_CANDIDATE.replace("return torch.relu", "raise ValueError('boom')\n        return torch.relu"))
    assert m.status == MeasureStatus.runtime_error
    assert "ValueError: boom" in m.message and "line" in m.message
    assert m.charged


def test_import_failure_is_a_compile_error_and_not_charged(measure_source):
    m = measure_source("import does_not_exist_anywhere\n" + GOOD_CANDIDATE)
    assert m.status == MeasureStatus.compile_error
    assert "does_not_exist_anywhere" in m.message
    assert not m.charged


def test_wrong_shape_is_incorrect(measure_source):
    m = measure_source(GOOD_CANDIDATE.replace("+ 0.5 * x", "+ 0.5 * x\n\n    def _unused(self): pass").replace("return torch.relu(x * self.scale + y) + 0.5 * x", "return (torch.relu(x * self.scale + y) + 0.5 * x)[:, :10]"))
    assert m.status == MeasureStatus.incorrect
    assert "shape" in m.message


def test_device_names_are_checked_before_anything_runs():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cpu", "cuda")
    for name in ("cudax", "cuda:", "cuda:a", "gpu", "CPU"):
        with pytest.raises(InputFileError, match="unknown device"):
            resolve_device(name)
    with pytest.raises(InputFileError, match="CUDA device"):  # none here, or fewer than 99
        resolve_device("cuda:99")


SLOW_REFERENCE = '''
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        time.sleep(0.6)  # a reference that takes far longer than the kernels written to replace it
        return x.cumsum(0)

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return []
'''

FAST_CUMSUM = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=0)
'''


def test_the_timeout_limits_the_candidate_not_the_references_own_calls(measure_source):
    # the reference alone needs about 5 s of calls in the candidate's worker (trials, warm-up and timed rounds)
    m = measure_source(FAST_CUMSUM, problem=SLOW_REFERENCE, config=QUICK.model_copy(update={"timeout_s": 3.0}))
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert m.speedup > 10


def test_a_candidate_over_the_timeout_is_told_what_was_allowed_for_the_reference(measure_source):
    slow = FAST_CUMSUM.replace("return torch", "import time; time.sleep(1.2)\n        return torch")
    m = measure_source(slow, problem=SLOW_REFERENCE, config=QUICK.model_copy(update={"timeout_s": 3.0}))
    assert m.status == MeasureStatus.timeout and m.charged
    assert "took longer than 3 s (--timeout, besides" in m.message and "for the reference's own calls" in m.message


def test_a_reference_that_hangs_is_the_problems_fault_under_the_limit_that_applies(measure_source):
    """A problem whose forward never returns: the measurement says which limit stopped it (loading a problem runs
    under --compile-timeout, not --timeout), blames the problem, and charges nothing."""
    hangs = SLOW_REFERENCE.replace("class Model(nn.Module):", "class Model(nn.Module):\n    def __init__(self):\n"
                                   "        super().__init__()\n        time.sleep(3600)\n")
    m = measure_source(FAST_CUMSUM, problem=hangs, config=QUICK.model_copy(update={"compile_timeout_s": 3.0, "timeout_s": 60.0}))
    assert m.status == MeasureStatus.invalid_problem and not m.charged, m
    assert "loading the problem" in m.message and "took longer than 3 s (--compile-timeout)" in m.message


SLOW_INPUTS_MASK = '''
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, mask):
        return x * mask

def get_inputs():
    time.sleep(0.01)  # slow enough that the timed rounds reuse a few input sets, rescaled
    return [torch.randn(64, 64), (torch.rand(64, 64) > 0.5).float()]

def get_init_inputs():
    return []
'''


def test_a_candidate_that_relies_on_exact_input_values_is_told_the_inputs_were_rescaled(measure_source):
    """`torch.where(mask != 0, x, 0)` equals `x * mask` only for a mask of exact zeros and ones; the timed rounds
    rescale kept inputs when get_inputs() is slow, and the message says so rather than leaving a mystery."""
    exact_only = ("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x, mask):\n"
                  "        return torch.where(mask != 0, x, torch.zeros_like(x))\n")
    m = measure_source(exact_only, problem=SLOW_INPUTS_MASK)
    assert m.status == MeasureStatus.incorrect, m
    assert "wrong on re-check" in m.message and "rescaled" in m.message and "0/1 mask" in m.message


def test_inputs_drawn_with_numpy_are_reproducible_under_the_harness_seed(measure_source):
    """KernelBench-style problems sometimes draw inputs with numpy; the harness seeds numpy and Python's random with
    torch, so the reference can be called twice on the same inputs and candidates get fresh ones each round."""
    problem = ("import numpy as np\nimport torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
               "        return torch.tanh(x) * 3\ndef get_inputs():\n    return [torch.from_numpy(np.random.randn(64, 64).astype(np.float32))]\n"
               "def get_init_inputs():\n    return []\n")
    candidate = ("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
                 "        return 3 * torch.tanh(x)\n")
    m = measure_source(candidate, problem=problem)
    assert m.status == MeasureStatus.ok and m.correct, m.message


def test_what_a_failing_candidate_printed_comes_with_its_error(measure_source):
    m = measure_source(GOOD_CANDIDATE.replace("return torch.relu", "print('shapes', x.shape, y.shape)\n        raise ValueError('boom')\n        return torch.relu"))
    assert m.status == MeasureStatus.runtime_error
    assert "ValueError: boom" in m.message
    assert "printed before the error" in m.message and "shapes torch.Size([256, 512]) torch.Size([256, 512])" in m.message


QUANTISED_PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A linear layer whose output is quantised to int8, as an int8 inference kernel emits it."""
    def forward(self, a, b):
        return torch.clamp(torch.round((a @ b) * 8.0), -128, 127).to(torch.int8)


def get_inputs():
    return [torch.randn(128, 512) * 0.1, torch.randn(512, 128)]


def get_init_inputs():
    return []
'''

ONE_STEP_APART = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The reference's math with one element landing one step away, as a tie rounded the other way does."""
    def forward(self, a, b):
        out = torch.clamp(torch.round((a @ b) * 8.0), -128, 127).to(torch.int8)
        out[5, 7] += 1 if int(out[5, 7]) < 127 else -1
        return out
'''


def test_a_quantised_output_one_step_apart_at_a_tie_is_correct_with_a_warning(measure_source):
    m = measure_source(ONE_STEP_APART, problem=QUANTISED_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert any("differs from the reference by 1 in 1 of 16384 elements" in w for w in m.warnings), m.warnings
