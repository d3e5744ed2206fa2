"""A float64 run of the reference as a second opinion, when its own rounding is what a candidate fails by.

The example is a row centred from inputs near 1000 (`x - x.mean(1)`): quiet rows of spread 0.05 beside loud ones
of spread 10. The float32 reference's mean is off by eps x 1000, which is above the quiet rows' tolerance, so an
honest candidate (a float64 mean, or a float32 sum in another order) was judged wrong by the reference's error.
"""

import copy

import pytest
import torch

from kernelscout.sandbox import correctness
from kernelscout.sandbox.correctness import CheckFailed, compare, judge
from kernelscout.sandbox.exact_reference import _same_model, widened
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


def test_a_second_look_that_runs_out_of_memory_leaves_the_first_verdict(rows, monkeypatch):
    x, reference, exact = rows
    candidate = (x.double() - x.double().mean(1, keepdim=True)).float()
    first_compare = correctness.compare

    def out_of_memory_the_second_time(*args, **kw):
        if kw.get("slack") is not None:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return first_compare(*args, **kw)

    monkeypatch.setattr(correctness, "compare", out_of_memory_the_second_time)
    with pytest.raises(CheckFailed, match="differs from the reference"):
        judge([candidate], [reference], lambda: [exact])


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


# -- the float64 copy is the reference's, whatever the candidate's code did to the process -------------------------


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.register_buffer("steps", torch.arange(4))
        self.eps = 1e-5

    def forward(self, x):
        return self.linear(x) * (1 + self.eps) + self.steps


def test_the_float64_copy_has_the_references_weights_widened_and_its_integers_as_they_were():
    torch.manual_seed(0)
    model = Scaled()
    wide = widened(model)
    assert wide is not None and type(wide) is Scaled
    assert wide.linear.weight.dtype == torch.float64 and torch.equal(wide.linear.weight.float(), model.linear.weight)
    assert wide.steps.dtype == torch.int64 and torch.equal(wide.steps, model.steps)
    x = torch.randn(3, 8)
    assert torch.allclose(wide(x.double()).float(), model(x), atol=1e-6)
    assert model.linear.weight.dtype == torch.float32  # the reference itself is left alone


def test_a_rebound_copy_deepcopy_does_not_make_the_float64_run(monkeypatch):
    """copy.deepcopy is bound at import; nested copies still go through the module's name, and the copy that
    comes out of them is then not the reference's: no float64 run (the first verdict stands), never the impostor."""
    model = Scaled()
    monkeypatch.setattr(copy, "deepcopy", lambda obj, memo=None: torch.nn.Identity())
    wide = widened(model)
    assert wide is None or (type(wide) is Scaled and torch.equal(wide.linear.weight.float(), model.linear.weight))


def test_a_deepcopy_planted_on_the_reference_is_not_used():
    model = Scaled()
    model.__dict__["__deepcopy__"] = lambda memo: _plain_copy(model).double()
    assert widened(model) is None


class Impostor(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape[0], 4, dtype=torch.float64)


def altered_copy(model):
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.linear.weight.mul_(1.001)
    return twin


def overridden_forward(model):
    twin = copy.deepcopy(model)
    twin.forward = lambda x: torch.zeros(x.shape[0], 4, dtype=torch.float64)
    return twin


def hooked(model):
    twin = copy.deepcopy(model)
    twin.linear.register_forward_hook(lambda module, args, out: out * 0)
    return twin


@pytest.mark.parametrize("twin", [lambda m: Impostor(), altered_copy, overridden_forward, hooked],
                         ids=["another module", "other weights", "an instance forward", "a hook"])
def test_a_copy_that_is_not_the_reference_is_not_run(twin):
    """What a tampered copy could hand back instead of the reference's: each is told apart from it."""
    model = Scaled()
    assert _same_model(_plain_copy(model).double(), model)  # the honest copy is
    assert not _same_model(twin(_plain_copy(model)).double(), model)


def _plain_copy(model):
    clone = Scaled()
    clone.load_state_dict(model.state_dict())
    return clone


INSTANCE_DEEPCOPY_CHEAT = '''
import gc
import torch
import torch.nn as nn


class Answer(nn.Module):  # what the "float64 run" would compute: the candidate's own wrong answer
    def forward(self, x):
        return (x.float() - x.float().mean(1, keepdim=True) + 3e-4).double()


class ModelNew(nn.Module):
    def forward(self, x):
        for obj in gc.get_objects():
            if type(obj).__name__ == "Model" and type(obj).__module__.startswith("kscout_problem_"):
                obj.__dict__["__deepcopy__"] = lambda memo: Answer()
        return x - x.mean(1, keepdim=True) + 3e-4
'''


def test_a_candidate_that_makes_its_own_float64_run_is_incorrect(measure_source):
    m = measure_source(INSTANCE_DEEPCOPY_CHEAT, problem=CENTRED_ROWS_PROBLEM)
    assert m.status == MeasureStatus.incorrect
    assert "differs from the reference" in m.message
