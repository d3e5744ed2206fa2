"""A recorded space tuned for a throughput is searched for that throughput, as Kernel Tuner tuned it.

hotspot's cache in the benchmark hub is the case in point: its objective is GFLOP/s, and its temporal tiling factor
computes that many time steps in one call, so the call that takes least time is the one that does least work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernelscout.agent.runner import start_search
from kernelscout.agent.run_view import view_run
from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace


def _block_time(b: int) -> float:
    return 1.0 + abs(np.log2(b / 64)) * 0.3


def _steps_space(path: Path, objective: str = "GFLOP/s", steps=(1, 2, 4, 8), blocks=(32, 64, 128), gflops=None,
                 block_time=_block_time) -> Path:
    """A call with `steps` time steps takes longer, but less than `steps` times longer: more steps, more GFLOP/s."""
    cache = {}
    for s in steps:
        for b in blocks:
            t = block_time(b) * s ** 0.75
            record = {"steps": s, "block": b, "time": t, "times": [t]}
            value = (gflops or (lambda s, t: 15.0 * s / t))(s, t)
            if value is not None and objective != "time":
                record[objective] = value
            cache[f"{s},{b}"] = record
    path.write_text(json.dumps({"device_name": "GPU", "kernel_name": "calculate_temp", "tune_params_keys": ["steps", "block"],
                                "tune_params": {"steps": list(steps), "block": list(blocks)}, "objective": objective,
                                "cache": cache}))
    return path


def test_where_the_work_per_call_differs_the_search_finds_the_highest_throughput_not_the_shortest_call(tmp_path: Path) -> None:
    path = _steps_space(tmp_path / "hotspot_like.json")
    space = ReplaySpace.load(path)

    assert space.config(space.best_index) == {"steps": 8, "block": 64}  # the highest GFLOP/s; the shortest call has 1 step
    assert space.notes == ["hotspot_like.json: its objective is 'GFLOP/s', and the work per call differs between "
                           "configurations (up to 8.00x): kernelscout searches for the highest GFLOP/s, replaying each "
                           "configuration's time for the same work (the median configuration's), so its speedups are "
                           "ratios of GFLOP/s"]
    # a replayed speedup is the ratio of the two configurations' GFLOP/s
    measured = ReplayDevice(space).measure({"steps": 8, "block": 64}, np.random.default_rng(0), reference={"steps": 1, "block": 64})
    assert measured.speedup == pytest.approx(8 ** 0.25)

    result = start_search(None, str(path), budget=12, run_dir=str(tmp_path / "run"), quiet=True, report=False, seed=1)
    assert view_run(tmp_path / "run").best.params == {"steps": 8, "block": 64}
    assert result.notes == space.notes


def test_a_throughput_that_ranks_as_time_does_replays_the_recorded_times_exactly(tmp_path: Path) -> None:
    """A convolution's GFLOP/s is the same work over the time: following it changes nothing, so nothing is said."""
    same_work = _steps_space(tmp_path / "conv.json", steps=(1,), blocks=(16, 32, 64, 128, 256))
    as_time = _steps_space(tmp_path / "conv_time.json", objective="time", steps=(1,), blocks=(16, 32, 64, 128, 256))

    space = ReplaySpace.load(same_work)
    assert space.follows_objective and space.notes == []
    assert space.content_sha == ReplaySpace.load(as_time).content_sha  # the same replay, noise and all


def test_a_throughput_that_some_timed_records_lack_is_not_followed_and_the_note_says_how_many(tmp_path: Path) -> None:
    path = _steps_space(tmp_path / "partial.json", gflops=lambda s, t: None if s == 8 else 15.0 * s / t)
    space = ReplaySpace.load(path)

    assert not space.follows_objective
    assert space.config(space.best_index) == {"steps": 1, "block": 64}  # the recorded time, as the note says
    assert space.notes == ["partial.json: its objective is 'GFLOP/s', which 3 timed record(s) do not give; "
                           "kernelscout minimises the recorded time instead"]


