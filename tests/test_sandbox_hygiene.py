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
from conftest import QUICK, SMALL_PROBLEM, usable_cores

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
def snoop(report: Path, bystander: int) -> str:
    """Candidate code that tries to read the supervisor's /proc entries and a bystander's environment
    (a process of the same user started with a key in it), and to signal both; writes what happened."""
    return f'''
def attempt(action):
    try:
        return action()
    except OSError as exc:
        return type(exc).__name__
seen = {{}}
for name in ("environ", "mem", "maps", "auxv"):
    seen["supervisor " + name] = attempt(lambda: open(f"/proc/{os.getpid()}/{{name}}", "rb").read(64) and "read")
seen["bystander environ"] = attempt(lambda: "read the key" if b"sk-test-123" in open("/proc/{bystander}/environ", "rb").read() else "read")
seen["signal supervisor"] = attempt(lambda: os.kill({os.getpid()}, 0) or "reachable")
seen["signal bystander"] = attempt(lambda: os.kill({bystander}, 0) or "reachable")
with open({str(report)!r}, "w") as f:
    json.dump(seen, f)
'''


def seen(supervisor_files: str, bystander_environ: str, signals: str) -> dict[str, str]:
    """What `snoop` reports when each of its attempts ends as given."""
    return {**{f"supervisor {name}": supervisor_files for name in ("environ", "mem", "maps", "auxv")},
            "bystander environ": bystander_environ, "signal supervisor": signals, "signal bystander": signals}


@contextlib.contextmanager
def bystander_with_a_key():
    """A process of this user, started with an API key in its environment (an editor, a wrapper script)."""
    proc = subprocess.Popen(["sleep", "60"], env=dict(os.environ, OPENAI_API_KEY="sk-test-123"))
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_candidate_can_neither_see_nor_signal_the_supervisor_or_the_users_other_processes(measure_source, tmp_path):
    # Same user: without namespaces a candidate could SIGSTOP or SIGKILL the supervisor, kill(-1) the
    # user's session, or read the environment of any process the user started with a key in it. In its
    # PID namespace, with a /proc of its own, none of them exists.
    report = tmp_path / "seen.json"
    with bystander_with_a_key() as bystander:
        m = measure_source(candidate(init=snoop(report, bystander)))
    assert m.status == MeasureStatus.ok, m.message
    assert json.loads(report.read_text()) == seen(supervisor_files="FileNotFoundError", bystander_environ="FileNotFoundError",
                                                  signals="ProcessLookupError")


@pytest.mark.parametrize("files", ["confined", "open"])
def test_with_kscout_sandbox_pids_shared_the_supervisor_is_protected_by_other_means(tmp_path, write, monkeypatch, files):
    # The same probe without the PID namespace. Their /proc entries stay closed: the supervisor is
    # non-dumpable, and a process in a user namespace of its own (the network namespace's) may not read
    # the environment of one outside it (checked as an unprivileged user too: readable without the user
    # namespace). Signals are stopped by Landlock's scope where the kernel has it (ABI 6+); with
    # KSCOUT_SANDBOX_FILES=open both processes are there to be signalled, so the tests can fail.
    monkeypatch.setenv("KSCOUT_SANDBOX_PIDS", "shared")
    if files == "open":
        monkeypatch.setenv("KSCOUT_SANDBOX_FILES", "open")
    report = tmp_path / "seen.json"
    problem = write("problem.py", SMALL_PROBLEM)
    with bystander_with_a_key() as bystander, WorkerPool() as own:
        cand = write("candidate.py", candidate(init=snoop(report, bystander)))
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=own)
        with borrowed_worker(own) as worker:
            assert worker.info["pids"] == "shared (KSCOUT_SANDBOX_PIDS=shared)" and worker.info["proc"] == "host"
            assert worker.info["network"] == "isolated"
            scoped = "signals and abstract sockets scoped" in worker.info["files"]  # Landlock ABI 6+
    assert m.status == MeasureStatus.ok, m.message
    # without the PID namespace, Landlock's scope (where the kernel has it) still stops the signals
    assert json.loads(report.read_text()) == seen(supervisor_files="PermissionError", bystander_environ="PermissionError",
                                                  signals="PermissionError" if scoped else "reachable")


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
            # UNIX sockets too (until the thirty-eighth session the opt-out left them refused), not the CPU mask
            assert worker.info["sockets"] in ("open (KSCOUT_SANDBOX_NETWORK=allow)", "open (no seccomp filter for " + os.uname().machine + ")")

        assert m.status == MeasureStatus.ok, m.message
        assert report.read_text() == "connected"
        assert connected()


