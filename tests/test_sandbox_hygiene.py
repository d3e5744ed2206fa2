"""Sandbox hygiene: what a candidate starts dies with its measurement, and the supervisor and the network stay out of its reach.

A candidate runs as the same user as the supervisor (the `kscout` process, which holds the user's API keys),
so on Linux it could read the supervisor's /proc/<pid>/environ, and anything it starts in a new session
escapes a process-group kill. These tests show what the sandbox does about both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelscout.sandbox.pool import WorkerPool, clean_env
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import MeasureStatus
from conftest import QUICK, SMALL_PROBLEM

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses Linux's /proc and prctl")


def candidate(init: str = "", forward: str = "") -> str:
    """A correct candidate for SMALL_PROBLEM that also runs `init` in its constructor and `forward` in each call."""
    indent = lambda code: "".join(f"        {line}\n" for line in code.strip().splitlines())  # noqa: E731
    return f'''
import json, os, subprocess, sys, time
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
{indent(init or "pass")}
    def forward(self, x, y):
{indent(forward or "pass")}
        return torch.relu(x * self.scale + y) + 0.5 * x
'''


def running(pid: int) -> bool:
    """True while `pid` is a live process (a zombie is dead, just not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in "ZX"


def gone_soon(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def kill_if_running(*pids: int) -> None:
    """Test cleanup for the processes a failing test leaves behind (each one was started by the test)."""
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


# -- secrets -----------------------------------------------------------------------------------------
def test_a_candidate_cannot_read_the_supervisors_environment_or_memory(measure_source, tmp_path):
    report = tmp_path / "proc.json"
    snoop = f'''
seen = {{}}
for name in ("environ", "mem", "maps", "auxv"):
    try:
        with open(f"/proc/{os.getpid()}/{{name}}", "rb") as f:
            f.read(64)
        seen[name] = "read"
    except OSError as exc:
        seen[name] = type(exc).__name__
with open({str(report)!r}, "w") as f:
    json.dump(seen, f)
'''
    m = measure_source(candidate(init=snoop))

    assert m.status == MeasureStatus.ok, m.message
    seen = json.loads(report.read_text())
    assert seen == {"environ": "PermissionError", "mem": "PermissionError", "maps": "PermissionError", "auxv": "PermissionError"}


def test_a_candidate_cannot_signal_the_supervisor_or_the_users_other_processes(measure_source, tmp_path):
    # Same user, so without a PID namespace a candidate could SIGSTOP or SIGKILL the supervisor, or
    # kill(-1) every process of the user's session. In its namespace those pids do not exist.
    bystander = subprocess.Popen(["sleep", "60"])
    report = tmp_path / "signals.json"
    probe = f'''
seen = {{}}
for name, pid in (("supervisor", {os.getpid()}), ("bystander", {bystander.pid})):
    try:
        os.kill(pid, 0)
        seen[name] = "reachable"
    except OSError as exc:
        seen[name] = type(exc).__name__
with open({str(report)!r}, "w") as f:
    json.dump(seen, f)
'''
    try:
        m = measure_source(candidate(init=probe))
        assert m.status == MeasureStatus.ok, m.message
        assert json.loads(report.read_text()) == {"supervisor": "ProcessLookupError", "bystander": "ProcessLookupError"}
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_kscout_sandbox_pids_shared_lets_the_same_probe_reach_the_supervisor(tmp_path, write, monkeypatch):
    # The other side of the test above, so that it can fail: no PID namespace, and the supervisor is there.
    monkeypatch.setenv("KSCOUT_SANDBOX_PIDS", "shared")
    report = tmp_path / "signals.txt"
    probe = f"os.kill({os.getpid()}, 0)\nopen({str(report)!r}, 'w').write('reachable')"
    problem, cand = write("problem.py", SMALL_PROBLEM), write("candidate.py", candidate(init=probe))
    with WorkerPool() as own:
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=own)
        with borrowed_worker(own) as worker:
            assert worker.info["pids"] == "shared (KSCOUT_SANDBOX_PIDS=shared)"
            assert worker.info["network"] == "isolated"
    assert m.status == MeasureStatus.ok, m.message
    assert report.read_text() == "reachable"


@contextlib.contextmanager
def borrowed_worker(pool: WorkerPool):
    """A warm CPU worker of `pool`, handed back afterwards."""
    worker = pool.acquire("cpu")
    try:
        yield worker
    finally:
        pool.release(worker, healthy=True)


def test_a_worker_cannot_gain_ptrace_or_admin_capabilities(pool):
    # Dropped from the bounding set after the worker's user namespace is made, since making one hands
    # the process a full capability set again; nothing exec'd later can get them back.
    with borrowed_worker(pool) as worker:
        status = Path(f"/proc/{worker.worker_pid}/status").read_text()
    bounding = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16)
    no_new_privs = next(line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs:"))
    for cap, name in ((16, "CAP_SYS_MODULE"), (17, "CAP_SYS_RAWIO"), (19, "CAP_SYS_PTRACE"), (21, "CAP_SYS_ADMIN")):
        assert not bounding & (1 << cap), f"{name} is still in the worker's bounding set"
    assert no_new_privs == "1"


# -- the network ---------------------------------------------------------------------------------
@contextlib.contextmanager
def listener():
    """A TCP server on this machine's loopback, outside any sandbox: yields its port and a function
    that says whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)

    def connected() -> bool:
        try:
            server.accept()[0].close()
            return True
        except BlockingIOError:
            return False

    try:
        yield server.getsockname()[1], connected
    finally:
        server.close()


def phone_home(port: int, report: Path) -> str:
    return f'''
import socket
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", {port}))
    outcome = "connected"
except OSError as exc:
    outcome = type(exc).__name__
open({str(report)!r}, "w").write(outcome)
'''


def test_a_candidate_cannot_reach_the_network(measure_source, pool, tmp_path):
    with borrowed_worker(pool) as worker:
        network = worker.info["network"]
    if network != "isolated":
        pytest.skip(f"this machine gives the sandbox no network namespace: the worker reports {network!r}")
    report = tmp_path / "outcome.txt"
    with listener() as (port, connected):
        m = measure_source(candidate(init=phone_home(port, report)))

        assert m.status == MeasureStatus.ok and m.correct, m.message
        assert report.read_text() != "connected"
        assert not connected()


def test_kscout_sandbox_network_allow_opens_it_again(tmp_path, write, monkeypatch):
    # For a kernel that must reach the network; also shows that the probe above would see a connection.
    monkeypatch.setenv("KSCOUT_SANDBOX_NETWORK", "allow")
    report = tmp_path / "outcome.txt"
    problem = write("problem.py", SMALL_PROBLEM)
    with listener() as (port, connected), WorkerPool() as own:
        cand = write("candidate.py", candidate(init=phone_home(port, report)))
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=own)
        with borrowed_worker(own) as worker:
            assert worker.info["network"] == "open (KSCOUT_SANDBOX_NETWORK=allow)"

        assert m.status == MeasureStatus.ok, m.message
        assert report.read_text() == "connected"
        assert connected()


# -- processes a candidate leaves behind ----------------------------------------------------------
@contextlib.contextmanager
def started_by_candidate(pidfile: Path):
    """The pid the candidate wrote; killed afterwards if the test failed before the harness did it."""
    pid = int(pidfile.read_text())
    try:
        yield pid
    finally:
        kill_if_running(pid)


def write_host_pid_then(pidfile: Path, argv: list[str]) -> str:
    """Python source that writes its pid as this test sees it (inside a PID namespace os.getpid() is
    the namespace's number; /proc is the host's), then becomes `argv` in place."""
    return (f"import os; open({str(pidfile)!r}, 'w').write(os.readlink('/proc/self')); "
            f"os.execvp({argv[0]!r}, {argv!r})")


def new_session_sleep(pidfile: Path) -> str:
    child = write_host_pid_then(pidfile, ["sleep", "60"])
    return f'''
subprocess.Popen([sys.executable, "-c", {child!r}], start_new_session=True)
while not os.path.exists({str(pidfile)!r}) or not open({str(pidfile)!r}).read():
    time.sleep(0.01)
'''


def test_a_process_started_in_a_new_session_is_killed_and_named_in_the_verdict(measure_source, tmp_path):
    m = measure_source(candidate(init=new_session_sleep(tmp_path / "sleep.pid")))
    with started_by_candidate(tmp_path / "sleep.pid") as pid:
        assert m.status == MeasureStatus.ok and m.correct, m.message
        assert not m.timing_valid
        assert "the candidate left 1 process(es) running (sleep); they were killed" in m.warnings
        assert gone_soon(pid)


def test_a_double_forked_daemon_is_killed_too(measure_source, tmp_path):
    # The middle process exits at once, so the daemon is orphaned, in a session of its own: the worker
    # (a child subreaper) adopts it, which keeps it in the worker's process tree.
    pidfile = tmp_path / "daemon.pid"
    daemon = write_host_pid_then(pidfile, ["sleep", "60"])
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {daemon!r}], start_new_session=True)"
    wait = f"while not os.path.exists({str(pidfile)!r}) or not open({str(pidfile)!r}).read():\n    time.sleep(0.01)"
    m = measure_source(candidate(init=f"subprocess.run([sys.executable, '-c', {middle!r}], check=True)\n{wait}"))
    with started_by_candidate(pidfile) as pid:
        assert m.status == MeasureStatus.ok, m.message
        assert "the candidate left 1 process(es) running (sleep); they were killed" in m.warnings
        assert gone_soon(pid)


def test_a_timed_out_candidates_processes_die_with_its_worker(measure_source, tmp_path):
    m = measure_source(candidate(init=new_session_sleep(tmp_path / "sleep.pid"), forward="while True:\n    time.sleep(0.1)"),
                       config=QUICK.model_copy(update={"timeout_s": 2.0}))
    with started_by_candidate(tmp_path / "sleep.pid") as pid:
        assert m.status == MeasureStatus.timeout, m.message
        assert gone_soon(pid)


def test_the_memory_limit_counts_processes_in_other_sessions(tmp_path, write):
    pidfile = tmp_path / "hog.pid"
    hog = (f"import os, time; open({str(pidfile)!r}, 'w').write(os.readlink('/proc/self')); b = b'x' * (400 << 20); "
           "time.sleep(60)")  # 400 MiB, written, in its own session
    start = f'''
subprocess.Popen([sys.executable, "-c", {hog!r}], start_new_session=True)
'''
    slow = "time.sleep(0.5)"  # long enough for the watchdog to look while the hog is alive
    problem, cand = write("problem.py", SMALL_PROBLEM), write("hog.py", candidate(init=start, forward=slow))
    with WorkerPool() as pool:
        worker = pool.acquire("cpu")
        worker.memory_bytes = sum(worker_rss(pid) for pid in worker.own_pids) + (200 << 20)  # 200 MiB of headroom for what the worker itself does
        pool.release(worker, healthy=True)
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=pool)
    pid = int(pidfile.read_text())
    try:
        assert m.status == MeasureStatus.runtime_error, m.message
        assert "over its limit" in m.message
        assert gone_soon(pid)
    finally:
        kill_if_running(pid)


def worker_rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the supervisor going away ------------------------------------------------------------------
SUPERVISOR = '''
import sys
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.tools.measure import MeasureRequest, measure
measure(MeasureRequest(problem=sys.argv[1], candidate=sys.argv[2], device="cpu", run_dir=sys.argv[3],
                       harness=HarnessConfig(timeout_s=300)))
'''


def test_sigterm_to_the_supervisor_kills_its_workers_and_their_processes(tmp_path, write):
    pids = tmp_path / "pids.json"
    start = new_session_sleep(tmp_path / "sleep.pid") + f'''
json.dump([int(os.readlink("/proc/self")), int(open({str(tmp_path / "sleep.pid")!r}).read())], open({str(pids)!r}, "w"))
'''
    problem, cand = write("problem.py", SMALL_PROBLEM), write("hang.py", candidate(init=start, forward="while True:\n    time.sleep(0.1)"))
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(problem), str(cand), str(tmp_path / "run")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = child = None
    try:
        deadline = time.monotonic() + 120
        while not pids.exists() or not pids.read_text():
            assert supervisor.poll() is None and time.monotonic() < deadline, "the candidate never started"
            time.sleep(0.1)
        worker, child = json.loads(pids.read_text())
        time.sleep(0.5)  # into the hanging forward()

        supervisor.send_signal(signal.SIGTERM)

        assert supervisor.wait(timeout=20) == -signal.SIGTERM, "the supervisor still dies of the signal"
        assert gone_soon(worker) and gone_soon(child)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        kill_if_running(*(p for p in (worker, child) if p))


# -- torch.compile -------------------------------------------------------------------------------
def test_torch_compile_builds_in_process_so_no_compile_pool_outlives_a_call(measure_source, tmp_path):
    report = tmp_path / "threads.txt"
    check = f'''
import torch._inductor.config
open({str(report)!r}, "w").write(str(torch._inductor.config.compile_threads))
'''
    m = measure_source(candidate(init=check))

    assert m.status == MeasureStatus.ok, m.message
    assert report.read_text() == "1"
    assert clean_env("cpu", 2, 1 << 30, tmp_path)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
