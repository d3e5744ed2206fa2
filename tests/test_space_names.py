"""Spaces whose files share a name: the benchmark hub's own layout keeps `cachefiles/<kernel>/<GPU>.json.gz`,
so `hotspot/A100.json.gz` and `gemm/A100.json.gz` are given side by side, and results are kept by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelscout.agent.bench import BenchError, BenchRequest, restrictions_for, run_bench
from kernelscout.agent.cli import app
from kernelscout.sandbox.replay import ReplaySpace, load_spaces, space_files, space_labels
from test_bench_metrics import write_tiny_space


def hub_layout(root: Path) -> Path:
    """Two kernels on one GPU and one on another, as the hub's upstream repository lays them out."""
    for kernel, gpu in (("gemm", "A100"), ("hotspot", "A100"), ("gemm", "H100")):
        folder = root / "cachefiles" / kernel
        folder.mkdir(parents=True, exist_ok=True)
        shutil.move(write_tiny_space(folder), folder / f"{gpu}.json")
        (folder / "README.md").unlink()
    return root / "cachefiles"


def test_files_of_the_same_name_are_told_apart_by_as_many_folders_as_it_takes() -> None:
    assert space_labels(["c/hotspot/A100.json.gz", "c/gemm/A100.json.gz", "c/gemm/H100.json.gz"]) == \
        ["hotspot/A100", "gemm/A100", "H100"]
    assert space_labels(["/a/x/A100.json", "/b/x/A100.json", "/b/x/B.json"]) == ["a/x/A100", "b/x/A100", "B"]
    assert space_labels(["convolution_A100.json.gz", "gemm_RTX_3090.json.gz"]) == ["convolution_A100", "gemm_RTX_3090"]


def test_a_folder_of_kernel_folders_stands_for_the_spaces_inside_them(tmp_path: Path) -> None:
    root = hub_layout(tmp_path)
    (root / "gemm" / "notes.json").write_text('{"author": "not a space"}')  # other JSON beside the caches is not taken
    (root / "older" / "gemm").mkdir(parents=True)  # nor is a folder two levels down: only the hub's one level is looked in
    shutil.copy(root / "gemm" / "A100.json", root / "older" / "gemm" / "A100.json")
    assert [p.relative_to(root).as_posix() for p in space_files(root)] == ["gemm/A100.json", "gemm/H100.json", "hotspot/A100.json"]
    (root / "gemm" / "notes.json").unlink()
    spaces = load_spaces([root])
    assert [s.name for s in spaces] == ["gemm/A100", "H100", "hotspot/A100"]
    # a label is only a name: what replays, and so every measurement key, stays the file's own
    alone = ReplaySpace.load(root / "gemm" / "A100.json")
    assert spaces[0].content_sha == alone.content_sha and spaces[0].device_label == alone.device_label


def test_bench_search_keeps_each_spaces_results_under_its_own_name(tmp_path: Path) -> None:
    root = hub_layout(tmp_path)
    result = run_bench(BenchRequest(spaces=[str(root / "gemm" / "A100.json"), str(root / "hotspot" / "A100.json")],
                                    budgets=[2], seeds=1, baselines=[], jobs=1, out=str(tmp_path / "runs")))
    assert sorted(result.spaces) == ["gemm/A100", "hotspot/A100"]
    assert all(result.spaces[name]["kernelscout"]["2"].frac_of_opt > 0 for name in result.spaces)
    assert sorted(p.name for p in (tmp_path / "runs" / "runs").iterdir()) == [
        "gemm--A100-learned-seed0", "gemm--A100-none-seed0", "hotspot--A100-learned-seed0", "hotspot--A100-none-seed0"]


def test_the_same_space_given_twice_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = str(write_tiny_space(tmp_path))
    with pytest.raises(BenchError, match="is given twice; give each space once"):
        run_bench(BenchRequest(spaces=[path, path], budgets=[2], seeds=1, baselines=[], jobs=1))
    out = CliRunner().invoke(app, ["eval-surrogate", path, path])
    assert out.exit_code == 2 and "given twice" in out.output


def test_restrictions_are_read_from_the_readme_that_lists_the_kernel_in_a_folder_above(tmp_path: Path) -> None:
    root = hub_layout(tmp_path)
    space = root / "hotspot" / "A100.json"
    assert restrictions_for(str(space)) is None
    (root / "README.md").write_text("# hub\n\n## Valid space of each kernel\n- tiny_kernel: `x*y <= 6`\n")
    assert restrictions_for(str(space)) == ["x*y <= 6"]
    (root / "hotspot" / "README.md").write_text("## Valid space\n- tiny_kernel: `x <= 3`\n")  # the nearest wins
    assert restrictions_for(str(space)) == ["x <= 3"]
    (root / "hotspot" / "README.md").write_text("# notes on hotspot, no restrictions\n")  # one that lists it is looked for
    assert restrictions_for(str(space)) == ["x*y <= 6"]


def test_kscout_run_takes_a_folder_of_kernel_folders_and_names_each_space_by_kernel_and_gpu(tmp_path: Path) -> None:
    from kernelscout.agent.headless import discover

    root = hub_layout(tmp_path)
    (root / "gemm" / "notes.json").write_text('{"author": "not a space"}')  # other JSON beside the caches is not taken
    refs = discover([str(root)])
    assert [(r.name, r.kind) for r in refs] == [("gemm_A100", "space"), ("gemm_H100", "space"), ("hotspot_A100", "space")]
    (root / "gemm" / "notes.json").unlink()  # given itself, a folder's every JSON file is taken for a space, as before
    assert [r.name for r in discover([str(root / "gemm")])] == ["A100", "H100"]


def test_optimize_given_a_folder_of_spaces_names_some_inside_and_the_command_for_all(tmp_path: Path) -> None:
    root = hub_layout(tmp_path)
    out = CliRunner().invoke(app, ["optimize", "--space", str(root), "--budget", "2", "--run-dir", str(tmp_path / "run")])
    text = " ".join(out.output.split())
    assert out.exit_code == 2 and "a folder; --space takes one Kernel Tuner cache file" in text
    assert str(root / "gemm" / "A100.json") in text and "kscout run FOLDER --budget N" in text
    assert not (tmp_path / "run").exists()


def test_notes_name_a_labelled_space_by_its_label(tmp_path: Path) -> None:
    root = hub_layout(tmp_path)
    for kernel in ("gemm", "hotspot"):  # both say something: a record timed at 0 ms
        path = root / kernel / "A100.json"
        doc = json.loads(path.read_text())
        doc["cache"]["1,1"]["time"] = 0
        path.write_text(json.dumps(doc))
    notes = [n for s in load_spaces([root]) if s.name.endswith("A100") for n in s.notes]
    assert [n.split(":")[0] for n in notes] == ["gemm/A100", "hotspot/A100"]