# -- files ----------------------------------------------------------------------------------------

def forge_the_run(run_dir: Path) -> str:
    """What a cheat would do once it has found the run directory: add a table to its SQLite file (a
    forged measurement, or budget handed back, is one INSERT or DELETE away) and drop a file beside it."""
    return (f"import sqlite3\n"
            f"try:\n    c = sqlite3.connect({str(run_dir / 'run.db')!r}); c.execute('create table forged(x)'); c.commit()\n"
            f"except Exception:\n    pass\n"
            f"try:\n    open({str(run_dir / 'forged.txt')!r}, 'w').write('x')\n"
            f"except Exception:\n    pass")


def tables(db: Path) -> set[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as c:
        return {row[0] for row in c.execute("select name from sqlite_master where type='table'")}


@contextlib.contextmanager
def run_dir_outside_the_tests_folders():
    """The test folders are writable for the workers (conftest); a real run directory is not."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="kscout-run-"))
    try:
        yield path / "run"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_candidate_cannot_write_into_the_run_directory(tmp_path, write, pool):
    with borrowed_worker(pool) as worker:
        files = worker.info["files"]
    if files.startswith("open"):
        pytest.skip(f"this kernel gives the sandbox no write restriction: the worker reports {files!r}")
    problem = write("problem.py", SMALL_PROBLEM)
    with run_dir_outside_the_tests_folders() as run:
        cand = write("candidate.py", candidate(init=forge_the_run(run)))
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run), harness=QUICK), pool=pool)
        assert m.status == MeasureStatus.ok and m.correct, m.message
        assert "forged" not in tables(run / "run.db")
        assert not (run / "forged.txt").exists()


def test_kscout_sandbox_files_open_lifts_it_and_the_forgery_goes_through(tmp_path, write, monkeypatch):
    # For a kernel that must write elsewhere; also shows that the probe above would see a forgery.
    monkeypatch.setenv("KSCOUT_SANDBOX_FILES", "open")
    problem = write("problem.py", SMALL_PROBLEM)
    with run_dir_outside_the_tests_folders() as run, WorkerPool() as own:
        cand = write("candidate.py", candidate(init=forge_the_run(run)))
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run), harness=QUICK), pool=own)
        with borrowed_worker(own) as worker:
            assert worker.info["files"] == "open (KSCOUT_SANDBOX_FILES=open)"
        assert m.status == MeasureStatus.ok, m.message
        assert "forged" in tables(run / "run.db")
        assert (run / "forged.txt").exists()


# -- processes a candidate leaves behind ----------------------------------------------------------
def with_marker(marker: str) -> list[int]:
    """Live processes on this machine whose command line holds `marker`. A candidate runs in a PID
    namespace with a /proc of its own, so it cannot tell this test the pids of what it starts: the test
    finds them by an argument only they have."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes() and running(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def all_gone_soon(marker: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not with_marker(marker)


@contextlib.contextmanager
def started_by_candidate(startfile: Path, marker: str):
    """Checks that the candidate's process did start; kills it afterwards if the test failed before the harness did."""
    try:
        assert startfile.exists(), "the candidate's process never started"
        yield
    finally:
        kill_if_running(*with_marker(marker))


def announce_then(startfile: Path, argv: list[str]) -> str:
    """Python source that creates `startfile`, then becomes `argv` in place (same process)."""
    return f"import os; open({str(startfile)!r}, 'w').write('started'); os.execvp({argv[0]!r}, {argv!r})"


def wait_for(startfile: Path) -> str:
    return f"while not os.path.exists({str(startfile)!r}):\n    time.sleep(0.01)\n"


def marked_sleep(tmp_path: Path) -> tuple[Path, str]:
    """A start file and a `sleep` argument no other process has (GNU sleep takes fractions)."""
    return tmp_path / "sleep.started", f"60.{time.time_ns() % 10**9:09d}"


def new_session_sleep(startfile: Path, marker: str) -> str:
    child = announce_then(startfile, ["sleep", marker])
    return f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)\n" + wait_for(startfile)


