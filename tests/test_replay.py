"""The replay device answers `measure` as the recorded hardware did."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace, load_spaces, recorded_spaces_dir
from kernelscout.tools.schema import MeasureStatus
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache

HUB = recorded_spaces_dir()


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> ReplaySpace:
    return ReplaySpace.load(write_synthetic_cache(tmp_path_factory.mktemp("replay") / "synthetic_A.json.gz"))


def _first_ok(space: ReplaySpace) -> dict:
    return space.config(int(np.flatnonzero(space.ok_mask)[0]))


def test_load_lists_params_configs_and_failures(space: ReplaySpace) -> None:
    assert space.param_names == ("block_size_x", "tile_size", "use_shmem", "variant", "filter")
    assert space.param_values["variant"] == ("plain", "unrolled")
    assert len(space) == 248  # 256 in the product, 8 excluded by the restriction
    statuses = set(space.failures.values())
    assert statuses == {MeasureStatus.compile_error, MeasureStatus.runtime_error}
    assert np.isnan(space.times[list(space.failures)]).all()
    assert space.best_time == pytest.approx(np.nanmin(space.median_times))
    assert space.ok_mask.sum() == len(space) - len(space.failures)


def test_measure_draws_time_from_recorded_repeats(space: ReplaySpace) -> None:
    device = ReplayDevice(space, name="A")
    config = _first_ok(space)
    reps = space.repeats[space.index_of(config)]
    m = device.measure(config, np.random.default_rng(0))
    assert m.status == MeasureStatus.ok and m.correct and m.timing_valid
    assert m.charged is True
    assert m.device == "replay:A"
    assert reps.min() <= m.runtime_ms <= reps.max()
    assert m.candidate_timing is not None and m.candidate_timing.repeats == reps.size


def test_measure_is_reproducible_for_a_seed_and_noisy_across_seeds(space: ReplaySpace) -> None:
    device = ReplayDevice(space)
    config = _first_ok(space)
    a = device.measure(config, np.random.default_rng(1)).runtime_ms
    b = device.measure(config, np.random.default_rng(1)).runtime_ms
    draws = {device.measure(config, np.random.default_rng(s)).runtime_ms for s in range(20)}
    assert a == b
    assert len(draws) > 1


def test_failed_configs_fail_as_recorded_and_are_charged(space: ReplaySpace) -> None:
    device = ReplayDevice(space)
    for idx, status in space.failures.items():
        m = device.measure(space.config(idx), np.random.default_rng(0))
        assert m.status == status
        assert m.charged is True
        assert m.runtime_ms is None


def test_config_outside_the_space_is_invalid_and_not_charged(space: ReplaySpace) -> None:
    device = ReplayDevice(space)
    excluded = {"block_size_x": 64, "tile_size": 3, "use_shmem": 1, "variant": "plain", "filter": 15}
    unknown_value = {**_first_ok(space), "block_size_x": 17}
    missing_param = {k: v for k, v in _first_ok(space).items() if k != "filter"}
    for config in (excluded, unknown_value, missing_param):
        m = device.measure(config, np.random.default_rng(0))
        assert m.status == MeasureStatus.invalid_problem
        assert m.charged is False
        assert "outside the recorded space" in m.message


def test_config_may_be_a_value_sequence(space: ReplaySpace) -> None:
    config = _first_ok(space)
    values = [config[n] for n in space.param_names]
    assert space.index_of(values) == space.index_of(config)


def test_reference_gives_a_same_session_speedup(space: ReplaySpace) -> None:
    device = ReplayDevice(space)
    ok = np.flatnonzero(space.ok_mask)
    fast = space.config(space.best_index)
    slow = space.config(int(ok[np.nanargmax(space.median_times[ok])]))
    m = device.measure(fast, np.random.default_rng(0), reference=slow)
    assert m.speedup == pytest.approx(m.ref_runtime_ms / m.runtime_ms)
    assert m.speedup > 1.5


def test_unterminated_cache_from_an_interrupted_run_loads(tmp_path: Path) -> None:
    complete = ReplaySpace.load(write_synthetic_cache(tmp_path / "done.json"))
    partial = ReplaySpace.load(write_synthetic_cache(tmp_path / "partial.json", unterminated=True))
    assert len(partial) == len(complete)


def test_legacy_failure_time_and_configs_known_only_by_key(tmp_path: Path) -> None:
    doc = {
        "kernel_name": "k",
        "device_name": "",
        "tune_params_keys": ["a", "b"],
        "tune_params": {"a": [1, 2], "b": ["x", "y"]},
        "cache": {
            "1,x": {"time": 2.0, "times": [1.9, 2.1]},
            "1,y": {"time": 1e20},
            "2,x": {"time": "InvalidConfig"},
            "2,y": {"time": 3.0},
        },
    }
    path = tmp_path / "legacy_dev.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    space = ReplaySpace.load(path)
    assert len(space) == 3  # InvalidConfig is outside the space
    assert space.failures == {1: MeasureStatus.runtime_error}
    assert space.index_of({"a": 2, "b": "y"}) == 2
    assert space.device_label == "legacy_dev"  # empty device_name falls back to the file name
    assert space.repeats[2].tolist() == [3.0]  # no repeats recorded: the time is the only draw


def test_load_spaces_accepts_a_folder(tmp_path: Path) -> None:
    write_synthetic_cache(tmp_path / "a.json.gz")
    write_synthetic_cache(tmp_path / "b.json", device_skew=0.3)
    (tmp_path / "notes.txt").write_text("not a cache")
    names = [s.name for s in load_spaces([tmp_path])]
    assert names == ["a", "b"]


@pytest.mark.skipif(not HUB.exists(), reason="benchmark_hub data not available")
def test_real_cache_matches_its_readme() -> None:
    space = ReplaySpace.load(HUB / "convolution_A100.json.gz")
    assert len(space) == 4362
    statuses = list(space.failures.values())
    assert statuses.count(MeasureStatus.runtime_error) == 155
    assert statuses.count(MeasureStatus.compile_error) == 6
    assert space.device_label == "NVIDIA A100-PCIE-40GB"


def test_a_search_replays_the_same_wherever_the_space_file_lies(tmp_path: Path) -> None:
    """Keys and noise hang on the space's content, not its path: a benchmark reruns to the same table
    on another machine, where the recorded spaces sit in another folder."""
    import shutil
    import sqlite3

    from kernelscout.agent.runner import start_search
    from kernelscout.sandbox.replay import recorded_spaces_dir

    src = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
    if not src.exists():
        pytest.skip("recorded spaces (shared/data/benchmark_hub) not found")
    (tmp_path / "elsewhere").mkdir()
    moved = shutil.copy(src, tmp_path / "elsewhere" / "renamed.json.gz")

    def measured(space: str, run: str) -> list[tuple]:
        start_search(None, space, budget=10, seed=4, run_dir=str(tmp_path / run), quiet=True, report=False)
        db = sqlite3.connect(tmp_path / run / "run.db")
        return db.execute("SELECT candidate_path, speedup, key FROM measurements ORDER BY id").fetchall()

    here, there = measured(str(src), "a"), measured(str(moved), "b")
    assert len(here) == 10 and here == there


@pytest.mark.parametrize("surrogate", ["learned", "none"])
def test_the_reference_configuration_is_never_spent_as_a_candidate(tmp_path: Path, surrogate: str) -> None:
    """The reference is timed in every replayed session; measuring its own configuration again would
    spend a measurement to learn 1.0x. A space of six configurations is used up in five."""
    from kernelscout.agent.runner import start_search
    from kernelscout.agent.targets import ReplayTarget
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.rundir import RunDir

    times = {bs: 1.0 + 0.1 * bs for bs in (16, 32, 48, 64, 96, 128)}
    cache = {str(v): {"bs": v, "time": t, "times": [t] * 3} for v, t in times.items()}
    path = tmp_path / "six.json"
    path.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["bs"],
                                "tune_params": {"bs": list(times)}, "objective": "time", "cache": cache}))
    result = start_search(None, str(path), budget=10, seed=3, surrogate=surrogate, run_dir=str(tmp_path / "run"),
                          quiet=True, report=False)
    run = RunDir(tmp_path / "run")
    measured = {r.params["bs"] for r in Archive(run).all() if r.state == "measured"}
    reference = ReplayTarget(ReplaySpace.load(path), run, seed=3).reference["bs"]
    assert measured == set(times) - {reference}
    assert result.measurements_used == 5

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "problem_size": [64], "tune_params_keys": ["bs"],
                               "tune_params": {"bs": [16]}, "objective": "time", "cache": {"16": cache["16"]}}))
    alone = start_search(None, str(one), budget=10, seed=3, surrogate=surrogate, run_dir=str(tmp_path / "run1"),
                         quiet=True, report=False)
    assert alone.measurements_used == 0


def _cache(tmp_path: Path, name: str, tune_params: dict, records: dict, **header) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": list(tune_params),
                                "tune_params": tune_params, "objective": "time", "cache": records, **header}))
    return path


def test_a_shape_valued_parameter_is_searched_like_any_other(tmp_path: Path) -> None:
    """A parameter whose values are lists (a tile shape) comes back from JSON as lists, in the cache and in the
    run's archive; the space, the surrogate and the search know them all the same."""
    from kernelscout.agent.runner import start_search

    shapes = [[1, 2], [2, 2], [4, 1], [4, 4]]
    records = {f"{s},{q}": {"shape": s, "q": q, "time": 1.0 + 0.3 * i + 0.05 * abs(q - 5)}
               for i, s in enumerate(shapes) for q in range(1, 11)}
    path = _cache(tmp_path, "shapes.json", {"shape": shapes, "q": list(range(1, 11))}, records)
    space = ReplaySpace.load(path)
    assert space.index_of({"shape": [4, 1], "q": 3}) == space.index_of({"shape": (4, 1), "q": 3}) is not None

    result = start_search(None, str(path), budget=20, seed=1, run_dir=str(tmp_path / "run"), quiet=True, report=False)
    assert result.measurements_used == 20  # past the cold start: the learned surrogate ranked the shapes
    assert result.best_runtime_ms == pytest.approx(1.0, rel=0.05)  # shape [1, 2] with q = 5


