"""The tunable-space convention: read statically, walked safely, written back byte for byte."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest

from kernelscout.agent.policies import tunables
from kernelscout.agent.policies.tunables import TunableError, evaluate_restriction, neighbours, parse_space, with_config
from kernelscout.agent.policies.tuner import ParentInfo, TunerPolicy, source_sha
from kernelscout.tools.schema import MeasureStatus
from conftest import SMALL_PROBLEM

TRITON_STYLE = textwrap.dedent('''
    """A Triton-style candidate: launch parameters are module-level knobs."""
    import torch
    import torch.nn as nn

    TUNABLE = {"BLOCK_SIZE": [64, 128, 256, 512, 1024], "num_warps": [2, 4, 8]}
    TUNABLE_RESTRICTIONS = ["BLOCK_SIZE * num_warps <= 2048"]
    BLOCK_SIZE = 128  # elements per program
    num_warps = 4


    class ModelNew(nn.Module):
        def forward(self, x):
            return x * 2  # the kernel would launch with BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps
''')

# A plain-PyTorch candidate for SMALL_PROBLEM whose knob (rows per chunk) changes only speed.
CHUNKED = textwrap.dedent('''
    import torch
    import torch.nn as nn

    TUNABLE = {"CHUNK_ROWS": [16, 32, 64, 128, 256]}
    CHUNK_ROWS = 64


    class ModelNew(nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def forward(self, x, y):
            out = torch.empty_like(x)
            for i in range(0, x.shape[0], CHUNK_ROWS):
                xs, ys = x[i:i + CHUNK_ROWS], y[i:i + CHUNK_ROWS]
                torch.add(torch.relu(xs * self.scale + ys), xs, alpha=0.5, out=out[i:i + CHUNK_ROWS])
            return out
''')


def test_the_space_is_read_without_running_the_module():
    source = TRITON_STYLE + "\nraise SystemExit('importing this would stop the test run')\n"
    space = parse_space(source)
    assert space.names == ["BLOCK_SIZE", "num_warps"]
    assert space.values["BLOCK_SIZE"] == [64, 128, 256, 512, 1024]
    assert space.current == {"BLOCK_SIZE": 128, "num_warps": 4}
    assert space.restrictions == ["BLOCK_SIZE * num_warps <= 2048"]
    assert space.size == 15


def test_every_enumerated_configuration_satisfies_the_restrictions():
    space = parse_space(TRITON_STYLE)
    configs = list(tunables.iter_configs(space))
    assert {"BLOCK_SIZE": 1024, "num_warps": 2} in configs
    assert {"BLOCK_SIZE": 1024, "num_warps": 4} not in configs  # 4096 > 2048
    assert {"BLOCK_SIZE": 512, "num_warps": 8} not in configs
    assert len(configs) == 12
    assert all(c["BLOCK_SIZE"] * c["num_warps"] <= 2048 for c in configs)


def test_with_config_changes_only_the_assigned_values():
    new = with_config(TRITON_STYLE, {"BLOCK_SIZE": 256, "num_warps": 8})
    assert parse_space(new).current == {"BLOCK_SIZE": 256, "num_warps": 8}
    diff = [(a, b) for a, b in zip(TRITON_STYLE.splitlines(), new.splitlines()) if a != b]
    assert diff == [("BLOCK_SIZE = 128  # elements per program", "BLOCK_SIZE = 256  # elements per program"),
                    ("num_warps = 4", "num_warps = 8")]
    assert with_config(TRITON_STYLE, {"BLOCK_SIZE": 128}) == TRITON_STYLE  # same config, same bytes, same sha


def test_with_config_keeps_multibyte_text_and_annotated_assignments_intact():
    source = ('NOTE = "größe"; BLOCK = 32  # ünïcode before the knob\n'
              'TUNABLE = {"BLOCK": [32, 64], "WARPS": [2, 4]}\n'
              'WARPS: int = 2\n')
    new = with_config(source, {"BLOCK": 64, "WARPS": 4})
    assert new == source.replace("BLOCK = 32", "BLOCK = 64").replace("WARPS: int = 2", "WARPS: int = 4")


@pytest.mark.parametrize("config, problem", [
    ({"BLOCK_SIZE": 100}, "not one of its declared values"),
    ({"BLOCK_SIZE": 1024, "num_warps": 8}, "breaks restriction"),
    ({"GRID": 3}, "unknown knob"),
    ({"num_warps": 4.0}, "not one of its declared values"),
])
def test_with_config_refuses_configurations_outside_the_space(config, problem):
    with pytest.raises(TunableError, match=problem):
        with_config(TRITON_STYLE, config)


@pytest.mark.parametrize("source, problem", [
    ("X = 1\n", "assigns no TUNABLE"),
    ('TUNABLE = {"X": [1, 2]}\n', "never assigned"),
    ('TUNABLE = {"X": [1, 2]}\nX = 3\n', "not one of its declared values"),
    ('TUNABLE = {"X": [1, 2]}\nX = 1\nX = 2\n', "assigned 2 times"),
    ('TUNABLE = {"X": list(range(4))}\nX = 1\n', "must be a literal"),
    ('TUNABLE = {"X": [1, 1]}\nX = 1\n', "twice"),
    ('TUNABLE = {"DYNAMC": [False, True]}\nDYNAMIC = False\n', "is it DYNAMIC, which is assigned"),
    ('TUNABLE = {"X": [1, 2]}\nTUNABLE_RESTRICTIONS = ["X > 2"]\nX = 1\n', "breaks its own restriction 'X > 2'"),
])
def test_a_broken_declaration_says_what_to_fix(source, problem):
    with pytest.raises(TunableError, match=problem):
        parse_space(source)


@pytest.mark.parametrize("restriction", [
    "__import__('os').system('touch /tmp/kscout-pwned')",
    "BLOCK_SIZE.__class__.__bases__",
    "[c for c in ().__class__.__base__.__subclasses__()]",
    "(lambda: 1)()",
    "open('/etc/passwd')",
    "GLOBAL_NAME > 1",
])
def test_restrictions_that_are_not_plain_arithmetic_are_refused_not_run(restriction):
    source = TRITON_STYLE.replace('["BLOCK_SIZE * num_warps <= 2048"]', repr([restriction]))
    with pytest.raises(TunableError):
        parse_space(source)
    with pytest.raises(TunableError):
        evaluate_restriction(restriction, {"BLOCK_SIZE": 128, "num_warps": 4})
    assert not Path("/tmp/kscout-pwned").exists()


def test_a_restriction_cannot_make_the_evaluator_compute_forever():
    with pytest.raises(TunableError, match="exponent"):
        evaluate_restriction("2 ** 2 ** 2 ** 2 ** 2 > BLOCK_SIZE", {"BLOCK_SIZE": 128})


def test_restrictions_support_arithmetic_comparisons_and_min_max():
    config = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "layout": "nhwc"}
    assert evaluate_restriction("BLOCK_M % BLOCK_N == 0 and 16 <= min(BLOCK_M, BLOCK_N)", config)
    assert evaluate_restriction("layout in ('nhwc', 'nchw') and not num_warps > 8", config)
    assert not evaluate_restriction("BLOCK_M * BLOCK_N * num_warps > 2 ** 14", config)
    assert not evaluate_restriction("BLOCK_M / (num_warps - 4) > 1", config)  # division by zero: not satisfied
    with pytest.raises(TunableError, match="only numbers"):
        evaluate_restriction("layout * 1000000000", config)


def test_neighbours_move_one_knob_one_step_and_stay_valid():
    space = parse_space(TRITON_STYLE)
    assert neighbours(space, space.current) == [
        {"BLOCK_SIZE": 64, "num_warps": 4},
        {"BLOCK_SIZE": 256, "num_warps": 4},
        {"BLOCK_SIZE": 128, "num_warps": 2},
        {"BLOCK_SIZE": 128, "num_warps": 8},
    ]
    # at the edge of the restriction: 1024 x 4 would break it, so only the smaller block remains
    assert neighbours(space, {"BLOCK_SIZE": 1024, "num_warps": 2}) == [{"BLOCK_SIZE": 512, "num_warps": 2}]


def test_random_configurations_are_valid_distinct_and_repeatable():
    space = parse_space(TRITON_STYLE)
    first = tunables.random_configs(space, random.Random(7), 5)
    assert first == tunables.random_configs(space, random.Random(7), 5)
    assert len({space.key(c) for c in first}) == 5
    assert all(space.is_valid(c) for c in first)


def _tunable_parent(tmp_path: Path, source: str = TRITON_STYLE, tried: set[str] = frozenset()) -> ParentInfo:
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(SMALL_PROBLEM))
    parent = tmp_path / "parent.py"
    parent.write_text(source)
    return ParentInfo(id=3, path=str(parent), problem_path=str(problem), device="cpu", tried_shas=set(tried))


def test_the_tuner_proposes_unvisited_neighbours_first_and_stays_inside_the_restrictions(tmp_path: Path):
    parent = _tunable_parent(tmp_path)
    proposals = TunerPolicy().propose(parent, 12, random.Random(0))
    tuned = [p for p in proposals if p.origin.startswith("tunable:")]
    assert [p.origin for p in tuned[:4]] == ["tunable:neighbour"] * 4
    assert any(p.origin == "tunable:random" for p in tuned)
    for p in tuned:
        space = parse_space(p.source)
        assert space.current == p.params
        assert space.is_valid(p.params)
        assert p.params["BLOCK_SIZE"] * p.params["num_warps"] <= 2048
        assert p.parent_id == 3 and p.features["is.tunable"] == 1.0
    assert any(p.origin.startswith("rewrite:") for p in proposals)  # generic rewrites are mixed in


def test_the_tuner_never_proposes_a_source_already_tried(tmp_path: Path):
    parent = _tunable_parent(tmp_path)
    first = TunerPolicy().propose(parent, 6, random.Random(0))
    tried = {p.sha for p in first}
    again = TunerPolicy().propose(_tunable_parent(tmp_path, tried=tried), 50, random.Random(0))
    assert again and not tried & {p.sha for p in again}
    assert len({p.sha for p in again}) == len(again)
    assert all(p.sha == source_sha(p.source) for p in again)


def test_the_tuner_is_deterministic_given_the_seed(tmp_path: Path):
    parent = _tunable_parent(tmp_path)
    a = [p.sha for p in TunerPolicy().propose(parent, 10, random.Random(5))]
    b = [p.sha for p in TunerPolicy().propose(parent, 10, random.Random(5))]
    assert a == b


def test_a_broken_space_falls_back_to_rewrites_and_says_why(tmp_path: Path):
    policy = TunerPolicy()
    parent = _tunable_parent(tmp_path, TRITON_STYLE.replace("BLOCK_SIZE = 128", "BLOCK_SIZE = 100"))
    proposals = policy.propose(parent, 4, random.Random(0))
    assert proposals and all(p.origin.startswith("rewrite:") for p in proposals)
    assert "not one of its declared values" in policy.notes[0]


def test_a_proposed_configuration_is_a_measurable_correct_candidate(tmp_path: Path, measure_source):
    parent = _tunable_parent(tmp_path, CHUNKED)
    proposal = next(p for p in TunerPolicy().propose(parent, 4, random.Random(0)) if p.origin.startswith("tunable:"))
    assert proposal.params["CHUNK_ROWS"] in (32, 128)
    m = measure_source(proposal.source)
    assert m.status == MeasureStatus.ok and m.correct, m.message