def test_an_objective_that_is_not_a_speed_is_named_and_the_time_is_minimised(tmp_path: Path) -> None:
    space = ReplaySpace.load(_steps_space(tmp_path / "energy.json", objective="GFLOPS/W"))
    assert space.config(space.best_index) == {"steps": 1, "block": 64}
    assert space.notes == ["energy.json: its objective is 'GFLOPS/W'; kernelscout minimises the recorded time instead"]


def test_kernel_tuners_t4_output_of_a_throughput_tuning_is_followed_too(tmp_path: Path) -> None:
    file_utils = pytest.importorskip("kernel_tuner.file_utils")
    doc = json.loads(_steps_space(tmp_path / "cache.json").read_text())
    results = [{"compile_time": 0, "benchmark_time": 0, "framework_time": 0, "strategy_time": 0, "verification_time": 0, **r}
               for r in doc["cache"].values()]
    t4 = tmp_path / "hotspot_t4.json"
    t4.write_text(json.dumps(file_utils.get_t4_results(results, doc["tune_params"], objective="GFLOP/s")))

    from_t4, from_cache = ReplaySpace.load(t4), ReplaySpace.load(tmp_path / "cache.json")
    assert from_t4.work_spread == pytest.approx(8.0) and from_t4.config(from_t4.best_index) == {"steps": 8, "block": 64}
    assert from_t4.content_sha == from_cache.content_sha


def test_kernel_tuner_in_the_benchmark_is_given_the_objective_the_search_follows(tmp_path: Path, monkeypatch) -> None:
    """Told to minimise time on a GFLOP/s space, Kernel Tuner's dual annealing walks towards the calls that do least
    work, and the comparison would be unfair to it."""
    pytest.importorskip("kernel_tuner")
    from kernelscout.agent import bench

    path = str(_steps_space(tmp_path / "big.json", steps=tuple(range(1, 21)), blocks=tuple(range(1, 21)),
                            block_time=lambda b: 1 + 0.3 * (b - 10) ** 2))
    optimum = float(np.nanmin(bench._space(path).times))

    def mean_frac() -> float:
        traces = [bench.kernel_tuner_trace(path, "dual_annealing", seed, 30, str(tmp_path)) for seed in range(3)]
        return float(np.mean([bench.frac_of_opt(optimum, min(t.times)) for t in traces]))

    followed = mean_frac()
    monkeypatch.setattr(bench, "THROUGHPUTS", frozenset())  # as before: Kernel Tuner left at its default, time
    assert followed > 0.95 and mean_frac() < followed - 0.05  # 1.0 against 0.84 when written


@pytest.mark.parametrize("header, followed, note", [
    (["time"], "time", None),
    (["GFLOP/s"], "GFLOP/s", "its objective is 'GFLOP/s', and the work per call differs"),
    (["time", "energy"], "time, energy", "its objectives are time, energy; kernelscout minimises the recorded time alone"),
])
def test_the_objective_as_kernel_tuner_1_5_writes_it_a_list_is_read_as_the_objective_it_names(tmp_path: Path, header, followed,
                                                                                               note) -> None:
    """Since its multi-objective tuning, Kernel Tuner writes ``"objective": ["time"]`` into a new cache's header."""
    path = _steps_space(tmp_path / "kt15.json")
    doc = json.loads(path.read_text())
    doc["objective"] = header
    path.write_text(json.dumps(doc))

    space = ReplaySpace.load(path)
    assert space.objective == followed
    assert (space.notes == []) if note is None else (note in space.notes[0])