def test_what_a_cache_says_that_cannot_be_replayed_as_written_is_said(tmp_path: Path) -> None:
    records = {str(bs): {"bs": bs, "time": 0.5 * bs} for bs in (1, 2, 4, 8)}
    records["1"]["time"] = 0.0  # no kernel takes no time
    records["4"] = {"bs": 4, "times": [2.0, 2.2]}  # time left out: Kernel Tuner's is the mean of the repeats
    records["8"]["time"] = [3.9, 4.1]
    space = ReplaySpace.load(_cache(tmp_path, "odd.json", {"bs": [1, 2, 4, 8]}, records))
    assert space.failures == {0: MeasureStatus.runtime_error}
    assert space.times[2] == pytest.approx(2.1) and space.times[3] == pytest.approx(4.0)
    assert any("1 record(s) have a time of 0 or less" in n for n in space.notes)

    # an interrupted run cut off in the middle of its last record: the complete ones load, and the note says so
    text = _cache(tmp_path, "cut.json", {"bs": [1, 2, 4]}, {str(b): {"bs": b, "time": float(b)} for b in (1, 2, 4)}).read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text.replace(', "4": {"bs": 4, "time": 4.0}}}', ',\n"4": {"bs": 4, "ti').replace('"cache": {', '"cache": {\n')
                   .replace(', "2"', ',\n"2"'))
    partial = ReplaySpace.load(cut)
    assert len(partial) == 2 and any("partly written record" in n for n in partial.notes)

    # a header that is not a cache's: one line that names the fault
    from kernelscout.sandbox.replay import CacheFileError

    with pytest.raises(CacheFileError, match=r"tune_params\['bs'\] is 64, where a cache lists"):
        ReplaySpace.load(_cache(tmp_path, "scalar.json", {"bs": 64}, {"64": {"bs": 64, "time": 1.0}}))
    bad = json.loads(_cache(tmp_path, "keys.json", {"bs": [1]}, {"1": {"bs": 1, "time": 1.0}}).read_text())
    bad["tune_params_keys"] = ["bs", "gone"]
    (tmp_path / "keys.json").write_text(json.dumps(bad))
    with pytest.raises(CacheFileError, match="tune_params_keys names 'gone', which tune_params does not define"):
        ReplaySpace.load(tmp_path / "keys.json")


