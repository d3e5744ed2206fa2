"""Edge cases of the output check (sandbox/correctness.py), called directly on small tensors.

Complex outputs, NaN/Inf, the weak-reference guard on honest problems, and nested outputs.
Each example is the kind of output a real problem produces; no worker processes are needed.
"""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from kernelscout.sandbox.correctness import (
    CheckFailed,
    check_inputs_kept,
    compare,
    finite_input_scale,
    flatten_outputs,
    weak_reference_reason,
)

INF, NAN = math.inf, math.nan


def reference_outputs(model, make_inputs, seeds=(11, 12, 13)):
    """What the worker hands the guard: each seed's flattened outputs and the largest |input|
    (computed as the worker does, so an additive -inf mask makes it infinite)."""
    per_seed, input_scale = [], 0.0
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = make_inputs()
        input_scale = max(input_scale, max(float(x.abs().max()) for x in inputs if x.is_floating_point()))
        with torch.no_grad():
            per_seed.append(list(flatten_outputs(model(*inputs), "reference")))
    return per_seed, input_scale


def assert_rejected(cand, ref, *fragments):
    with pytest.raises(CheckFailed) as err:
        compare(cand, ref)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    return str(err.value)


# -- complex outputs ----------------------------------------------------------------------------


@pytest.fixture
def spectrum():
    torch.manual_seed(0)
    x = torch.randn(16, 128)
    return x, torch.fft.rfft(x, dim=-1)


