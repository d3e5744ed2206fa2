"""A brute-forced space kept as T4 results (as Kernel Tuner's `store_output_file` writes them) is searched and
benchmarked as its Kernel Tuner cache is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelscout.agent.cli import app
from kernelscout.agent.runner import start_search
from kernelscout.sandbox.replay import ReplaySpace, read_cache_json, recorded_spaces_dir
from kernelscout.tools.rundir import reading
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache

HUB_SPACE = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"


def as_t4_by_kernel_tuner(cache_path: Path, out: Path) -> Path:
    """The cache's records written out by Kernel Tuner's own T4 writer, as `store_output_file` would."""
    file_utils = pytest.importorskip("kernel_tuner.file_utils")
    from kernel_tuner import util

    doc = read_cache_json(cache_path)
    errors = {"CompilationFailedConfig": util.CompilationFailedConfig, "RuntimeFailedConfig": util.RuntimeFailedConfig,
              "InvalidConfig": util.InvalidConfig}
    results = []
    for record in doc["cache"].values():
        result = {"compile_time": 0, "benchmark_time": 0, "framework_time": 0, "strategy_time": 0, "verification_time": 0, **record}
        if isinstance(record.get("time"), str):
            result["__error__"] = errors[record["time"]]()
        results.append(result)
    out.write_text(json.dumps(file_utils.get_t4_results(results, doc["tune_params"]), cls=util.NpEncoder))
    return out


def t4_result(config: dict, invalidity: str = "correct", runtimes=(), time=None, unit=None, correctness: int = 1) -> dict:
    measurements = [] if time is None else [{"name": "time", "value": time, **({"unit": unit} if unit else {})}]
    return {"configuration": config, "times": {"runtimes": list(runtimes)}, "invalidity": invalidity,
            "correctness": correctness, "measurements": measurements, "objectives": ["time"]}


def test_kernel_tuners_t4_output_replays_the_same_space_as_its_cache(tmp_path: Path) -> None:
    cache = write_synthetic_cache(tmp_path / "syn.json")
    t4 = as_t4_by_kernel_tuner(cache, tmp_path / "syn_t4.json")

    from_cache, from_t4 = ReplaySpace.load(cache), ReplaySpace.load(t4)

    # the same configurations, times, repeats and failures: every replayed measurement draws the same
    assert from_t4.content_sha == from_cache.content_sha
    assert from_t4.param_values == from_cache.param_values and from_t4.failures == from_cache.failures
    assert from_t4.device_label == "syn_t4"  # T4 results do not name the device: the file does


def test_the_t4_file_of_a_whole_kernel_tuner_run_replays_the_space_it_tuned(tmp_path: Path) -> None:
    """Kernel Tuner's brute force over the synthetic space (simulated from its cache), written by store_output_file."""
    kernel_tuner = pytest.importorskip("kernel_tuner")
    import numpy as np
    from kernel_tuner.file_utils import store_output_file

    cache = write_synthetic_cache(tmp_path / "syn.json")
    doc = read_cache_json(cache)
    for record in doc["cache"].values():  # the fields a Kernel Tuner run records, which T4 carries over
        record.update(compile_time=1.0, verification_time=0, benchmark_time=2.0, strategy_time=0, framework_time=0.5)
    cache.write_text(json.dumps(doc))
    results, _ = kernel_tuner.tune_kernel(
        doc["kernel_name"], "__global__ void k() {}", doc["problem_size"], [np.float32(1)], doc["tune_params"],
        restrictions=["not (use_shmem == 1 and tile_size == 3 and block_size_x % 64 == 0)"],  # the synthetic space's
        cache=str(cache), simulation_mode=True, strategy="brute_force", quiet=True)
    store_output_file(str(tmp_path / "run_t4.json"), results, doc["tune_params"])

    assert ReplaySpace.load(tmp_path / "run_t4.json").content_sha == ReplaySpace.load(cache).content_sha


