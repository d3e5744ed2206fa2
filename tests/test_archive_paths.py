"""A run directory reached by another path than the one it was started with still finds its archived kernels."""

from pathlib import Path

from kernelscout.tools.archive import ROOT_ID, Archive
from kernelscout.tools.rundir import RunDir


def test_a_run_started_with_a_relative_folder_finds_its_kernels_from_any_folder(tmp_path, monkeypatch):
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")  # `kscout optimize ... --run-dir ../runs/r` from a project folder
    rec = Archive(RunDir("../runs/r")).add("a" * 64, "class ModelNew: pass\n", ROOT_ID, "user", {}, "", {}, 0)
    assert rec.path == str(Path("../runs/r/kernels/aaaaaaaaaaaaaaaa.py"))

    monkeypatch.chdir(tmp_path)  # `kscout resume runs/r` from the folder above: the recorded path points nowhere here
    again = Archive(RunDir("runs/r")).get(rec.id)
    assert Path(again.path).read_text() == "class ModelNew: pass\n"