def test_complex_output_computed_another_way_is_accepted(spectrum):
    x, ref = spectrum
    honest = torch.fft.fft(x, dim=-1)[..., : x.shape[-1] // 2 + 1].contiguous()
    result = compare([honest], [ref])
    assert result.max_rel_diff < 1e-4


def test_complex_conjugate_is_rejected(spectrum):
    _, ref = spectrum
    assert_rejected([ref.conj().resolve_conj()], [ref], "output 0 differs from the reference")
    # a lazy conjugate (conj bit set, no data changed) is compared by value, not by its storage
    assert_rejected([ref.clone().conj()], [ref], "output 0 differs from the reference")


def test_complex_real_part_only_is_rejected(spectrum):
    _, ref = spectrum
    real_only = torch.complex(ref.real, torch.zeros_like(ref.real))
    assert_rejected([real_only], [ref], "differs from the reference")


def test_complex_tolerance_is_that_of_the_component_dtype(spectrum):
    _, ref = spectrum
    # complex64 is float32 components: 1e-4 relative. A 1e-6 relative error passes, 1e-3 does not.
    assert compare([ref * (1 + 1e-6j)], [ref]).max_rel_diff < 1e-4
    assert_rejected([ref * (1 + 1e-3j)], [ref], "tolerance 0.0001 relative")


def test_complex_reference_of_zeros_is_weak(spectrum):
    _, ref = spectrum
    assert weak_reference_reason([[ref]], input_scale=4.0) is None
    assert "zeros would pass" in weak_reference_reason([[ref * 0]], input_scale=4.0)


# -- NaN and Inf --------------------------------------------------------------------------------


@pytest.fixture
def log_and_reciprocal():
    """log(x) is -inf at 0 and NaN below 0; 1/x is +inf at +0 (as in a problem with such inputs)."""
    x = torch.rand(32, 32) + 0.5
    x[::7, ::5] = 0.0
    x[1::11, ::3] = -1.0
    return x, [torch.log(x), 1.0 / x]


def test_matching_nan_and_infinities_are_accepted(log_and_reciprocal):
    x, ref = log_and_reciprocal
    assert compare([x.log(), x.reciprocal()], ref).max_abs_diff < 1e-5


def test_complex_nan_and_inf_must_match_too():
    ref = torch.tensor([1 + 1j, complex(INF, 0.0), complex(NAN, 2.0)])
    assert compare([ref.clone()], [ref]).max_abs_diff == 0.0
    assert_rejected([torch.tensor([1 + 1j, complex(-INF, 0.0), complex(NAN, 2.0)])], [ref], "+inf in the reference but not")


def test_finite_where_the_reference_is_nan_or_inf_is_rejected(log_and_reciprocal):
    _, ref = log_and_reciprocal
    zeroed = [torch.nan_to_num(ref[0], nan=0.0, posinf=0.0, neginf=0.0), torch.nan_to_num(ref[1], posinf=0.0)]
    message = assert_rejected(zeroed, ref, "NaN in the reference but not in the candidate", "-inf in the reference but not")
    assert "first at index (1, 0)" in message  # x[1, 0] = -1: log is NaN there first
    assert_rejected([ref[0], zeroed[1]], ref, "output 1", "+inf in the reference but not in the candidate", "first at index (0, 0)")


@pytest.mark.parametrize(
    "ref_value, cand_value, kind",
    [
        (-INF, INF, "-inf in the reference but not"),
        (INF, -INF, "+inf in the reference but not"),
        (NAN, INF, "NaN in the reference but not"),
        (INF, NAN, "+inf in the reference but not"),
        (NAN, 0.0, "NaN in the reference but not"),
        (-INF, -1e30, "-inf in the reference but not"),
    ],
)
def test_each_kind_of_nan_inf_mismatch_is_named_with_count_and_index(ref_value, cand_value, kind):
    ref = torch.linspace(1.0, 2.0, 12).reshape(3, 4)
    ref[1, 2] = ref[2, 3] = ref_value
    cand = ref.clone()
    cand[1, 2] = cand[2, 3] = cand_value
    assert_rejected([cand], [ref], f"2 elements are {kind}", "first at index (1, 2)")


def test_nan_or_inf_where_the_reference_is_finite_is_rejected():
    ref = torch.tensor([[1.0, -INF], [2.0, 3.0]])
    cand = torch.tensor([[INF, -INF], [NAN, 3.0]])
    assert_rejected([cand], [ref], "2 elements are NaN or Inf in the candidate where the reference is finite", "1 NaN, 1 Inf", "first at index (0, 0)")
    assert_rejected([torch.tensor([1.0, NAN])], [torch.tensor([1.0, 2.0])], "1 element is NaN or Inf in the candidate")


# -- the weak-reference guard on honest problems ------------------------------------------------


def _attention_inputs():
    T = 64
    mask = torch.full((T, T), -INF).triu(1)  # additive causal mask: 0 / -inf
    return [torch.randn(2, T, 32), torch.randn(2, T, 32), torch.randn(2, T, 32), mask]


def _attention(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask, -1) @ v


def _log_inputs():
    x = torch.rand(64, 64) + 0.5
    x[::7, ::5] = 0.0
    x[1::11, ::3] = -1.0
    return [x]


HONEST = {
    "reciprocal (a few huge values)": (lambda x: 1.0 / x, lambda: [torch.randn(256, 256)]),
    "thresholded, 98% exact zeros": (lambda x: torch.relu(x - 2.0) * 3.0, lambda: [torch.randn(256, 256)]),
    "attention with a -inf causal mask": (_attention, _attention_inputs),
    "layer norm of inputs ~2e6": (lambda x: F.layer_norm(x, x.shape[-1:]), lambda: [torch.rand(64, 256) * 2e6]),
    "log and 1/x with NaN and Inf": (lambda x: (x.log(), 1.0 / x), _log_inputs),
    "a scalar loss": (lambda x, y: F.mse_loss(x, y), lambda: [torch.randn(64, 64), torch.randn(64, 64)]),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_problems_are_not_called_weak(name):
    model, make_inputs = HONEST[name]
    per_seed, input_scale = reference_outputs(model, make_inputs)
    assert weak_reference_reason(per_seed, input_scale) is None
    # ...and indeed the cheap answer the guard worries about fails the real check
    if per_seed[0][0].numel() > 1:
        ref = per_seed[0][0]
        with pytest.raises(CheckFailed):
            compare([torch.where(torch.isfinite(ref), torch.zeros_like(ref), ref)], [ref])


def test_the_input_scale_ignores_an_infinite_mask():
    assert finite_input_scale(_attention_inputs()[3:]) == 0.0
    assert finite_input_scale([torch.tensor([1.0, -INF, -3.0, NAN]), torch.tensor([2.0])]) == 3.0
    assert finite_input_scale([torch.tensor([5, 7])]) == 0.0  # integer inputs have no rounding scale


@pytest.mark.parametrize(
    "model, reason",
    [
        (lambda x: (x - x) + 1e-12 * torch.randn_like(x), "~0 everywhere"),  # numerical noise
        (lambda x: x[:, :1] - x[:, :1].mean(dim=1, keepdim=True), "all zeros would pass"),  # exactly 0
        (lambda x: torch.softmax(x, dim=-1).mean(dim=-1), "nearly constant"),
        (lambda x: torch.linspace(-1, 1, 256).reshape(16, 16).sin(), "identical for different random inputs"),
        (lambda x: torch.linspace(-1, 1, 256).reshape(16, 16).sin() + 1e-9 * x[:16, :16], "barely depends on the inputs"),
        (lambda x: torch.full((16, 16), -INF).triu(1) + 0 * x[:16, :16], "all zeros would pass"),  # only a mask
    ],
)
def test_truly_weak_references_are_still_refused(model, reason):
    per_seed, input_scale = reference_outputs(model, lambda: [torch.randn(64, 256)])
    message = weak_reference_reason(per_seed, input_scale)
    assert message is not None and reason in message, message


# -- nested outputs -----------------------------------------------------------------------------


@pytest.fixture
def lstm_output():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    with torch.no_grad():
        return lstm(torch.randn(2, 5, 8))  # (out, (h_n, c_n))


def test_nested_outputs_are_flattened_depth_first(lstm_output):
    out, (h, c) = lstm_output
    flat = flatten_outputs(lstm_output, "reference")
    assert len(flat) == 3
    assert flat[0] is out and flat[1] is h and flat[2] is c
    assert compare(flatten_outputs(lstm_output, "candidate"), flat).max_abs_diff == 0.0
    assert weak_reference_reason([list(flat)], input_scale=4.0) is None


def test_a_different_nesting_is_reported_as_such(lstm_output):
    out, (h, c) = lstm_output
    ref = flatten_outputs(lstm_output, "reference")
    assert_rejected(flatten_outputs((out, h, c), "candidate"), ref, "nested as [tensor, tensor, tensor]", "[tensor, (tensor, tensor)]")
    compare(flatten_outputs([out, [h.clone(), c.clone()]], "candidate"), ref)  # lists and tuples nest alike
    assert_rejected(flatten_outputs((out, (h,)), "candidate"), ref, "candidate returned 2 outputs, the reference 3")


def test_a_bare_tensor_and_a_tuple_of_one_are_not_interchangeable():
    t = torch.randn(4, 4)
    bare = flatten_outputs(t, "reference")
    assert_rejected(flatten_outputs((t.clone(),), "candidate"), bare, "the candidate returns a tuple or list of tensors, the reference a bare tensor")
    assert_rejected(flatten_outputs(t.clone(), "candidate"), flatten_outputs([t], "reference"), "the candidate returns a bare tensor")
    compare(flatten_outputs(t.clone(), "candidate"), bare)
    compare(flatten_outputs([t.clone()], "candidate"), flatten_outputs((t,), "reference"))  # a list for a tuple is fine


def test_a_mismatch_inside_a_nested_output_names_its_position(lstm_output):
    out, (h, c) = lstm_output
    ref = flatten_outputs(lstm_output, "reference")
    assert_rejected(flatten_outputs((out, (h, c + 1)), "candidate"), ref, "output 1[1] differs")


def test_a_non_tensor_inside_a_nested_output_is_refused(lstm_output):
    out, (h, _) = lstm_output
    with pytest.raises(CheckFailed, match=r"candidate output 1\[1\] is a builtins.int, not a plain torch.Tensor"):
        flatten_outputs((out, (h, 3)), "candidate")
    with pytest.raises(CheckFailed, match=r"reference's return value is a builtins.dict, .* \(return a tuple of tensors instead\)"):
        flatten_outputs({"out": out}, "reference")
    # what to return instead, for the two refusals a QA pass met in honest problems
    with pytest.raises(CheckFailed, match=r"output 1 is a torch.nn.parameter.Parameter, .* \(return it detached"):
        flatten_outputs((out, torch.nn.Parameter(h.clone())), "reference")
    with pytest.raises(CheckFailed, match=r"return value is a builtins.NoneType, .* should return them, such as `return param`"):
        flatten_outputs(None, "reference")
    loop = []
    loop.append(loop)
    with pytest.raises(CheckFailed, match="nested more than"):
        flatten_outputs(loop, "candidate")


def test_a_reference_with_only_empty_outputs_is_refused_as_such():
    empty = [[torch.randn(0, 64)], [torch.randn(0, 64)]]
    assert "every reference output is empty (0 elements)" in weak_reference_reason(empty)
    # an empty output beside a real one is checked by shape like any other, not called a cached answer
    mixed = [[torch.randn(0, 64), torch.randn(32, 64)] for _ in range(2)]
    assert weak_reference_reason(mixed) is None


def test_indices_that_differ_only_over_ties_are_named_as_a_possible_cause():
    values = torch.tensor([3.0, 1.0, 3.0, 2.0])
    ref = torch.sort(values, stable=True).indices
    cand = ref.clone()
    cand[2], cand[3] = ref[3], ref[2]  # the two 3.0s the other way round
    assert_rejected([cand], [ref], "differs from the reference in 2 elements", "tied values must come out in the reference's order")


# -- the absolute tolerance follows the output's scale around each element ---------------------------


@pytest.fixture
def outlier_channels():
    """Per-channel scaling where 32 of 512 channels carry massive outliers, as LLM activations do."""
    torch.manual_seed(0)
    scale = torch.ones(512)
    scale[::16] = 1.0e4
    x = torch.randn(256, 512)
    return x, scale, torch.relu(x) * scale


def test_an_error_in_the_ordinary_channels_is_not_hidden_by_the_outliers(outlier_channels):
    x, scale, ref = outlier_channels
    sloppy = ref.clone()
    sloppy[:, scale < 100] += 0.1  # every ordinary value off by 0.1: the whole output's RMS (about 1800) let it pass
    assert_rejected([sloppy], [ref], "differs from the reference in", "absolute there")
    skipped = torch.zeros_like(ref)
    skipped[:, ::16] = ref[:, ::16]  # only the outlier channels computed
    assert_rejected([skipped], [ref], "differs from the reference")


def test_the_same_channels_computed_honestly_in_another_order_pass(outlier_channels):
    x, scale, ref = outlier_channels
    assert compare([torch.relu(x.double() * scale.double()).float()], [ref]).max_abs_diff < 1e-2


@pytest.mark.parametrize("outlier_rows, outlier_columns", [(False, True), (True, False), (True, True)])
def test_a_matmul_with_outlier_rows_or_columns_summed_in_another_order_passes(outlier_rows, outlier_columns):
    """Split-K changes the float32 rounding of every element; near-zero elements of an outlier row carry
    errors on the outlier row's scale, which a tolerance scaled by the quietest slice alone would refuse."""
    torch.manual_seed(1)
    a, b = torch.randn(2048, 1024), torch.randn(1024, 256)
    if outlier_rows:
        a[::512] *= 1.0e4
    if outlier_columns:
        b[:, ::16] *= 1.0e4
    ref = a @ b
    split_k = sum(a[:, k:k + 128] @ b[k:k + 128] for k in range(0, 1024, 128))
    compare([split_k], [ref])
    compare([(a.double() @ b.double()).float()], [ref])
    wrong = ref.clone()
    wrong[1, 1] += float(ref.abs().max()) * 1e-3  # one element off by a thousandth of the largest value
    assert_rejected([wrong], [ref], "differs from the reference in 1 of")


def test_a_row_that_is_zero_throughout_does_not_demand_exact_agreement():
    torch.manual_seed(2)
    x = torch.randn(64, 4096)
    x[3] = 0.7  # a constant row: centred, it is zero in the reference and rounding noise in the candidate
    ref = x - x.mean(-1, keepdim=True)
    noisy = ref.clone()
    noisy[3] += 1e-7
    compare([noisy], [ref])


# -- integer outputs of float math (quantisation) ------------------------------------------------------


@pytest.fixture
def quantised_matmul():
    """An int8 inference kernel's output: a float32 matmul rounded to int8 at scale 1/8."""
    torch.manual_seed(4)
    a, b = torch.randn(128, 512) * 0.1, torch.randn(512, 128)
    return a, b, torch.clamp(torch.round((a @ b) * 8.0), -128, 127).to(torch.int8)


def test_a_quantised_output_one_step_apart_at_a_tie_passes_and_says_so(quantised_matmul):
    a, b, ref = quantised_matmul
    tie = ref.clone()
    tie[5, 7] += 1  # what a split-K sum does in about 1 of 16,384 elements: the float lands on the other side of .5
    result = compare([tie], [ref])
    assert len(result.notes) == 1 and "differs from the reference by 1 in 1 of 16384 elements" in result.notes[0]
    assert compare([ref.clone()], [ref]).notes == []


def test_integer_outputs_further_apart_or_in_more_places_are_wrong(quantised_matmul):
    a, b, ref = quantised_matmul
    two_steps = ref.clone()
    two_steps[5, 7] += 2
    assert_rejected([two_steps], [ref], "differs from the reference in 1 elements")
    many = ref.clone()
    many[:1] += 1  # a whole row one step off: 128 elements, far more than ties
    assert_rejected([many], [ref], "differs from the reference in 128 elements")
    small = torch.arange(100, dtype=torch.int32)  # under 1000 elements: compared exactly
    assert_rejected([small + (small == 3)], [small], "differs from the reference in 1 elements")
    flags = torch.zeros(5000, dtype=torch.bool)
    assert_rejected([flags | (torch.arange(5000) == 9)], [flags], "differs from the reference in 1 elements")


def test_indices_counts_and_integer_inputs_get_no_step_of_slack():
    torch.manual_seed(5)
    scores = torch.randn(2000, 16)
    argmax = scores.argmax(1)  # int64 indices: a neighbouring index is simply wrong
    neighbour = argmax.clone()
    neighbour[7] = (neighbour[7] + 1) % 16
    assert_rejected([neighbour], [argmax], "differs from the reference in 1 elements")
    counts = torch.zeros(4096, dtype=torch.int32)  # rare events counted: mostly 0, not a rounded float
    counts[[3, 900, 2000]] = 1  # as few as the 1-in-1000 allowance, one step each
    assert_rejected([torch.zeros_like(counts)], [counts], "differs from the reference in 3 elements")
    tokens = torch.randint(0, 32000, (4096,))
    bumped = tokens.clone()
    bumped[11] += 1  # a candidate that wrote into its token ids
    with pytest.raises(CheckFailed, match="wrote into input tensor 0"):
        check_inputs_kept([bumped], [tokens.clone()])


def test_a_finite_output_is_judged_as_it_would_be_beside_a_matching_nan():
    """Finite real outputs take a shorter way through the check than outputs with NaN or Inf; the verdict and the
    figures it reports must not depend on which."""
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(64, 96, generator=gen) * torch.logspace(-3, 3, 96)  # columns of very different scale
    for off in (3e-5, 3e-4):  # within float32's tolerance, then ten times outside it
        cand = ref * (1 + off * torch.randn(64, 96, generator=gen))
        with_nan_r, with_nan_c = torch.cat([ref, torch.full((1, 96), math.nan)]), torch.cat([cand, torch.full((1, 96), math.nan)])
        verdicts = []
        for c, r in ((cand, ref), (with_nan_c, with_nan_r)):
            try:
                verdicts.append(("pass", round(compare([c], [r]).max_abs_diff, 9)))
            except CheckFailed as exc:  # "... differs from the reference in N of M elements, first at index I (there ..."
                found = re.search(r"in (\d+) of \d+ elements, first at index (\(.*?\))", str(exc))
                verdicts.append(("fail", found.groups()))
        assert verdicts[0] == verdicts[1]
        assert verdicts[0][0] == ("pass" if off < 1e-4 else "fail")