@pytest.mark.skipif(not HUB_SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_a_search_of_a_recorded_gpu_space_kept_as_t4_measures_what_the_search_of_its_cache_did(tmp_path: Path) -> None:
    # T4 results do not name the device, and a replay's noise is keyed on it: the cache is compared without its name,
    # under the same file name, so that both are known as the same device
    doc = read_cache_json(HUB_SPACE)
    cache, t4 = tmp_path / "cache" / "pnpoly.json", tmp_path / "t4" / "pnpoly.json"
    cache.parent.mkdir(), t4.parent.mkdir()
    cache.write_text(json.dumps({**doc, "device_name": ""}))
    as_t4_by_kernel_tuner(HUB_SPACE, t4)

    def measured(space: Path, folder: str) -> tuple[list[str], float]:
        result = start_search(problem=None, space=str(space), budget=15, seed=2, run_dir=str(tmp_path / folder), quiet=True, report=False)
        with reading(tmp_path / folder / "run.db") as db:
            shas = [row[0] for row in db.execute("SELECT candidate_path FROM measurements WHERE charged = 1 ORDER BY id")]
        return shas, result.best_speedup

    assert measured(t4, "t4") == measured(cache, "cache")


def test_t4_times_in_other_units_failures_and_excluded_configurations_are_read_as_recorded(tmp_path: Path) -> None:
    doc = {"schema_version": "1.0.0", "metadata": {"timeunit": "microseconds"}, "results": [
        t4_result({"bs": 32}, runtimes=[1500, 1500, 1500]),  # no time measurement: the runtimes' mean, in the file's unit
        t4_result({"bs": 64}, runtimes=[900, 1100], time=0.001, unit="s"),  # its own unit wins
        t4_result({"bs": 96}, "compile"),
        t4_result({"bs": 128}, "timeout"),
        t4_result({"bs": 160}, "correct", runtimes=[10], time=10, unit="us", correctness=0),  # fast and wrong
        t4_result({"bs": 192}, "constraints"),
        t4_result({"bs": 224}, time=[2000, 2200], unit="us"),  # the schema allows the repeats as the measurement
    ]}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))

    space = ReplaySpace.load(path)

    assert [c[0] for c in space.configs] == [32, 64, 96, 128, 160, 224]  # the excluded one is outside the space
    assert space.median_times[[0, 1, 5]] == pytest.approx([1.5, 1.0, 2.1])
    assert space.repeats[1] == pytest.approx([0.9, 1.1]) and space.repeats[5] == pytest.approx([2.0, 2.2])
    assert {space.configs[i][0]: s.value for i, s in space.failures.items()} == {
        96: "compile_error", 128: "runtime_error", 160: "runtime_error"}
    assert any("1 timed out and 1 gave wrong results" in note for note in space.notes)


