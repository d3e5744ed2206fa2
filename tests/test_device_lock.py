"""Two kernelscout processes measuring on one device take turns instead of spoiling each other's timing
(two MCP servers on one run directory measured at once: both timings void, both charged)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from kernelscout.sandbox.device_lock import device_turn
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import Measurement
from conftest import GOOD_CANDIDATE, SMALL_PROBLEM

HOLDER = textwrap.dedent("""
    import sys, time
    from kernelscout.sandbox.device_lock import device_turn
    with device_turn(sys.argv[1]):
        print("holding", flush=True)
        time.sleep(float(sys.argv[2]))
""")

PROBE = textwrap.dedent("""
    import fcntl, os, sys
    from kernelscout.sandbox.pool import CACHE_DIR
    fd = os.open(CACHE_DIR / "locks" / f"measure-{sys.argv[1]}.lock", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("free")
    except BlockingIOError:
        print("held")
""")


@pytest.fixture
def own_locks(tmp_path, monkeypatch) -> dict[str, str]:
    """This test's own lock folder, for it and the processes it starts: the machine's is taken by any test measuring
    on the CPU in the other xdist worker, which once made a released turn read as held."""
    import kernelscout.sandbox.device_lock as device_lock

    monkeypatch.setattr(device_lock, "CACHE_DIR", tmp_path / "cache")
    return {**os.environ, "KSCOUT_CACHE_DIR": str(tmp_path / "cache")}


def test_a_second_process_waits_for_the_first_to_finish_measuring(caplog, own_locks):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "cpu", "1.0"], stdout=subprocess.PIPE, text=True, env=own_locks)
    assert holder.stdout.readline().strip() == "holding"
    start = time.monotonic()
    with device_turn("cpu"):
        waited = time.monotonic() - start
    assert holder.wait(10) == 0
    assert waited > 0.5
    assert "another kscout process is measuring on cpu" in caplog.text


def test_measure_holds_the_devices_turn_while_it_runs_the_sandbox(tmp_path, write, monkeypatch, own_locks):
    import kernelscout.tools.measure as measure_tool

    seen = []

    def fake_run(pool, problem, candidate, config):  # what another process would find meanwhile
        probe = subprocess.run([sys.executable, "-c", PROBE, "cpu"], capture_output=True, text=True, timeout=60, env=own_locks)
        seen.append(probe.stdout.strip())
        return Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=1.0, runtime_ms=1.0, ref_runtime_ms=1.0)

    monkeypatch.setattr(measure_tool, "run_measurement", fake_run)
    problem, cand = write("problem.py", SMALL_PROBLEM), write("cand.py", GOOD_CANDIDATE)
    m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run")))
    assert m.status.value == "ok" and seen == ["held"]
    probe = subprocess.run([sys.executable, "-c", PROBE, "cpu"], capture_output=True, text=True, timeout=60, env=own_locks)
    assert probe.stdout.strip() == "free"  # and released afterwards
