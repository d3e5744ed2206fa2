"""CPU workers are forked from a zygote that has imported torch, so a fresh worker per candidate costs a
fork, not a new interpreter; each forked worker is confined exactly as a launched one."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kernelscout.sandbox import zygote
from kernelscout.sandbox.pool import WorkerPool, WorkerProcess
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux only")

def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def status_field(pid: int, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith(name + ":"))


@pytest.fixture
def fresh_worker():
    """Start a CPU worker the way a search does, and close it afterwards."""
    started = []

    def start() -> WorkerProcess:
        worker = WorkerProcess("cpu")
        started.append(worker)
        worker.start()
        return worker

    yield start
    for worker in started:
        worker.close()


def test_each_cpu_worker_is_a_new_process_forked_from_the_same_zygote(fresh_worker):
    first, second = fresh_worker(), fresh_worker()
    assert first.forked and second.forked
    assert first.worker_pid != second.worker_pid
    # the process the supervisor watches is the zygote's child, as a launched worker's launcher is its own
    assert parent_of(first.pid) == parent_of(second.pid) != os.getpid()
    # confined as a launched worker is
    for worker in (first, second):
        assert worker.info["network"] == "isolated" and worker.info["pids"] == "isolated"
        assert worker.info["sockets"] == "UNIX sockets refused (seccomp)"


def test_a_forked_worker_holds_no_capabilities(fresh_worker):
    # Making the zygote's user namespace gave it every capability there; a worker that kept them (it is not
    # exec'd, which would drop them) could trace the zygote and so every later worker.
    worker = fresh_worker()
    assert worker.forked
    assert int(status_field(worker.worker_pid, "CapEff"), 16) == 0
    assert int(status_field(worker.worker_pid, "CapPrm"), 16) == 0
    assert status_field(worker.worker_pid, "NoNewPrivs") == "1"


def test_the_zygote_gets_no_secret_from_the_supervisors_environment(fresh_worker, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-zygote-must-not-see-this")
    zygote.close_all()  # the next worker starts a zygote under this environment
    worker = fresh_worker()
    assert worker.forked
    environ = Path(f"/proc/{parent_of(worker.pid)}/environ")
    try:
        text = environ.read_bytes()
    except PermissionError:
        pytest.skip("the zygote's environment is not readable by this user (it is not dumpable)")
    assert b"sk-test-zygote-must-not-see-this" not in text
    assert b"PATH=" in text  # it was read, and it is the scrubbed worker environment


def test_a_dead_zygote_is_replaced_by_the_next_worker(fresh_worker):
    worker = fresh_worker()
    old = parent_of(worker.pid)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker.alive and time.monotonic() < deadline:  # its workers die with it (PR_SET_PDEATHSIG)
        time.sleep(0.05)
    assert not worker.alive
    replacement = fresh_worker()
    assert replacement.forked and parent_of(replacement.pid) != old


def test_kscout_sandbox_zygote_off_launches_each_worker_as_before(fresh_worker, monkeypatch):
    monkeypatch.setenv("KSCOUT_SANDBOX_ZYGOTE", "off")
    worker = fresh_worker()
    assert not worker.forked
    assert parent_of(worker.pid) == os.getpid()
    assert worker.info["network"] == "isolated"


def test_a_search_pool_measures_each_candidate_in_a_new_forked_worker(tmp_path):
    problem, candidate = tmp_path / "problem.py", tmp_path / "candidate.py"
    problem.write_text(SMALL_PROBLEM)
    candidate.write_text(GOOD_CANDIDATE)
    seen = []
    with WorkerPool() as pool:  # retires every worker after its candidate, as a search's pool does
        acquire = pool.acquire

        def watched(device, *args, **kwargs):
            worker = acquire(device, *args, **kwargs)
            seen.append((worker.worker_pid, worker.forked))
            return worker

        pool.acquire = watched
        for _ in range(2):
            m = measure(MeasureRequest(problem=str(problem), candidate=str(candidate), device="cpu",
                                       run_dir=str(tmp_path / "run"), harness=QUICK, again=True), pool=pool)
            assert m.status == MeasureStatus.ok and m.correct, m.message
    assert len(seen) == 2 and seen[0][0] != seen[1][0]
    assert all(forked for _, forked in seen)


def test_a_referee_is_forked_only_from_a_zygote_that_has_warmed(tmp_path):
    # A referee lives as long as its pool, and the zygote warms Inductor only while none of its children is alive:
    # forked before that, it would cost every later compiled candidate the warm-up. Launched, it cost each new pool
    # (each problem of a headless run, each one-off measurement) an interpreter importing torch (about 4 s here).
    problem, candidate = tmp_path / "problem.py", tmp_path / "candidate.py"
    problem.write_text(SMALL_PROBLEM)
    candidate.write_text(GOOD_CANDIDATE)
    threads = 3  # a zygote of its own, started by this test: no other test's has this thread count

    def measured_with(pool: WorkerPool) -> WorkerProcess:
        m = measure(MeasureRequest(problem=str(problem), candidate=str(candidate), device="cpu",
                                   run_dir=str(tmp_path / "run"), harness=QUICK, again=True), pool=pool)
        assert m.status == MeasureStatus.ok and m.correct, m.message
        return pool.referee("cpu")

    with WorkerPool(threads=threads) as pool:
        assert not measured_with(pool).forked  # the zygote started with this pool's first worker: not warm yet
    deadline = time.monotonic() + 120
    while not any(z.warmed and z.alive for k, z in zygote._ZYGOTES.items() if k[0] == threads):
        assert time.monotonic() < deadline, "the zygote never said it had warmed"
        time.sleep(0.1)
    warm = next(z for k, z in zygote._ZYGOTES.items() if k[0] == threads)
    with WorkerPool(threads=threads) as pool:  # a search's next pool, or the next problem's
        referee = measured_with(pool)
        assert referee.forked and parent_of(referee.pid) == warm.proc.pid
    with WorkerPool(threads=threads, spares=False) as pool:  # a one-off measurement's: its worker too
        acquire, workers = pool.acquire, []
        pool.acquire = lambda *args, **kwargs: workers.append(acquire(*args, **kwargs)) or workers[-1]
        assert measured_with(pool).forked
        assert workers and all(worker.forked for worker in workers)


SEARCH_SUPERVISOR = '''
import sys
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.tools.measure import MeasureRequest, measure
with WorkerPool() as pool:  # a search's pool: forked workers
    measure(MeasureRequest(problem=sys.argv[1], candidate=sys.argv[2], device="cpu", run_dir=sys.argv[3],
                           harness=HarnessConfig(timeout_s=300)), pool=pool)
'''


def test_a_supervisor_killed_with_sigkill_takes_its_forked_workers_and_their_processes_along(tmp_path):
    # No handler runs on SIGKILL. The zygote reads end of file on its socket and exits; each worker's
    # sandbox dies with it (PR_SET_PDEATHSIG), and its PID namespace with everything the candidate started.
    from test_sandbox_hygiene import descendants, gone_soon, kill_if_running, marked_sleep, \
        start_until_the_candidate_hangs, with_marker

    startfile, marker = marked_sleep(tmp_path)
    supervisor = start_until_the_candidate_hangs(SEARCH_SUPERVISOR, tmp_path, startfile, marker)
    below: list[int] = []
    try:
        below = descendants(supervisor.pid)  # the zygote, the worker's sandbox, the candidate's sleep
        assert with_marker(marker) and set(with_marker(marker)) <= set(below)

        supervisor.kill()
        supervisor.wait(timeout=20)

        assert all(gone_soon(pid, within_s=10) for pid in below)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        kill_if_running(*below, *with_marker(marker))


CPP_WRAPPER = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.compiled = torch.compile(self._forward, options={"cpp_wrapper": True, "compile_threads": 1})

    def _forward(self, x, y):
        return torch.relu(x * self.scale + y) + 0.5 * x

    def forward(self, x, y):
        return self.compiled(x, y)
'''


def test_a_compiled_candidate_builds_in_a_worker_forked_after_the_zygote_warmed_inductor(tmp_path):
    # The zygote warms Inductor once its first worker is done; Inductor had then fixed its precompiled-header
    # folder inside the zygote's TMPDIR, where a worker may not write: every cpp_wrapper build failed there.
    problem, plain, compiled = tmp_path / "problem.py", tmp_path / "plain.py", tmp_path / "compiled.py"
    problem.write_text(SMALL_PROBLEM)
    plain.write_text(GOOD_CANDIDATE)
    compiled.write_text(CPP_WRAPPER)
    with WorkerPool() as pool:
        for candidate in (plain, compiled):  # the first worker's end lets the zygote warm up
            m = measure(MeasureRequest(problem=str(problem), candidate=str(candidate), device="cpu",
                                       run_dir=str(tmp_path / "run"), harness=QUICK, again=True), pool=pool)
            assert m.status == MeasureStatus.ok and m.correct, m.message
        # and its own warm-up used the shared headers too, instead of building 149 MB of them (4 s) in its folder
        folders = [z._scratch.path for z in zygote._ZYGOTES.values() if z.alive]
        assert folders
        for folder in folders:
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
            assert size < 20e6, f"{folder} holds {size / 1e6:.0f} MB"