@pytest.mark.parametrize("result, phrase", [
    (t4_result({"bs": 1}, "exploded"), "invalidity 'exploded'"),
    (t4_result({"bs": 1}, time=2.0, unit="fortnights"), "a time unit of 'fortnights'"),
    ({"times": {}, "invalidity": "correct", "correctness": 1}, "without a configuration"),
])
def test_a_t4_file_that_cannot_be_read_is_a_usage_error_that_says_why(tmp_path: Path, result: dict, phrase: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema_version": "1.0.0", "results": [t4_result({"bs": 2}, time=1.0), result]}))

    out = CliRunner().invoke(app, ["optimize", "--space", str(path), "--budget", "2", "--run-dir", str(tmp_path / "run")])

    assert out.exit_code == 2, out.output
    assert phrase in " ".join(out.output.split()) and "Traceback" not in out.output


def test_bench_search_gives_kernel_tuner_the_cache_a_t4_file_describes(tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")
    t4 = as_t4_by_kernel_tuner(write_synthetic_cache(tmp_path / "syn.json"), tmp_path / "syn_t4.json")

    out = CliRunner().invoke(app, ["bench", "search", str(t4), "--budgets", "6", "--seeds", "1", "--jobs", "1", "--json"])

    assert out.exit_code == 0, out.output
    table = json.loads(out.stdout)["syn_t4"]
    assert table["kernel_tuner random_sample"]["6"]["frac_of_opt"] > 0 and table["kernelscout"]["6"]["frac_of_opt"] > 0


def test_a_t4_file_warm_starts_the_same_kernels_cache_it_does_not_name(tmp_path: Path) -> None:
    a = ReplaySpace.load(write_synthetic_cache(tmp_path / "a.json", "GPU A"))
    b = ReplaySpace.load(as_t4_by_kernel_tuner(write_synthetic_cache(tmp_path / "b.json", "GPU B", device_skew=0.4), tmp_path / "b_t4.json"))
    other = ReplaySpace.load(write_synthetic_cache(tmp_path / "c.json", "GPU C"))
    object.__setattr__(other, "kernel_name", "another_kernel")

    assert b.kernel_name == "" and b.same_kernel(a) and a.same_kernel(b)  # judged by the parameters they tune
    assert not other.same_kernel(a)  # two names that differ still say two kernels


def test_a_t4_metadata_file_is_told_from_results_and_left_out_of_a_folder(tmp_path: Path) -> None:
    import gzip

    folder = tmp_path / "tuning"
    folder.mkdir()
    as_t4_by_kernel_tuner(write_synthetic_cache(tmp_path / "syn.json"), folder / "A6000-results.json")
    metadata = {"metadata": {"operating_system": "Linux", "hardware": {}, "environment": {}}, "schema_version": "1.0.0"}
    with gzip.open(folder / "A6000-metadata.json.gz", "wt") as fh:
        json.dump(metadata, fh)
    results = json.loads((folder / "A6000-results.json").read_text())  # another writer may put the metadata first
    (folder / "B-results.json").write_text(json.dumps({"metadata": results.pop("metadata"), **results}))

    listed = CliRunner().invoke(app, ["eval-surrogate", str(folder), "-n", "10", "-s", "1", "--pairs", "200", "--json", "--no-plots"])
    alone = CliRunner().invoke(app, ["optimize", "--space", str(folder / "A6000-metadata.json.gz"), "--budget", "2",
                                     "--run-dir", str(tmp_path / "run")])

    assert listed.exit_code == 0, listed.output
    assert list(json.loads(listed.stdout)["spaces"]) == ["A6000-results", "B-results"]  # the metadata left out
    assert alone.exit_code == 2 and "a T4 metadata file" in " ".join(alone.output.split())
    assert "give the results file written beside it" in " ".join(alone.output.split())


def test_t4_build_times_reach_the_cache_kernel_tuner_simulates_from_under_either_spelling(tmp_path: Path) -> None:
    """Kernel Tuner's simulation mode charges each configuration's recorded build and run times to its clock."""
    first, second = t4_result({"bs": 1}, time=1.0), t4_result({"bs": 2}, time=2.0)
    first["times"].update(compilation=3.0, benchmark=5.0)  # as Kernel Tuner writes them
    second["times"].update(compilation_time=4.0)  # as the T4 schema spells it
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"schema_version": "1.0.0", "results": [first, second]}))

    records = read_cache_json(path)["cache"]

    assert (records["1"]["compile_time"], records["1"]["benchmark_time"], records["2"]["compile_time"]) == (3.0, 5.0, 4.0)


@pytest.mark.parametrize("objectives, objective", [(["GFLOP/s"], "GFLOP/s"), (["time", "energy"], "time, energy"), ([], "time")])
def test_a_t4_file_tuned_for_several_objectives_is_named_so_not_read_as_its_first(tmp_path: Path, objectives, objective) -> None:
    results = [t4_result({"bs": b}, time=1.0 + b / 64, unit="ms") for b in (32, 64, 128)]
    for r in results:
        r["objectives"] = objectives
    path = tmp_path / "multi_t4.json"
    path.write_text(json.dumps({"schema_version": "1.0.0", "results": results}))
    space = ReplaySpace.load(path)
    assert space.objective == objective
    if len(objectives) > 1:
        assert "its objectives are time, energy; kernelscout minimises the recorded time alone" in space.notes[0]