def test_a_process_started_in_a_new_session_is_killed_and_named_in_the_verdict(measure_source, tmp_path):
    startfile, marker = marked_sleep(tmp_path)
    m = measure_source(candidate(init=new_session_sleep(startfile, marker)))
    with started_by_candidate(startfile, marker):
        assert m.status == MeasureStatus.ok and m.correct, m.message
        assert not m.timing_valid
        assert "the candidate left 1 process(es) running (sleep); they were killed" in m.warnings
        assert all_gone_soon(marker)


def test_a_double_forked_daemon_is_killed_too(measure_source, tmp_path):
    # The middle process exits at once, so the daemon is orphaned, in a session of its own: the worker
    # (a child subreaper) adopts it, which keeps it in the worker's process tree.
    startfile, marker = marked_sleep(tmp_path)
    daemon = announce_then(startfile, ["sleep", marker])
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {daemon!r}], start_new_session=True)"
    m = measure_source(candidate(init=f"subprocess.run([sys.executable, '-c', {middle!r}], check=True)\n" + wait_for(startfile)))
    with started_by_candidate(startfile, marker):
        assert m.status == MeasureStatus.ok, m.message
        assert "the candidate left 1 process(es) running (sleep); they were killed" in m.warnings
        assert all_gone_soon(marker)


def test_a_timed_out_candidates_processes_die_with_its_worker(measure_source, tmp_path):
    startfile, marker = marked_sleep(tmp_path)
    m = measure_source(candidate(init=new_session_sleep(startfile, marker), forward="while True:\n    time.sleep(0.1)"),
                       config=QUICK.model_copy(update={"timeout_s": 2.0}))
    with started_by_candidate(startfile, marker):
        assert m.status == MeasureStatus.timeout, m.message
        assert all_gone_soon(marker)


