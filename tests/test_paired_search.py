"""benchmarks/paired_search.py pairs two arms' runs by space and seed; the difference it reports is the paired one."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paired_search.py"
spec = importlib.util.spec_from_file_location("paired_search", SCRIPT)
paired_search = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired_search)


def _runs(path: Path, label: str, rows: dict[tuple[str, int], list[float]]) -> str:
    path.write_text("".join(json.dumps({"label": label, "space": s, "seed": seed, "budgets": [20, 50], "frac_of_opt": f}) + "\n"
                            for (s, seed), f in rows.items()))
    return str(path)


def test_pairs_by_space_and_seed_and_reports_the_paired_standard_error(tmp_path, capsys):
    old = _runs(tmp_path / "old.jsonl", "old", {("a", 0): [0.5, 0.8], ("a", 1): [0.9, 1.0], ("b", 0): [0.6, 0.7]})
    # seed 1 of space a gains 0.1 at 20, the others 0.0 and 0.2; space c exists in the new file only
    new = _runs(tmp_path / "new.jsonl", "new", {("a", 0): [0.5, 0.9], ("a", 1): [1.0, 1.0], ("b", 0): [0.8, 0.7], ("c", 0): [1.0, 1.0]})
    paired_search.main(["pair", old, new])
    out = capsys.readouterr().out
    assert "a                      n=  2  0.700 / 0.900  ->  0.750 / 0.950" in out
    assert "mean over spaces       n=  3  0.650 / 0.800  ->  0.775 / 0.825" in out  # the mean of the two spaces' means
    # differences at 20: 0.0, 0.1, 0.2 -> mean 0.1, sd 0.1, standard error 0.1 / sqrt(3) = 0.058
    assert "paired difference (standard error): +0.100 (0.058) / +0.033 (0.033)" in out
    assert "1 run(s) are in one file only" in out


def test_seed_ranges_and_lists():
    assert paired_search.seed_range("0-3,7") == [0, 1, 2, 3, 7]


def _write_spaces(folder: Path, kernel_of: dict[str, str]) -> None:
    """A two-configuration recorded space per file name, tuning the given kernel."""
    for name, kernel in kernel_of.items():
        text = json.dumps({"device_name": name.split(".")[0], "kernel_name": kernel, "tune_params_keys": ["bs"], "objective": "time",
                           "tune_params": {"bs": [1, 2]}, "cache": {"1": {"bs": 1, "time": 1.0}, "2": {"bs": 2, "time": 2.0}}})
        opener = gzip.open if name.endswith(".gz") else open
        with opener(folder / name, "wt") as f:
            f.write(text)


def test_the_warm_arm_starts_from_the_same_kernel_recorded_on_the_other_gpus(tmp_path):
    _write_spaces(tmp_path, {"conv_A100.json.gz": "conv", "conv_MI250X.json": "conv", "gemm_A100.json.gz": "gemm",
                             "convolution_A100.json.gz": "convolution"})
    assert paired_search.same_kernel_elsewhere(str(tmp_path / "conv_A100.json.gz")) == [str(tmp_path / "conv_MI250X.json")]
    assert paired_search.same_kernel_elsewhere(str(tmp_path / "gemm_A100.json.gz")) == []


def test_files_with_no_run_in_common_are_refused(tmp_path):
    old = _runs(tmp_path / "old.jsonl", "old", {("a", 0): [0.5, 0.8]})
    new = _runs(tmp_path / "new.jsonl", "new", {("a", 1): [0.5, 0.8]})
    with pytest.raises(SystemExit, match="run both arms on the same spaces and seeds"):
        paired_search.main(["pair", old, new])


def test_a_missing_runs_file_is_named(tmp_path):
    new = _runs(tmp_path / "new.jsonl", "new", {("a", 0): [0.5, 0.8]})
    with pytest.raises(SystemExit, match="no such file; give the JSON-lines files"):
        paired_search.main(["pair", str(tmp_path / "missing.jsonl"), new])


def test_an_unknown_space_is_refused_before_any_run(tmp_path, monkeypatch):
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "convolution_A100.json").write_text("{}")
    monkeypatch.setenv("KSCOUT_BENCHMARK_HUB", str(tmp_path / "hub"))
    out = tmp_path / "runs.jsonl"
    with pytest.raises(SystemExit, match="convolution_A10: no such recorded space; did you mean convolution_A100"):
        paired_search.main(["run", "--label", "x", "--out", str(out), "--spaces", "convolution_A10", "--seeds", "0"])
    assert not out.exists()


def test_a_kernel_tuner_arm_runs_the_strategy_as_the_benchmark_does(tmp_path, monkeypatch):
    """So the published table's 10-seed comparison with Kernel Tuner can be checked on more seeds."""
    pytest.importorskip("kernel_tuner")
    from kernelscout.agent.bench import best_after, frac_of_opt, kernel_tuner_trace
    from test_bench_metrics import OPTIMUM, write_tiny_space

    tiny = str(write_tiny_space(tmp_path))
    row = paired_search.one_run("kt", tiny, 3, [2, 7], method="kernel_tuner:random_sample")
    trace = kernel_tuner_trace(tiny, "random_sample", 3, 7, str(tmp_path))
    assert row["frac_of_opt"] == [round(frac_of_opt(OPTIMUM, best_after(trace.times, b)), 6) for b in (2, 7)]
    assert row["frac_of_opt"][1] == 1.0  # seven unique configurations are the whole space


