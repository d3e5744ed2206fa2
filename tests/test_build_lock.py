"""A C++ extension build killed in the shared compile cache (its time limit ran out) must not stall
every later build of that extension: torch's lock file stays behind, and workers polled on it until
their own limit ran out, reported as a slow build."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from torch.utils.file_baton import FileBaton

from kernelscout.sandbox import build_lock

BUILDER = textwrap.dedent("""
    import sys, time
    from torch.utils.file_baton import FileBaton
    from kernelscout.sandbox import build_lock
    build_lock.install()
    baton = FileBaton(sys.argv[1])
    assert baton.try_acquire()
    print("building", flush=True)
    time.sleep(float(sys.argv[2]))
    baton.release()
""")


@pytest.fixture
def patched(monkeypatch):
    for name in ("try_acquire", "wait", "release"):
        monkeypatch.setattr(FileBaton, name, getattr(build_lock, name))


def _builder(lock: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, lock, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "building"
    return proc


def test_a_build_killed_while_holding_the_lock_does_not_stall_the_next(patched, tmp_path):
    lock = str(tmp_path / "lock")
    proc = _builder(lock, 60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.exists(lock)  # what torch's own baton would poll on forever
    baton = FileBaton(lock)
    assert baton.try_acquire()
    baton.release()
    assert not os.path.exists(lock)


def test_a_lock_left_before_this_fix_is_taken_over_too(patched, tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")  # no owner lock beside it: nobody is building
    assert FileBaton(str(lock)).try_acquire()


def test_a_live_build_is_waited_for(patched, tmp_path):
    lock = str(tmp_path / "lock")
    proc = _builder(lock, 1.0)
    baton = FileBaton(lock)
    assert not baton.try_acquire()
    start = time.monotonic()
    baton.wait()
    assert time.monotonic() - start > 0.3 and not os.path.exists(lock)
    assert proc.wait(5) == 0


def test_a_build_that_dies_while_another_waits_says_so(patched, tmp_path):
    lock = str(tmp_path / "lock")
    proc = _builder(lock, 60)
    baton = FileBaton(lock)
    assert not baton.try_acquire()
    subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {proc.pid}"])
    with pytest.raises(build_lock.StaleBuildError, match="measure again"):
        baton.wait()
    proc.wait()
    assert FileBaton(lock).try_acquire()
