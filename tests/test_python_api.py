"""The tools from Python: `import kernelscout as ks` is cheap, and its names are the CLI's functions."""

import subprocess
import sys
from pathlib import Path

import pytest

from kernelscout.sandbox.replay import recorded_spaces_dir

SPACE = recorded_spaces_dir() / "pnpoly_RTX_2080_Ti.json.gz"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_importing_kernelscout_does_not_load_torch():
    code = "import sys, kernelscout; print('torch' in sys.modules, kernelscout.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False" and out[1]


def test_public_names_are_the_tools_themselves():
    import kernelscout as ks
    from kernelscout.agent.run_view import view_run
    from kernelscout.tools.measure import measure

    assert ks.measure is measure and ks.show is view_run
    assert set(ks.__all__) <= set(dir(ks))
    with pytest.raises(AttributeError, match="no attribute 'mesure'"):
        ks.mesure  # noqa: B018


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_optimize_then_show_from_a_notebook(tmp_path):
    import kernelscout as ks

    result = ks.optimize(space=str(SPACE), budget=12, run_dir=str(tmp_path / "run"), quiet=True)
    view = ks.show(result.run_dir, top=3)
    assert view.budget.used == result.measurements_used == 12
    assert view.best.speedup == pytest.approx(result.best_speedup)
    assert view.status == "finished"
    with pytest.raises(TypeError):
        ks.optimize("a.py", "b.json.gz")  # space is keyword-only: a second positional is refused


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_a_run_is_analysed_read_only_and_a_mistyped_path_is_an_error(tmp_path, monkeypatch):
    """A colleague's run on a read-only mount still reads; a typo does not make an empty run that scores nothing."""
    import sqlite3

    import kernelscout as ks
    from kernelscout.tools import rundir

    result = ks.optimize(space=str(SPACE), budget=10, run_dir=str(tmp_path / "run"), quiet=True)
    with pytest.raises(ks.show.__globals__["RunViewError"], match="does not exist"):
        ks.open_run(tmp_path / "rnu")
    assert not (tmp_path / "rnu").exists()

    run = ks.open_run(result.run_dir)
    forecasts = ks.Archive(run).forecasts()
    measured = [f for f in forecasts if f["measured_speedup"] is not None]
    assert len(forecasts) > len(measured) > 0 and ks.Budget(run).status().used == 10
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        run.set_meta("note", "reading must not write")

    # a folder that cannot be written to (a read-only mount; the suite may run as root, so it is simulated):
    # the reader cannot make the database's shared-memory file, and reads the finished run as immutable
    real_connect = sqlite3.connect

    def no_shared_memory(target, *args, **kwargs):
        if "mode=ro" in str(target):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(target, *args, **kwargs)

    monkeypatch.setattr(rundir.sqlite3, "connect", no_shared_memory)
    monkeypatch.setattr(rundir.os, "access", lambda path, mode: False)
    view = ks.show(result.run_dir)
    assert view.budget.used == 10 and view.best.speedup == pytest.approx(result.best_speedup)


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_reading_a_run_leaves_its_folder_as_it_was(tmp_path):
    """SQLite's readers of a WAL database make its -shm and -wal files and cannot remove them; a run read with
    `show`, the Python API or as another run's prior is left with the files it had, its database unchanged."""
    import gc
    import hashlib

    import kernelscout as ks
    from kernelscout.tools.rundir import RunDir, reading

    run = tmp_path / "run"
    ks.optimize(space=str(SPACE), budget=6, run_dir=str(run), quiet=True)
    gc.collect()  # the search's own connections, as its process would at exit
    before = sorted(p.name for p in run.iterdir())
    digest = hashlib.sha256((run / "run.db").read_bytes()).hexdigest()
    assert "run.db-wal" not in before  # the search closed its database cleanly

    view = ks.show(run)
    forecasts = ks.Archive(ks.open_run(run)).forecasts()
    with reading(run / "run.db") as db:
        assert db.execute("SELECT count(*) FROM candidates").fetchone()[0] > 0
    del view, forecasts
    gc.collect()
    assert sorted(p.name for p in run.iterdir()) == before
    assert hashlib.sha256((run / "run.db").read_bytes()).hexdigest() == digest

    # a search that opened the database meanwhile keeps its files: SQLite removes them only for its last connection
    reader = RunDir(run, read_only=True)
    assert reader.get_meta("search_spec")
    writer = RunDir(run)
    writer.set_meta("note", "written while a reader was open")
    del reader
    gc.collect()
    assert (run / "run.db-wal").exists()
    assert writer.get_meta("note") == "written while a reader was open"
    writer.close()
    assert RunDir(run, read_only=True).get_meta("note") == "written while a reader was open"


def test_a_bad_argument_from_python_names_the_keyword_not_the_cli_flag(tmp_path):
    """A script gave `confirm=3, budget=3`: the error says so in its words, and a shell command in it stays a command."""
    import kernelscout as ks
    from kernelscout.agent.python_face import python_words

    with pytest.raises(ks.optimize.__globals__["OptimizeError"]) as refused:
        ks.optimize(str(EXAMPLES / "softmax"), budget=3, confirm=3, run_dir=str(tmp_path / "run"), quiet=True)
    assert str(refused.value) == "confirm=3 leaves nothing of budget=3 for the search; give 0 to 2"
    with pytest.raises(ks.optimize.__globals__["OptimizeError"], match="^max_device_s must be more than 0"):
        ks.resume(tmp_path / "run", max_device_s=-1)
    with pytest.raises(ks.optimize.__globals__["OptimizeError"], match="^solved_chance stops a search of a recorded space"):
        ks.optimize(str(EXAMPLES / "softmax"), budget=3, solved_chance=0.1, run_dir=str(tmp_path / "run"), quiet=True)
    assert not (tmp_path / "run").exists()  # refused before a folder was made

    assert python_words("--start gives a kernel file; leave --start out with --space") == \
        "start gives a kernel file; leave start out with space"
    assert python_words("--history /tmp/h: no such folder") == "history='/tmp/h': no such folder"
    assert python_words("which --budget 7 does not change; `kscout budget r --set N` does") == \
        "which budget=7 does not change; `kscout budget r --set N` does"


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_a_runs_forecasts_are_scored_from_its_path(tmp_path):
    import kernelscout as ks

    result = ks.optimize(space=str(SPACE), budget=12, run_dir=str(tmp_path / "run"), quiet=True)
    from_path = ks.check_forecasts(result.run_dir)
    assert from_path.scored > 0
    assert from_path == ks.check_forecasts(ks.Archive(ks.open_run(result.run_dir)))
    with pytest.raises(ks.show.__globals__["RunViewError"], match="does not exist"):
        ks.check_forecasts(tmp_path / "rnu")