def test_objective_time_searches_a_throughput_tuned_space_for_the_shortest_call_and_resume_keeps_it(tmp_path: Path) -> None:
    """`--objective time`: what a user who wants the fastest call (not the most work per second) asks for."""
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app
    from kernelscout.agent.runner import OptimizeError, resume_search

    path = _steps_space(tmp_path / "hotspot_like.json")
    by_time = ReplaySpace.load(path, "time")
    assert by_time.config(by_time.best_index) == {"steps": 1, "block": 64}  # the shortest call does one step
    assert by_time.notes == ["hotspot_like.json: its objective is 'GFLOP/s'; kernelscout minimises the recorded time per call, "
                             "as --objective time asks"]
    assert not by_time.follows_objective and by_time.content_sha != ReplaySpace.load(path).content_sha
    with pytest.raises(ValueError, match="give one of file, time"):
        ReplaySpace.load(path, "GFLOP/s")

    out = CliRunner().invoke(app, ["optimize", "--space", str(path), "--objective", "time", "--budget", "12", "--seed", "1",
                                   "--run-dir", str(tmp_path / "run"), "--json"])
    assert out.exit_code == 0, out.output
    assert view_run(tmp_path / "run").best.params == {"steps": 1, "block": 64}
    # the run remembers what it was asked: resuming searches the same times, and asking otherwise names the flag
    resume_search(str(tmp_path / "run"), quiet=True)  # loaded otherwise, its content would differ, and resume refuse
    assert view_run(tmp_path / "run").best.params == {"steps": 1, "block": 64}
    with pytest.raises(OptimizeError, match="--objective"):
        start_search(None, str(path), budget=12, run_dir=str(tmp_path / "run"), quiet=True, report=False, seed=1)
    bad = CliRunner().invoke(app, ["optimize", "--space", str(path), "--objective", "speed", "--budget", "3"])
    assert bad.exit_code == 2 and "is not one of 'file', 'time'" in " ".join(bad.output.split())


def test_bench_search_with_objective_time_scores_the_shortest_call_for_both_tools(tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")
    from kernelscout.agent.bench import RANDOM_EXACT, BenchRequest, run_bench

    path = _steps_space(tmp_path / "hotspot_like.json")
    common = dict(spaces=[str(path)], budgets=[1, 12], seeds=1, jobs=1, no_predict=False)
    followed = run_bench(BenchRequest(**common))
    timed = run_bench(BenchRequest(**common, objective="time"))
    # the fraction is of the objective each run was asked for: one random configuration's expected share of the optimum
    for result, objective in ((followed, "file"), (timed, "time")):
        times = ReplaySpace.load(path, objective).times
        cells = result.spaces["hotspot_like"]
        assert cells[RANDOM_EXACT]["1"].frac_of_opt == pytest.approx(np.mean(times.min() / times), abs=1e-4)
        # and a budget of every configuration finds that optimum, with either tool
        assert cells["kernelscout"]["12"].frac_of_opt == 1.0 and cells["kernel_tuner random_sample"]["12"].frac_of_opt == 1.0
    assert followed.spaces["hotspot_like"][RANDOM_EXACT]["1"].frac_of_opt != timed.spaces["hotspot_like"][RANDOM_EXACT]["1"].frac_of_opt
    assert any("as --objective time asks" in n for n in timed.notes)
    assert not any("as --objective time asks" in n for n in followed.notes)


def test_kscout_run_passes_objective_time_to_each_recorded_space(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    (tmp_path / "spaces").mkdir()
    _steps_space(tmp_path / "spaces" / "hotspot_like.json")
    out = CliRunner().invoke(app, ["run", str(tmp_path / "spaces"), "--objective", "time", "--budget", "12", "--run-dir",
                                   str(tmp_path / "night"), "--json"])
    assert out.exit_code == 0, out.output
    assert view_run(tmp_path / "night" / "problems" / "hotspot_like").best.params == {"steps": 1, "block": 64}
    code = CliRunner().invoke(app, ["run", str(Path(__file__).parents[1] / "examples" / "softmax"), "--objective", "time",
                                    "--budget", "2", "--run-dir", str(tmp_path / "code")])
    assert code.exit_code == 2 and "none of these problems is one" in " ".join(code.output.split())
