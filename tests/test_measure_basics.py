"""`measure` on honest candidates: a correct one is verified and timed in the same session."""

import pytest

from kernelscout.sandbox.problem import InputFileError
from kernelscout.tools.measure import resolve_device
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE


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
