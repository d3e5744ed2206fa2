"""benchmarks/paired_search.py pairs two arms' runs by space and seed; the difference it reports is the paired one."""

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
