"""Generic rewrites: each renders a candidate that the real sandbox loads, checks and times on CPU."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest

from kernelscout.agent.policies.rewrites import (RewriteError, applicable_rewrites, chain_features, read_lineage,
                                                 render, scan_source)
from kernelscout.agent.policies.tunables import parse_space, with_config
from kernelscout.agent.policies.tuner import ParentInfo, TunerPolicy
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import MeasureStatus
from conftest import SMALL_PROBLEM

# Generous run timeout: on a busy 2-core machine a first forward can be slow. Compiling happens in
# ModelNew.__init__, under the harness's separate build timeout.
CONFIG = HarnessConfig(timeout_s=120.0, compile_timeout_s=600.0, timing_budget_s=0.2, min_rounds=5, warmup_rounds=1)

CONV_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 8, 20, 20)]

def get_init_inputs():
    return [8, 16]
'''

# Never put in eval() by the harness: BatchNorm uses batch statistics here.
CONV_BN_PROBLEM = CONV_PROBLEM.replace(
    "self.conv = nn.Conv2d(cin, cout, 3, padding=1)",
    "self.conv = nn.Conv2d(cin, cout, 3, padding=1)\n        self.bn = nn.BatchNorm2d(cout)",
).replace("torch.relu(self.conv(x))", "torch.relu(self.bn(self.conv(x)))")

# A non-tensor forward argument, as some KernelBench problems have.
SCALED_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x, power):
        return torch.tanh(self.fc(x)) ** power + x

def get_inputs():
    return [torch.randn(64, 32), 3]

def get_init_inputs():
    return [32]
'''


@pytest.fixture
def measure_rewrite(tmp_path: Path, pool):
    """Render rewrite `name` over a problem given as text, then measure it in the sandbox."""

    def _measure(name: str, params: dict, problem: str = CONV_PROBLEM):
        problem_path = tmp_path / "problem.py"
        problem_path.write_text(textwrap.dedent(problem))
        candidate = tmp_path / f"{name}.py"
        candidate.write_text(render(name, problem_path, params, device="cpu"))
        req = MeasureRequest(problem=str(problem_path), candidate=str(candidate), device="cpu",
                             run_dir=str(tmp_path / "run"), harness=CONFIG, again=True)
        return measure(req, pool=pool), candidate

    return _measure


def test_a_rendered_candidate_carries_its_parent_and_problem_and_reads_neither_file(tmp_path: Path, pool):
    # The sandbox's worker may not read the user's home or the folder kscout runs in, where problems and run
    # directories live; rendered candidates loaded both by path and failed there with PermissionError.
    project = tmp_path / "project"
    project.mkdir()
    problem = project / "problem.py"
    problem.write_text(textwrap.dedent(CONV_PROBLEM))
    first = project / "channels_last.py"
    first.write_text(render("channels_last", problem, {}, device="cpu"))
    second = project / "on_top.py"
    second.write_text(render("inference_mode", first, {}, problem_path=problem, device="cpu"))
    elsewhere = tmp_path / "elsewhere"
    project.rename(elsewhere)  # neither the parent nor the problem is where the candidate was told they were
    req = MeasureRequest(problem=str(elsewhere / "problem.py"), candidate=str(elsewhere / "on_top.py"), device="cpu",
                         run_dir=str(tmp_path / "run"), harness=CONFIG, again=True)
    m = measure(req, pool=pool)
    assert m.status == MeasureStatus.ok and m.correct, m.message


def test_static_scan_finds_convolutions_training_modules_and_op_counts():
    conv = scan_source(CONV_PROBLEM)
    assert conv.uses_conv and conv.conv_dims == 2 and conv.has_parameters
    assert not conv.training_dependent and conv.n_ops == 2
    assert scan_source(CONV_BN_PROBLEM).uses_batchnorm
    assert scan_source(CONV_PROBLEM.replace("torch.relu(", "nn.functional.dropout(")).training_dependent
    elementwise = scan_source(SMALL_PROBLEM)
    assert not elementwise.uses_conv and not elementwise.has_parameters and elementwise.n_ops >= 4


def test_gpu_only_rewrites_are_not_proposed_on_cpu(tmp_path: Path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_PROBLEM))
    features = chain_features(problem)
    on_cpu = {r.name: v for r, v in applicable_rewrites("cpu", features)}
    on_gpu = {r.name: v for r, v in applicable_rewrites("cuda", features)}
    assert "cuda_graphs" not in on_cpu and "cuda_graphs" in on_gpu
    assert all(v["MODE"] not in ("reduce-overhead", "max-autotune") for v in on_cpu["torch_compile"])
    assert any(v["MODE"] == "reduce-overhead" for v in on_gpu["torch_compile"])
    # nor can the tuner reach them later by retuning a compiled candidate
    cpu_space = parse_space(render("torch_compile", problem, {}, device="cpu"))
    assert cpu_space.values["MODE"] == ["default", "max-autotune-no-cudagraphs"]
    assert "reduce-overhead" in parse_space(render("torch_compile", problem, {}, device="cuda")).values["MODE"]
    proposals = TunerPolicy().propose(ParentInfo(id=0, path=str(problem), is_reference=True, problem_path=str(problem)), 50, random.Random(0))
    assert proposals and not any(p.origin == "rewrite:cuda_graphs" for p in proposals)
    assert not any(p.params.get("MODE") in ("reduce-overhead", "max-autotune") for p in proposals)


def test_eval_based_rewrites_are_not_offered_when_the_training_flag_matters(tmp_path: Path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_BN_PROBLEM))
    offered = {r.name for r, _ in applicable_rewrites("cpu", chain_features(problem))}
    assert "jit_freeze" not in offered
    assert {"torch_compile", "channels_last"} <= offered


def test_rendered_candidates_record_their_lineage_and_do_not_stack_the_same_rewrite(tmp_path: Path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_PROBLEM))
    first = tmp_path / "cl.py"
    first.write_text(render("channels_last", problem, {"NDIM": 4}))
    second = render("torch_compile", first, {"MODE": "default"}, problem_path=problem)
    assert read_lineage(second) == ["channels_last", "torch_compile"]
    assert f"PARENT_PATH = {str(first.resolve())!r}" in second and "PARENT_CLASS = 'ModelNew'" in second
    features = chain_features(first, problem)
    assert features.uses_conv  # followed the wrapper back to the convolution
    assert "channels_last" not in {r.name for r, _ in applicable_rewrites("cpu", features)}
    with pytest.raises(RewriteError):
        render("no_such_rewrite", problem, {})
    with pytest.raises(ValueError):
        render("torch_compile", problem, {"MODE": "fastest"})
    with pytest.raises(RewriteError, match="not among"):
        render("torch_compile", problem, {"SIMDLEN": 128})


def test_rendered_knobs_follow_the_tunable_convention_so_one_program_has_one_sha(tmp_path: Path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_PROBLEM))
    plain = render("torch_compile", problem, {})
    frozen = render("torch_compile", problem, {"FREEZING": True, "MODE": "max-autotune-no-cudagraphs"})
    assert with_config(plain, {"FREEZING": True, "MODE": "max-autotune-no-cudagraphs"}) == frozen
    assert parse_space(frozen).current["FREEZING"] is True


def test_the_tuner_keeps_tuning_a_measured_rewrite_through_its_knobs(tmp_path: Path):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_PROBLEM))
    root = ParentInfo(id=0, path=str(problem), is_reference=True, problem_path=str(problem))
    from_root = TunerPolicy().propose(root, 50, random.Random(0))
    compiled = tmp_path / "compiled.py"
    compiled.write_text(next(p.source for p in from_root if p.origin == "rewrite:torch_compile"))
    child = ParentInfo(id=1, path=str(compiled), problem_path=str(problem), speedup=1.4, tried_shas={p.sha for p in from_root})
    proposals = TunerPolicy().propose(child, 8, random.Random(0))
    assert proposals and all(p.origin.startswith("tunable:") for p in proposals)  # no compile-of-compile
    assert all(p.features["retunes"] == "torch_compile" and p.features["after.torch_compile"] == 1.0 for p in proposals)
    # FREEZING=True was already proposed from the root with the very same bytes, so it is not offered again
    assert {"FREEZING": True} not in [{k: v for k, v in p.params.items() if v != parse_space(compiled.read_text()).current[k]} for p in proposals]


def test_channels_last_is_correct_on_a_convolution(measure_rewrite):
    for params in ({"NDIM": 4, "CONTIGUOUS_OUTPUT": True}, {"NDIM": 4, "CONTIGUOUS_OUTPUT": False}):
        m, _ = measure_rewrite("channels_last", params)
        assert m.status == MeasureStatus.ok and m.correct and m.timing_valid, m.message


def test_jit_freeze_is_correct_on_a_convolution(measure_rewrite):
    m, _ = measure_rewrite("jit_freeze", {"OPTIMIZE_FOR_INFERENCE": True})
    assert m.status == MeasureStatus.ok and m.correct and m.timing_valid, m.message


def test_jit_freeze_binds_non_tensor_arguments(measure_rewrite):
    m, _ = measure_rewrite("jit_freeze", {"OPTIMIZE_FOR_INFERENCE": False}, problem=SCALED_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    # None among them (an optional argument left out) is an argument like any other, not a tensor's place
    with_none = SCALED_PROBLEM.replace("def forward(self, x, power):", "def forward(self, x, power, bias=None):").replace(
        "return [torch.randn(64, 32), 3]", "return [torch.randn(64, 32), 3, None]")
    m, _ = measure_rewrite("jit_freeze", {"OPTIMIZE_FOR_INFERENCE": False}, problem=with_none)
    assert m.status == MeasureStatus.ok and m.correct, m.message


def test_jit_freeze_refuses_at_run_time_to_put_batchnorm_in_eval_mode(measure_rewrite):
    m, _ = measure_rewrite("jit_freeze", {"OPTIMIZE_FOR_INFERENCE": True}, problem=CONV_BN_PROBLEM)
    assert m.status == MeasureStatus.compile_error and not m.charged
    assert "eval()" in m.message and "BatchNorm2d" in m.message


def test_inference_mode_keeps_training_mode_semantics(measure_rewrite):
    m, _ = measure_rewrite("inference_mode", {}, problem=CONV_BN_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m.message


@pytest.mark.slow
def test_torch_compile_is_correct_and_leaves_the_harness_untouched(measure_rewrite):
    # The first compile builds C++ with gcc (tens of seconds on a busy machine); the inductor cache
    # makes later runs fast. No tampering report and no leftover thread means the timing is valid.
    m, _ = measure_rewrite("torch_compile", {}, problem=SMALL_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert m.timing_valid and not m.warnings, (m.timing_invalid_reason, m.warnings)


@pytest.mark.slow
def test_torch_compile_with_freezing_is_correct_on_a_convolution(measure_rewrite):
    m, _ = measure_rewrite("torch_compile", {"FREEZING": True})
    assert m.status == MeasureStatus.ok and m.correct and m.timing_valid, m.message


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, params", [("cuda_graphs", {"WARMUP": 3}), ("torch_compile", {"MODE": "reduce-overhead"})])
def test_graph_replay_rewrites_are_correct_on_a_gpu(tmp_path: Path, pool, name, params):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(CONV_BN_PROBLEM))
    candidate = tmp_path / "candidate.py"
    candidate.write_text(render(name, problem, params, device="cuda"))
    req = MeasureRequest(problem=str(problem), candidate=str(candidate), device="cuda", run_dir=str(tmp_path / "run"),
                         harness=CONFIG, again=True)
    m = measure(req, pool=pool)
    assert m.status == MeasureStatus.ok and m.correct and m.timing_valid, m.message
