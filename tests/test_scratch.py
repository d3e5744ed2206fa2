"""Temp folders of killed workers and slots are cleaned up by the next one, never those of a live owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kernelscout.sandbox.scratch import LOCK_NAME, ScratchDir, sweep

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the sweep relies on POSIX file locks")

HOLDER = """
import sys, time
from kernelscout.sandbox.{module} import {cls}
owner = {make}
print(owner.{attr}, flush=True)
time.sleep(120)
"""


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point this process and its children at a temp dir of their own, so no other run's folders are judged."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _start_owner(module: str, cls: str, make: str, attr: str) -> tuple[subprocess.Popen, Path]:
    code = HOLDER.format(module=module, cls=cls, make=make, attr=attr)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line, "the owner process printed no folder"
    return proc, Path(line)


def test_a_killed_owners_folder_is_removed_by_the_next_one_and_a_live_owners_is_kept(private_tmp: Path) -> None:
    owner, folder = _start_owner("scratch", "ScratchDir", "ScratchDir('slot', 'local-0')", "path")
    try:
        (folder / "candidate.py").write_text("class ModelNew: ...\n")

        mine = ScratchDir("slot", "local-1")
        assert folder.is_dir(), "a live owner's folder was swept"

        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        again = ScratchDir("slot", "local-1")

        assert not folder.exists(), "a killed owner's folder was left behind"
        assert mine.path.is_dir() and again.path.is_dir(), "this process's own folders were swept"
        mine.remove()
        again.remove()
        assert not mine.path.exists() and not again.path.exists()
    finally:
        owner.kill()
        owner.wait(timeout=10)


def test_only_folders_with_an_unheld_lock_of_the_same_kind_are_swept(private_tmp: Path) -> None:
    no_lock = private_tmp / "kscout-slot-old"  # an older kernelscout's, or one being made right now
    no_lock.mkdir()
    elsewhere = private_tmp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / LOCK_NAME).write_text("")
    link = private_tmp / "kscout-slot-link"
    link.symlink_to(elsewhere, target_is_directory=True)
    other_kind = private_tmp / "kscout-worker-dead"
    other_kind.mkdir()
    (other_kind / LOCK_NAME).write_text("")  # nobody holds it

    assert sweep("slot") == []
    assert no_lock.is_dir() and elsewhere.is_dir() and link.is_symlink() and other_kind.is_dir()

    assert sweep("worker") == [other_kind]
    assert not other_kind.exists()


def test_a_sandbox_worker_left_by_a_killed_supervisor_has_its_home_removed(private_tmp: Path) -> None:
    # The worker's home holds the candidate's own temp files; a killed supervisor never ran close().
    supervisor, home = _start_owner("pool", "WorkerProcess", "WorkerProcess('cpu')", "workdir")
    try:
        assert home.is_dir() and home.name.startswith("kscout-worker-")
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=10)

        from kernelscout.sandbox.pool import WorkerProcess

        fresh = WorkerProcess("cpu")
        try:
            assert not home.exists()
        finally:
            fresh.close()
        assert not fresh.workdir.exists()
    finally:
        supervisor.kill()
        supervisor.wait(timeout=10)
