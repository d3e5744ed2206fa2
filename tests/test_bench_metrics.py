"""The search benchmark's metric on a tiny handmade space whose optimum and random-search value are known exactly."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from kernelscout.agent.bench import (
    BenchRequest,
    best_after,
    frac_of_opt,
    random_search_expectation,
    read_run,
    restrictions_for,
    run_bench,
    unique_in_order,
    _space,
)

# x in 1..4, y in 1..2, restricted to x*y <= 6, so (4, 2) is outside; (3, 2) failed to compile.
TIMES = {(1, 1): 8.0, (2, 1): 4.0, (3, 1): 2.0, (4, 1): 1.0, (1, 2): 6.0, (2, 2): 3.0, (3, 2): "CompilationFailedConfig"}
OPTIMUM = 1.0


def write_tiny_space(folder: Path) -> Path:
    cache = {}
    for (x, y), t in TIMES.items():
        times = [t] * 3 if isinstance(t, float) else t
        cache[f"{x},{y}"] = {"x": x, "y": y, "time": t, "times": times, "compile_time": 1.0, "verification_time": 0, "benchmark_time": 1.0}
    path = folder / "tiny_GPU.json"
    path.write_text(json.dumps({"device_name": "Tiny GPU", "kernel_name": "tiny_kernel", "problem_size": [64],
                                "tune_params_keys": ["x", "y"], "tune_params": {"x": [1, 2, 3, 4], "y": [1, 2]},
                                "objective": "time", "cache": cache}))
    (folder / "README.md").write_text("# spaces\n\n## Valid space of each kernel\n- other_kernel: `a > 1`\n- tiny_kernel: `x*y <= 6`\n")
    return path


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_space(tmp_path)


def test_fraction_of_optimum_reads_the_best_within_the_budget() -> None:
    trace = [8.0, math.nan, 2.0, 1.0]
    assert best_after(trace, 1) == 8.0
    assert best_after(trace, 2) == 8.0  # a failure finds nothing
    assert best_after(trace, 3) == 2.0
    assert frac_of_opt(OPTIMUM, best_after(trace, 3)) == 0.5
    assert frac_of_opt(OPTIMUM, best_after(trace, 10)) == 1.0
    assert frac_of_opt(OPTIMUM, best_after([math.nan], 1)) == 0.0
    assert unique_in_order(["a", "b", "a", "c", "b"]) == ["a", "b", "c"]


def test_random_search_expectation_is_exact_on_the_tiny_space(tiny: Path) -> None:
    space = _space(str(tiny))
    assert len(space) == 7 and float(min(t for t in space.times if t == t)) == OPTIMUM
    # two draws without replacement from 7 configurations: enumerate all 21 pairs by hand
    values = [t if isinstance(t, float) else math.inf for t in TIMES.values()]
    pairs = list(itertools.combinations(values, 2))
    brute = sum(frac_of_opt(OPTIMUM, min(p)) for p in pairs) / len(pairs)
    assert random_search_expectation(space.times, 2) == pytest.approx(brute)
    assert random_search_expectation(space.times, 1) == pytest.approx((1 / 8 + 1 / 4 + 1 / 2 + 1 + 1 / 6 + 1 / 3 + 0) / 7)
    assert random_search_expectation(space.times, 7) == pytest.approx(1.0)


def test_restrictions_come_from_the_readme_next_to_the_cache(tiny: Path) -> None:
    assert restrictions_for(str(tiny)) == ["x*y <= 6"]


def test_kernel_tuner_random_sample_counts_unique_configurations_and_matches_expectation(tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")
    from kernelscout.agent.bench import kernel_tuner_trace

    fracs = []
    for seed in range(30):
        trace = kernel_tuner_trace(str(tiny), "random_sample", seed, 2, str(tmp_path))
        assert len(trace.times) == 2  # the budget is unique configurations, failures included
        fracs.append(frac_of_opt(OPTIMUM, best_after(trace.times, 2)))
    expected = random_search_expectation(_space(str(tiny)).times, 2)
    assert abs(sum(fracs) / len(fracs) - expected) < 0.2  # 30 draws of a [0, 1] variable: well within 4 standard errors
    full = kernel_tuner_trace(str(tiny), "random_sample", 0, 7, str(tmp_path))
    assert sorted(full.times, key=lambda t: (t != t, t))[0] == OPTIMUM  # sampling the whole space finds the optimum


def test_bench_runs_both_tools_on_the_same_space_and_prints_the_documented_json(tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")
    result = run_bench(BenchRequest(spaces=[str(tiny)], budgets=[2, 4], seeds=1, jobs=1, out=str(tmp_path / "runs")))
    data = result.as_json()
    methods = data["tiny_GPU"]
    assert {"kernelscout", "kernelscout --surrogate none", "kernel_tuner random_sample", "kernel_tuner genetic_algorithm",
            "kernel_tuner bayes_opt", "kernel_tuner dual_annealing"} <= set(methods)
    for method, cells in methods.items():
        assert set(cells) == {"2", "4"}
        for cell in cells.values():
            assert set(cell) == {"frac_of_opt", "considered_per_measurement"}
            assert 0.0 <= cell["frac_of_opt"] <= 1.0
        assert cells["4"]["frac_of_opt"] >= cells["2"]["frac_of_opt"]  # nested budgets: more never finds less
    assert methods["kernelscout"]["4"]["considered_per_measurement"] >= 1.0
    assert methods["kernel_tuner bayes_opt"]["4"]["considered_per_measurement"] is None  # it reports no forecasts
    # the kernelscout run is a normal run directory: its measurements are the trace
    run = tmp_path / "runs" / "runs" / "tiny_GPU-learned-seed0"
    times, considered = read_run(_space(str(tiny)), str(run))
    assert len(times) == 4 and all(c is None or c >= i + 1 for i, c in enumerate(considered))
    json.dumps(data)


def test_a_run_does_not_depend_on_its_budget(tiny: Path, tmp_path: Path) -> None:
    """What makes reading budget 20 off a budget-100 run fair: the first N measurements are the same."""
    from kernelscout.agent.runner import start_search

    space = _space(str(tiny))
    start_search(None, str(tiny), budget=3, policy="tuner", surrogate="none", run_dir=str(tmp_path / "b3"), seed=4, quiet=True)
    start_search(None, str(tiny), budget=6, policy="tuner", surrogate="none", run_dir=str(tmp_path / "b6"), seed=4, quiet=True)
    short, _ = read_run(space, str(tmp_path / "b3"))
    long, _ = read_run(space, str(tmp_path / "b6"))
    assert len(short) == 3 and len(long) == 6
    assert [str(t) for t in short] == [str(t) for t in long[:3]]  # same configurations, failures (nan) included