def test_a_search_result_carries_what_its_space_says_it_did_not_replay(tmp_path: Path) -> None:
    """A script reading `--json` (or the OptimizeResult) learns that the file was tuned for energy efficiency while
    time was searched: kernelscout makes kernels faster, and follows an objective only where it is a speed."""
    from kernelscout.agent.runner import start_search

    records = {str(bs): {"bs": bs, "time": 1.0 + abs(bs - 4) / 4, "GFLOPS/W": 100.0 / bs} for bs in (1, 2, 4, 8, 16)}
    path = _cache(tmp_path, "gflops.json", {"bs": [1, 2, 4, 8, 16]}, records, objective="GFLOPS/W")
    result = start_search(None, str(path), budget=3, run_dir=str(tmp_path / "run"), quiet=True, report=False)
    note = "gflops.json: its objective is 'GFLOPS/W'; kernelscout minimises the recorded time instead"
    assert result.notes == [note]
    # and reading the run later says it again, in `kscout show` and in the report
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app
    from kernelscout.agent.report import write_report
    from kernelscout.agent.run_view import view_run

    assert view_run(tmp_path / "run").space_notes == [note]
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "300"})
    assert "space note" in shown.output and "minimises the recorded time instead" in shown.output, shown.output
    assert "minimises the recorded time instead" in write_report(tmp_path / "run").read_text()


def test_a_cache_as_kernel_tuner_1_5_writes_it_replays_its_failures_as_they_were(tmp_path: Path) -> None:
    """Kernel Tuner 1.5 names the objective as a list and writes a failure as `"__error__": "CompilationFailedConfig"`
    with no time at all (its own reader takes any field holding a marker for the failure)."""
    from kernelscout.tools.schema import MeasureStatus

    records = {"1": {"bs": 1, "time": 2.0, "times": [2.0]}, "2": {"bs": 2, "time": 1.0, "times": [1.0]},
               "4": {"bs": 4, "__error__": "CompilationFailedConfig", "compile_time": 90.0},
               "8": {"bs": 8, "__error__": "RuntimeFailedConfig", "compile_time": 80.0},
               "16": {"bs": 16, "__error__": "InvalidConfig"}}
    space = ReplaySpace.load(_cache(tmp_path, "kt15.json", {"bs": [1, 2, 4, 8, 16]}, records, objective=["time"]))

    assert len(space) == 4 and space.index_of({"bs": 16}) is None  # outside the space, as Kernel Tuner never ran it
    assert {space.config(i)["bs"]: s for i, s in space.failures.items()} == {4: MeasureStatus.compile_error,
                                                                          8: MeasureStatus.runtime_error}
    assert space.notes == [] and space.best_time == 1.0