def test_compare_lays_arms_side_by_side_and_names_where_the_first_is_behind(tmp_path, capsys):
    ours_a = _runs(tmp_path / "a.jsonl", "ks", {("a", 0): [0.5, 0.8], ("b", 0): [0.9, 1.0]})
    ours_b = _runs(tmp_path / "b.jsonl", "ks", {("a", 1): [0.7, 1.0], ("b", 1): [0.9, 1.0]})
    theirs = _runs(tmp_path / "t.jsonl", "kt", {("a", 0): [0.6, 0.7], ("a", 1): [0.8, 0.7], ("b", 0): [0.8, 0.9], ("b", 1): [0.8, 0.9],
                                                ("b", 2): [1.0, 1.0]})  # seed 2 only here: left out
    paired_search.main(["compare", f"ours={ours_a},{ours_b}", theirs])
    out = capsys.readouterr().out
    assert "2 seeds (0-1) on each of 2 spaces" in out
    assert "  ours  0.600 ±0.100 | 0.900 ±0.100" in out  # space a: (0.5, 0.7) and (0.8, 1.0)
    assert "  kt    0.700 ±0.100 | 0.700 ±0.000" in out
    # space a at 20: differences -0.1 and -0.1, so behind by 0.100 with no spread; b and the mean are ahead at 20
    assert "@20 a: behind kt by 0.100 (paired standard error 0.000, beyond 2)" in out
    assert "@50 a" not in out and "@20 b" not in out and "@20 mean over spaces" not in out


def test_a_surrogate_none_arm_is_the_search_that_measures_what_the_policy_proposes(tmp_path):
    from kernelscout.agent.bench import best_after, frac_of_opt, kernelscout_trace
    from test_bench_metrics import OPTIMUM, write_tiny_space

    tiny = str(write_tiny_space(tmp_path))
    row = paired_search.one_run("none", tiny, 1, [2, 4], method="kernelscout:none")
    trace = kernelscout_trace(tiny, "none", 1, 4, str(tmp_path / "run"))
    assert row["frac_of_opt"] == [round(frac_of_opt(OPTIMUM, best_after(trace.times, b)), 6) for b in (2, 4)]
    assert row["considered_per_measurement"] is not None and row["considered_per_measurement"] <= 1.5  # measures nearly all it considers
    assert row["configurations"] == len(trace.times) == 5  # the reference and the run's four charged measurements


def test_compare_draws_the_arms_as_the_published_figure_does(tmp_path, capsys):
    ours = _runs(tmp_path / "a.jsonl", "ks", {("a", 0): [0.5, 0.8], ("a", 1): [0.7, 1.0]})
    theirs = _runs(tmp_path / "t.jsonl", "kt", {("a", 0): [0.6, 0.7], ("a", 1): [0.8, 0.7]})
    png = tmp_path / "arms.png"
    paired_search.main(["compare", "--plot", str(png), ours, theirs])
    assert capsys.readouterr().out.rstrip().endswith(f"plot: {png}")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_warm_start_table_pairs_warm_with_cold_runs_of_the_same_space_and_seed(tmp_path):
    spec = importlib.util.spec_from_file_location("warm_start_search", SCRIPT.parent / "warm_start_search.py")
    warm_start_search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm_start_search)
    _write_spaces(tmp_path, {"conv_A100.json.gz": "conv", "conv_MI250X.json.gz": "conv", "gemm_A100.json.gz": "gemm"})
    spaces = warm_start_search.spaces_with_another_gpu(tmp_path)
    assert [p.name for p in spaces] == ["conv_A100.json.gz", "conv_MI250X.json.gz"]  # gemm has no other GPU
    cold = {("conv_A100", 0): [0.5, 0.6, 0.7], ("conv_A100", 1): [0.7, 0.8, 0.9], ("conv_MI250X", 0): [0.9, 1.0, 1.0]}
    warm = {("conv_A100", 0): [0.6, 0.6, 0.7], ("conv_A100", 1): [0.9, 0.8, 0.9], ("conv_MI250X", 0): [0.9, 1.0, 1.0]}
    lines = warm_start_search.table(cold, warm, spaces)
    assert "| conv_A100 | conv_MI250X | 0.600 | 0.750 | 0.700 | 0.700 | 0.800 | 0.800 |" in lines
    # the mean over spaces weighs each space once: (0.6 + 0.9) / 2 cold, (0.75 + 0.9) / 2 warm at 20
    assert "| **mean** | | **0.750** | **0.825** | **0.850** | **0.850** | **0.900** | **0.900** |" in lines
    # differences at 20 over the three runs: 0.1, 0.2, 0.0 -> mean 0.1, standard error 0.1 / sqrt(3)
    assert lines[-1].endswith("+0.100 (0.058) / +0.000 (0.000) / +0.000 (0.000)")


def test_spaces_of_the_same_file_name_are_kept_apart_by_their_folders(tmp_path):
    from test_space_names import hub_layout

    root = hub_layout(tmp_path)
    out = tmp_path / "runs.jsonl"
    spaces = f"{root / 'gemm' / 'A100.json'},{root / 'hotspot' / 'A100.json'}"
    import subprocess
    import sys

    # a process of its own: its pool pickles `one_run` by the script's module name
    subprocess.run([sys.executable, str(SCRIPT), "run", "--label", "x", "--out", str(out), "--spaces", spaces, "--seeds", "0",
                    "--budgets", "2", "--jobs", "1", "--method", "kernelscout:none"], check=True, capture_output=True)
    assert sorted(json.loads(line)["space"] for line in out.read_text().splitlines()) == ["gemm/A100", "hotspot/A100"]
