"""A float64 run of the reference as a second opinion, when its own rounding is what a candidate fails by.

The example is a row centred from inputs near 1000 (`x - x.mean(1)`): quiet rows of spread 0.05 beside loud ones
of spread 10. The float32 reference's mean is off by eps x 1000, which is above the quiet rows' tolerance, so an
honest candidate (a float64 mean, or a float32 sum in another order) was judged wrong by the reference's error.
"""

import torch
import pytest

from kernelscout.sandbox.correctness import CheckFailed, compare, judge
from kernelscout.tools.schema import MeasureStatus


def centred_rows() -> torch.Tensor:
    torch.manual_seed(0)
    x = 10 * torch.randn(256, 1024)
    x[::2] = 1000 + 0.05 * torch.randn(128, 1024)
    return x


@pytest.fixture
def rows():
    x = centred_rows()
    reference = x - x.mean(1, keepdim=True)
    exact = x.double() - x.double().mean(1, keepdim=True)
    return x, reference, exact


def test_a_more_accurate_candidate_fails_the_float32_reference_alone(rows):
    x, reference, _ = rows
    float64_mean = (x.double() - x.double().mean(1, keepdim=True)).float()
    with pytest.raises(CheckFailed, match="differs from the reference"):
        compare([float64_mean], [reference])


@pytest.mark.parametrize("how", ["float64 mean", "float32 sum in blocks", "float32 running sum"])
def test_honest_candidates_pass_against_the_float64_run_and_say_why(rows, how):
    x, reference, exact = rows
    mean = {
        "float64 mean": lambda: x.double().mean(1, keepdim=True).float(),
        "float32 sum in blocks": lambda: x.view(256, 32, 32).sum(2).sum(1, keepdim=True) / 1024,
        "float32 running sum": lambda: torch.cumsum(x, 1)[:, -1:] / 1024,
    }[how]()
    result = judge([x - mean], [reference], lambda: [exact])
    assert len(result.notes) == 1
    assert "reference run in float64" in result.notes[0] and "ill-conditioned" in result.notes[0]


@pytest.mark.parametrize("error", [lambda r: r * (1 + 1e-3), lambda r: r + 3e-4])
def test_a_wrong_candidate_still_fails_with_the_first_message(rows, error):
    _, reference, exact = rows
    with pytest.raises(CheckFailed) as failed:
        judge([error(reference)], [reference], lambda: [exact])
    assert "differs from the reference" in str(failed.value)
    assert "float64" not in str(failed.value)


def test_a_float64_run_that_computes_something_else_is_not_trusted(rows):
    x, reference, _ = rows
    candidate = (x.double() - x.double().mean(1, keepdim=True)).float()
    other_function = x.double() - x.double().median(1, keepdim=True).values  # what a dtype branch could compute
    with pytest.raises(CheckFailed, match="differs from the reference"):
        judge([candidate], [reference], lambda: [other_function])


def test_no_float64_run_leaves_the_verdict_as_it_was(rows):
    x, reference, _ = rows
    candidate = (x.double() - x.double().mean(1, keepdim=True)).float()
    with pytest.raises(CheckFailed, match="differs from the reference"):
        judge([candidate], [reference], lambda: None)


def test_nothing_runs_twice_when_the_first_comparison_passes_or_cannot_be_rounding(rows):
    _, reference, exact = rows
    calls = []

    def exact_run():
        calls.append(1)
        return [exact]

    judge([reference.clone()], [reference], exact_run)
    with pytest.raises(CheckFailed, match="shape"):
        judge([reference[:, :10]], [reference], exact_run)
    with pytest.raises(CheckFailed):
        judge([reference.long()], [reference.long() + 5], exact_run)  # integers: no rounding to blame
    assert calls == []


CENTRED_ROWS_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x - x.mean(1, keepdim=True)

def get_inputs():
    x = 10 * torch.randn(256, 1024)
    x[::2] = 1000 + 0.05 * torch.randn(128, 1024)
    return [x]

def get_init_inputs():
    return []
'''

FLOAT64_MEAN = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return (x.double() - x.double().mean(1, keepdim=True)).float()
'''


def test_a_measurement_of_a_more_accurate_kernel_is_correct_with_a_warning(measure_source):
    m = measure_source(FLOAT64_MEAN, problem=CENTRED_ROWS_PROBLEM)
    assert m.status == MeasureStatus.ok, m.message
    assert m.correct
    assert any("reference run in float64" in w for w in m.warnings), m.warnings
    assert any("re-checked" in c for c in m.checks), m.checks  # the timed rounds' outputs, judged the same way


def test_a_measurement_of_a_wrong_kernel_on_the_same_problem_is_incorrect(measure_source):
    m = measure_source(FLOAT64_MEAN.replace("keepdim=True)).float()", "keepdim=True)).float() + 3e-4"),
                       problem=CENTRED_ROWS_PROBLEM)
    assert m.status == MeasureStatus.incorrect
    assert "differs from the reference" in m.message