def test_the_memory_limit_counts_processes_in_other_sessions(tmp_path, write):
    startfile, marker = tmp_path / "hog.started", f"hog-{time.time_ns()}"
    hog = (f"import os, time; open({str(startfile)!r}, 'w').write('started'); b = b'x' * (400 << 20); "
           f"time.sleep(60)  # {marker}")  # 400 MiB, written, in its own session
    start = f"subprocess.Popen([sys.executable, '-c', {hog!r}], start_new_session=True)\n" + wait_for(startfile)
    slow = "time.sleep(0.5)"  # long enough for the watchdog to look while the hog is alive
    problem, cand = write("problem.py", SMALL_PROBLEM), write("hog.py", candidate(init=start, forward=slow))
    with WorkerPool() as pool:
        worker = pool.acquire("cpu")
        worker.memory_bytes = sum(worker_rss(pid) for pid in worker.own_pids) + (200 << 20)  # 200 MiB of headroom for what the worker itself does
        pool.release(worker, healthy=True)
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=pool)
    with started_by_candidate(startfile, marker):
        assert m.status == MeasureStatus.runtime_error, m.message
        assert "over its limit" in m.message
        assert all_gone_soon(marker)


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


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` on this machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in table.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def start_until_the_candidate_hangs(script: str, tmp_path: Path, startfile: Path, marker: str) -> subprocess.Popen:
    """Run `script` as a supervisor measuring a candidate that starts a `sleep marker` in a new session and
    then hangs in forward(); return once it hangs."""
    problem, cand = tmp_path / "problem.py", tmp_path / "hang.py"
    problem.write_text(SMALL_PROBLEM)
    cand.write_text(candidate(init=new_session_sleep(startfile, marker), forward="while True:\n    time.sleep(0.1)"))
    supervisor = subprocess.Popen([sys.executable, "-c", script, str(problem), str(cand), str(tmp_path / "run")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not startfile.exists():
        if supervisor.poll() is not None or time.monotonic() > deadline:
            supervisor.kill()
            raise AssertionError("the candidate never started")
        time.sleep(0.1)
    time.sleep(0.5)  # into the hanging forward()
    return supervisor


def test_sigterm_to_the_supervisor_kills_its_workers_and_their_processes(tmp_path):
    startfile, marker = marked_sleep(tmp_path)
    supervisor = start_until_the_candidate_hangs(SUPERVISOR, tmp_path, startfile, marker)
    below: list[int] = []
    try:
        below = descendants(supervisor.pid)  # the sandbox's processes, the worker and the candidate's sleep
        assert with_marker(marker) and set(with_marker(marker)) <= set(below)

        supervisor.send_signal(signal.SIGTERM)

        assert supervisor.wait(timeout=20) == -signal.SIGTERM, "the supervisor still dies of the signal"
        assert all(gone_soon(pid) for pid in below)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        kill_if_running(*below, *with_marker(marker))


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


def test_a_system_that_refuses_the_namespaces_is_warned_about_once(monkeypatch, caplog):
    from kernelscout.sandbox import pool as pool_module

    monkeypatch.setattr(pool_module, "_WARNED_NAMESPACES", False)
    with caplog.at_level("WARNING", logger="kernelscout.sandbox.pool"):
        pool_module._warn_if_namespaces_refused("isolated", "isolated")
        pool_module._warn_if_namespaces_refused("open (no network namespace: Operation not permitted)",
                                          "shared (no PID namespace: Operation not permitted)")
        pool_module._warn_if_namespaces_refused("open (no network namespace: Operation not permitted)",
                                          "shared (no PID namespace: Operation not permitted)")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "reach the network and the user's other processes" in warnings[0] and "Operation not permitted" in warnings[0]


def test_a_kernel_without_landlock_is_warned_about_once_and_an_opt_out_is_not(monkeypatch, caplog):
    from kernelscout.sandbox import pool as pool_module

    monkeypatch.setattr(pool_module, "_WARNED_FILES", False)
    with caplog.at_level("WARNING", logger="kernelscout.sandbox.pool"):
        pool_module._warn_if_writes_unconfined("writes only below /w, /c, /dev (Landlock ABI 7)")
        pool_module._warn_if_writes_unconfined("open (KSCOUT_SANDBOX_FILES=open)")
        assert not caplog.records
        pool_module._warn_if_writes_unconfined("open (no Landlock: Function not implemented)")
        pool_module._warn_if_writes_unconfined("open (no Landlock: Function not implemented)")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "the run directory included" in warnings[0] and "Function not implemented" in warnings[0]


def test_workers_share_inductors_precompiled_headers_through_the_cache(tmp_path, monkeypatch):
    # Inductor keeps them under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says, and each worker has a TMPDIR of
    # its own: without the link every worker rebuilt 147 MB of headers before its first compiled CPU candidate.
    import kernelscout.sandbox.pool as pool

    monkeypatch.setattr(pool, "CACHE_DIR", tmp_path / "cache")
    homes = [tmp_path / "worker-a", tmp_path / "worker-b"]
    seen = []
    for home in homes:
        home.mkdir()
        env = clean_env("cpu", 1, 0, home)
        pool.share_precompiled_headers(home, env)
        probe = "import os, torch._inductor.codecache as c; print(os.path.realpath(c._HEADER_DIR))"
        out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=home, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(out.stdout.strip())

    assert seen == [str((tmp_path / "cache" / "inductor_precompiled_headers").resolve())] * 2


HIJACKER = '''
import sys
import torch
import torch.nn as nn
from kernelscout.sandbox import protocol

_taken = []

def _serve():
    if _taken:  # the real handlers call forward too, from inside this loop
        return
    _taken.append(True)
    frame = sys._getframe()
    while frame and not {"handlers", "cmd_fd", "res_fd", "msg"} <= set(frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return
    loop = frame.f_locals
    msg = loop["msg"]
    reply = {"status": "ok", "trials": len(msg.get("seeds", [])), "max_abs_diff": 0.0, "max_rel_diff": 0.0}
    while True:  # answer the supervisor in the worker's place: every check passes
        reply["nonce"] = msg.get("nonce")
        protocol.send(loop["res_fd"], reply)
        msg = protocol.recv(loop["cmd_fd"])
        if msg["cmd"] == "check":
            reply = {"status": "ok", "trials": len(msg["seeds"]), "max_abs_diff": 0.0, "max_rel_diff": 0.0}
        elif msg["cmd"] == "verify":
            reply = {"status": "ok", "rechecked": True}
        else:
            try:
                reply = loop["handlers"][msg["cmd"]](msg)
            except Exception as exc:
                reply = {"status": getattr(exc, "status", "crashed"), "message": str(exc)}
            reply.pop("unfair", None)
            reply.pop("thread_leak", None)

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
    def forward(self, x, y):
        _serve()
        return torch.zeros_like(x)
'''


def test_a_candidate_that_takes_over_its_worker_cannot_speak_for_the_next_candidate(tmp_path, write):
    """The candidate shares its worker's process, so it can take the command channel over and answer
    the supervisor itself (what it reports about itself is in docs/harness_hardening.md). A worker is
    therefore never used for a second candidate: a plainly wrong one measured next is still found wrong."""
    problem = write("problem.py", SMALL_PROBLEM)
    wrong = candidate().replace("return torch.relu(x * self.scale + y) + 0.5 * x", "return torch.zeros_like(x)")
    with WorkerPool() as own:  # as every search's (the suite's shared pool keeps workers warm)
        for name, source in (("hijacker.py", HIJACKER), ("wrong.py", wrong)):
            m = measure(MeasureRequest(problem=str(problem), candidate=str(write(name, source)), device="cpu",
                                       run_dir=str(tmp_path / "run"), harness=QUICK), pool=own)
    assert m.status == MeasureStatus.incorrect, m.message


@pytest.mark.multicore
def test_a_pool_that_reuses_workers_retires_one_a_candidate_may_have_changed_and_an_old_one(tmp_path, write):
    """The suite's shared pool reuses workers to save time; one whose candidate's timing was voided or drew a
    warning may hold process-wide state the candidate left (a later honest candidate's reference then ran
    1.58x slower there than in the referee), and an old one drifts, so neither is used again."""
    class Watched(WorkerPool):
        pids: list[int] = []

        def acquire(self, device, start_timeout=120.0):
            worker = super().acquire(device, start_timeout)
            self.pids.append(worker.pid)
            return worker

    problem = write("problem.py", SMALL_PROBLEM)
    one_thread = "import torch\ntorch.set_num_threads(1)\n" + candidate()  # put back and warned about
    sources = [candidate(), one_thread, candidate(), candidate(), candidate()]
    with Watched(candidates_per_worker=2) as own:
        verdicts = [measure(MeasureRequest(problem=str(problem), candidate=str(write(f"c{i}.py", source)), device="cpu",
                                           run_dir=str(tmp_path / f"run{i}"), harness=QUICK), pool=own)
                    for i, source in enumerate(sources)]
    if usable_cores() > 1:  # on one core (as under pytest -n) one thread is no change
        assert any("changed how many cores" in w for w in verdicts[1].warnings), verdicts[1]
    runs_on_worker = 1
    for before, pid_before, pid in zip(verdicts, own.pids, own.pids[1:]):
        changed = before.timing_voided or before.warnings or before.status in (MeasureStatus.runtime_error, MeasureStatus.crashed)
        assert (pid == pid_before) == (not changed and runs_on_worker < 2), (before.message, own.pids)
        runs_on_worker = runs_on_worker + 1 if pid == pid_before else 1
    assert own.pids[2] != own.pids[1]  # never after the one that changed a setting


# -- what a candidate may read and reach --------------------------------------------------------
def probe(lines: str) -> str:
    """A correct candidate whose constructor runs `lines` and reports what they found in its error
    message: a KeyError carrying the report, so the test reads it from the verdict."""
    return candidate(init=lines + "\nraise KeyError('REPORT ' + report)")


def _probe_in_a_new_pool(tmp_path, write, lines: str):
    """The verdict on a probe running `lines`, from workers started now (what they may read is fixed when they
    start, from HOME, the working folder and XDG_CONFIG_HOME as the test set them); a skip where the kernel gives
    the sandbox no read restriction."""
    with WorkerPool(spares=False) as own:
        with borrowed_worker(own) as worker:
            if "no reads in the home folder" not in worker.info["files"]:
                pytest.skip(f"this kernel gives the sandbox no read restriction: {worker.info['files']!r}")
        return measure(MeasureRequest(problem=str(write("problem.py", SMALL_PROBLEM)), candidate=str(write("c.py", probe(lines))),
                                      device="cpu", run_dir=str(tmp_path / "run"), harness=QUICK), pool=own)


def test_a_candidate_cannot_read_the_users_home_folder(tmp_path, write, monkeypatch):
    # The environment is scrubbed of keys; files in home were not, until reads there were confined.
    # Python, the import path and the caches stay readable, so a candidate still imports and runs.
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="kscout-home-"))  # outside the folders the tests let workers write
    try:
        (home / ".config" / "kscout").mkdir(parents=True)
        secret = home / ".config" / "kscout" / "config.toml"
        secret.write_text('[llm]\napi_key = "sk-SECRET-FROM-HOME"\n')
        monkeypatch.setenv("HOME", str(home))
        lines = (f"try:\n    report = open({str(secret)!r}).read()\nexcept OSError as exc:\n    report = type(exc).__name__\n"
                 f"report += ' ' + str(os.path.exists({str(home)!r}))")
        m = _probe_in_a_new_pool(tmp_path, write, lines)
        assert "REPORT PermissionError True" in m.message, m.message
        assert "SECRET" not in m.message
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_candidate_cannot_read_the_project_folder_kscout_was_started_in(tmp_path, write, monkeypatch):
    # ./kscout.toml may hold an API key (agent/llm_config.py reads it there), and projects often live outside home
    # (/work, /scratch, /data). A red-team candidate read it and raised it into its verdict.
    import shutil
    import tempfile

    project = Path(tempfile.mkdtemp(prefix="kscout-project-"))  # outside home and the folders workers may write
    config = Path(tempfile.mkdtemp(prefix="kscout-xdg-"))
    try:
        (project / "kscout.toml").write_text('[llm]\napi_key = "sk-SECRET-IN-PROJECT"\n')
        (config / "kscout").mkdir()
        (config / "kscout" / "config.toml").write_text('[llm]\napi_key = "sk-SECRET-IN-XDG"\n')
        monkeypatch.chdir(project)
        monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
        lines = ("report = ''\n"
                 f"for path in ({str(project / 'kscout.toml')!r}, {str(config / 'kscout' / 'config.toml')!r}):\n"
                 "    try:\n        report += open(path).read()\n    except OSError as exc:\n        report += type(exc).__name__ + ' '\n")
        m = _probe_in_a_new_pool(tmp_path, write, lines)
        assert "REPORT PermissionError PermissionError" in m.message, m.message
        assert "SECRET" not in m.message
    finally:
        shutil.rmtree(project, ignore_errors=True)
        shutil.rmtree(config, ignore_errors=True)


def test_the_private_folders_leave_python_and_the_package_readable(monkeypatch, tmp_path):
    from kernelscout.sandbox import pool as sandbox_pool

    project = tmp_path / "project"
    (project / ".venv").mkdir(parents=True)
    monkeypatch.chdir(project)
    monkeypatch.setattr(sandbox_pool.sys, "path", [*sandbox_pool.sys.path, str(project), str(project / ".venv")])
    readable = sandbox_pool.readable_paths()
    assert project.resolve() in sandbox_pool.private_folders()
    assert str(project.resolve()) not in readable  # an import-path entry that is the working folder opens nothing
    assert str((project / ".venv").resolve()) in readable  # one inside it is allowed on its own
    assert any(Path(sys.prefix).resolve().is_relative_to(p) for p in map(Path, readable)), "Python itself stays readable"
    # a working folder inside what the worker needs to read (here: this package's own folder) cannot be hidden
    import kernelscout.sandbox

    monkeypatch.chdir(kernelscout.sandbox.__path__[0])
    assert Path(kernelscout.sandbox.__path__[0]).resolve() not in sandbox_pool.private_folders()


def test_a_candidate_writes_only_harmless_device_files_and_the_compile_caches(tmp_path, write, pool):
    from kernelscout.sandbox.pool import CACHE_DIR

    lines = f"""report = ''
for path in ('/dev/null', {str(CACHE_DIR / 'inductor' / 'probe.txt')!r}, '/dev/kmsg', '/dev/tty1', {str(CACHE_DIR / 'cpu_peaks.json')!r}):
    try:
        open(path, 'a').close()
        report += ' w'
    except OSError as exc:
        report += ' ' + ('x' if os.path.exists(path) or 'cpu_peaks' in path else '-')
"""
    with borrowed_worker(pool) as worker:
        if worker.info["files"].startswith("open"):
            pytest.skip(f"this kernel gives the sandbox no write restriction: {worker.info['files']!r}")
    peaks_before = (CACHE_DIR / "cpu_peaks.json").read_bytes() if (CACHE_DIR / "cpu_peaks.json").exists() else None
    m = measure(MeasureRequest(problem=str(write("problem.py", SMALL_PROBLEM)), candidate=str(write("c.py", probe(lines))),
                               device="cpu", run_dir=str(tmp_path / "run"), harness=QUICK), pool=pool)
    report = m.message.split("REPORT", 1)[1].split("'")[0].split()
    # /dev/null and a compile cache yes; a kernel log, a terminal (where they exist) and the file of
    # measured CPU peaks the speed-of-light bounds read, no ('-': the device is absent here)
    assert report[:2] == ["w", "w"] and "w" not in report[2:], m.message
    after = (CACHE_DIR / "cpu_peaks.json").read_bytes() if (CACHE_DIR / "cpu_peaks.json").exists() else None
    assert after == peaks_before


def _probe_under_seccomp(pool, write, tmp_path, lines: str, field: str, says: str) -> str:
    """The verdict's message for a probe candidate running `lines`, or a skip where the worker's hello shows
    no seccomp filter (its `field` does not mention `says`)."""
    with borrowed_worker(pool) as worker:
        if says not in worker.info.get(field, ""):
            pytest.skip(f"no seccomp filter here: {worker.info.get(field)!r}")
    m = measure(MeasureRequest(problem=str(write("problem.py", SMALL_PROBLEM)), candidate=str(write("c.py", probe(lines))),
                               device="cpu", run_dir=str(tmp_path / "run"), harness=QUICK), pool=pool)
    return m.message


def test_a_candidate_cannot_reach_a_unix_socket_on_disk(tmp_path, write, pool):
    # The network namespace cuts TCP; a socket file (an ssh-agent's, docker.sock) is reached by path.
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="kscout-sock-"))
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(folder / "agent.sock"))
        server.listen(1)
        lines = (f"import socket\ntry:\n    socket.socket(socket.AF_UNIX).connect({str(folder / 'agent.sock')!r})\n    report = 'connected'\n"
                 "except OSError as exc:\n    report = type(exc).__name__")
        message = _probe_under_seccomp(pool, write, tmp_path, lines, "sockets", "UNIX sockets refused")
        assert "REPORT PermissionError" in message, message
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_workers_slot_pins_it_to_its_own_cores_and_its_candidate_cannot_widen_them(tmp_path, write):
    # `--workers 2` on two cores gives each slot one thread. Capped but not pinned, a candidate could
    # raise its thread count inside its call and take the other slot's core, while the reference it is
    # compared with had one. Pinned before candidate code runs, with the mask fixed (seccomp), it cannot.
    from kernelscout.agent.dispatch import cpu_shares

    cores = sorted(os.sched_getaffinity(0))
    assert cpu_shares(2, max(1, len(cores) // 2))[0] == tuple(cores[: max(1, len(cores) // 2)])
    lines = ("mask = sorted(os.sched_getaffinity(0))\n"
             "try:\n    os.sched_setaffinity(0, set(range(os.cpu_count())))\n    widened = 'widened'\n"
             "except OSError as exc:\n    widened = type(exc).__name__\n"
             "report = ','.join(map(str, mask)) + ' ' + widened")
    with WorkerPool(spares=False, threads=1, cpus=(cores[-1],)) as own:
        with borrowed_worker(own) as worker:
            if not worker.info["cpus"].endswith("fixed (seccomp)"):
                pytest.skip(f"no seccomp filter here: {worker.info['cpus']!r}")
            assert worker.info["cpus"] == f"cores {cores[-1]}; fixed (seccomp)"
        m = measure(MeasureRequest(problem=str(write("problem.py", SMALL_PROBLEM)), candidate=str(write("c.py", probe(lines))),
                                   device="cpu", run_dir=str(tmp_path / "run"), harness=QUICK), pool=own)
    assert f"REPORT {cores[-1]} PermissionError" in m.message, m.message


def test_a_candidate_cannot_open_a_userfaultfd(tmp_path, write, pool):
    # With userfaultfd a candidate could hand back outputs whose pages fill in only when they are read:
    # by the output check, on a thread of its own, outside every timed call. No kernel needs it.
    import platform

    number = {"x86_64": 323, "aarch64": 282}.get(platform.machine())
    if number is None:
        pytest.skip(f"no userfaultfd number known for {platform.machine()}")
    lines = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"fd = libc.syscall({number}, 1 | os.O_CLOEXEC)  # UFFD_USER_MODE_ONLY: allowed unprivileged since Linux 5.11\n"
             "report = 'opened' if fd >= 0 else os.strerror(ctypes.get_errno())")
    message = _probe_under_seccomp(pool, write, tmp_path, lines, "cpus", "seccomp")
    assert f"REPORT {os.strerror(1)}" in message, message
