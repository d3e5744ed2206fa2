"""The referee: a second worker, which never loads candidate code, judges what the candidate's own worker reports.

A candidate shares its worker's process, so it can take the worker's command channel over and answer
the supervisor itself (docs/harness_hardening.md). These candidates do exactly that, and the referee
still finds them out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernelscout.sandbox import referee
from kernelscout.sandbox.pool import WorkerPool, WorkerProcess
from kernelscout.sandbox.stats import slowed_beside_the_candidate
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import MeasureStatus
from conftest import QUICK, SMALL_PROBLEM

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses Linux's /proc")


def hijacker(forward: str, slow_reference_ms: float = 0.0, emit: str = "", only_second: bool = False) -> str:
    """A candidate that, at its first call, finds the worker's command loop up its stack and answers the
    supervisor from then on: every check inside its worker passes; other commands go to the real
    handlers, with the reference's calls made `slow_reference_ms` slower (and reported as such), and
    the referee's `emit` request answered by `emit` (code that sets `reply`) when given. `only_second`: only the calls that come second in their round are slowed, the reference's eightfold and
    the candidate's sixfold, so that neither side looks slowed by coming after the other."""
    emit_branch = f'''
        elif msg["cmd"] == "emit":
{textwrap.indent(textwrap.dedent(emit), " " * 12)}''' if emit else ""
    return f'''
import sys, time
import torch
import torch.nn as nn
from kernelscout.sandbox import protocol
from kernelscout.sandbox.worker import sample, tensors_in

_taken = []
_position = [0]

def _serve():
    if _taken:
        return
    _taken.append(time.monotonic())
    frame = sys._getframe()
    while frame and not {{"handlers", "cmd_fd", "res_fd", "msg"}} <= set(frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return
    loop = frame.f_locals
    msg = loop["msg"]
    reply = {{"status": "ok", "trials": len(msg.get("seeds", [])), "max_abs_diff": 0.0, "max_rel_diff": 0.0}}
    while True:
        reply["nonce"] = msg.get("nonce")
        protocol.send(loop["res_fd"], reply)
        msg = protocol.recv(loop["cmd_fd"])
        if msg["cmd"] == "check":
            reply = {{"status": "ok", "trials": len(msg["seeds"]), "max_abs_diff": 0.0, "max_rel_diff": 0.0}}
        elif msg["cmd"] == "verify":
            # what the supervisor compares with what it kept of the round, read back as the real worker would
            worker, keys = loop["handlers"]["verify"].__self__, msg.get("keys") or {{}}
            outputs = {{"cand": worker.round["out"]["cand"], "ref": worker._run_reference([t.clone() for t in worker.round["inputs"]])}}
            samples = {{side: sample(outputs[side], key) for side, key in keys.items()}}
            if "ref" in keys:
                samples["inputs"] = sample(tensors_in(worker.round["inputs"]), keys["ref"])
            reply = {{"status": "ok", "rechecked": True, "samples": samples}}{emit_branch}
        else:
            _position[0] = 0 if msg["cmd"] == "prep" else _position[0] + (msg["cmd"] == "call")
            slow = 0.0
            if msg["cmd"] == "call" and msg.get("side") == "ref" and not {only_second}:
                slow = {slow_reference_ms}
                time.sleep(slow / 1e3)
            try:
                reply = loop["handlers"][msg["cmd"]](msg)
            except Exception as exc:
                reply = {{"status": getattr(exc, "status", "crashed"), "message": str(exc)}}
            if {only_second} and msg["cmd"] == "call" and _position[0] == 2 and "timer_ms" in reply:
                # 8x the reference's own time, 6x the candidate's: the after-the-other check sees both alike
                slow = reply["timer_ms"] * (7 if msg.get("side") == "ref" else 5)
                time.sleep(slow / 1e3)
            if slow and "timer_ms" in reply:
                reply["timer_ms"] += slow
                reply["host_ms"] += slow
            for key in ("unfair", "thread_leak", "disturbed", "queued_ms"):
                reply.pop(key, None)

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x, y):
        _serve()
        return {forward}
'''


def measured(tmp_path: Path, source: str, pool: WorkerPool, harness=QUICK):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "problem.py").write_text(SMALL_PROBLEM)
    (tmp_path / "candidate.py").write_text(source)
    return measure(MeasureRequest(problem=str(tmp_path / "problem.py"), candidate=str(tmp_path / "candidate.py"), device="cpu",
                                  run_dir=str(tmp_path / "run"), harness=harness), pool=pool)


REFEREE_FINDING = "alone in a worker that never loaded it"


def voided_by_the_referee(tmp_path: Path, source: str, attempts: int = 3):
    """Measure a cheat until the referee is the one that voids its timing. Every attempt must void it; on a
    loaded moment a check that runs before the referee (the wall clock against the per-call timer) can void
    it first, and the referee, which compares only timings still valid, then has nothing to judge: that
    attempt says nothing about the referee, so the cheat is measured again (a fresh run folder each time). So is
    an attempt whose timing stands at no speedup: the cheat did not take hold (seen once in 2026-12-05's suite, 0.84x),
    and a cheat that gains nothing is no fake speedup to void."""
    for attempt in range(attempts):
        with WorkerPool() as own:
            m = measured(tmp_path / f"attempt{attempt}", source, own)
        assert m.status == MeasureStatus.ok and m.correct, m.message
        if m.timing_valid and m.speedup is not None and m.speedup < 1.0:
            continue
        assert m.timing_valid is False, m.message
        if REFEREE_FINDING in m.timing_invalid_reason:
            return m
    raise AssertionError(f"the referee never judged the cheat in {attempts} attempts; last: {m.timing_invalid_reason or m.message}")


HONEST = "torch.relu(x * self.scale + y) + 0.5 * x"
HONEST_CANDIDATE = f'''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x, y):
        return {HONEST}
'''
# the fingerprint of the inputs the worker would have made for the referee's seed, as the real `emit` reports it
_FINGERPRINT = '''
from kernelscout.sandbox import correctness
_worker = loop["handlers"]["emit"].__self__
_made = correctness.fingerprint([t for t in _worker._make_inputs(_worker.problem, msg["seed"], _worker.problem_path)])
'''
ZEROS_WITH_BAD_NAMES = _FINGERPRINT + '''
torch.save({"structure": ("tensor",), "paths": [1], "tensors": [torch.zeros(256, 512)]}, msg["path"])
reply = {"status": "ok", "inputs": _made}
'''
# spend the measurement's whole time in `emit`, then hand over zeros: the referee used to inherit no time and time out
ZEROS_AT_THE_DEADLINE = _FINGERPRINT + '''
time.sleep(max(0.0, _taken[0] + 8.0 - 0.3 - time.monotonic()))
torch.save({"structure": ("tensor",), "paths": [(0,)], "tensors": [torch.zeros(256, 512)]}, msg["path"])
reply = {"status": "ok", "inputs": _made}
'''


@linux_only
@pytest.mark.parametrize("emit, timeout_s", [(ZEROS_WITH_BAD_NAMES, 20.0), (ZEROS_AT_THE_DEADLINE, 8.0)],
                         ids=["an output file the judge chokes on", "no time left for the referee"])
def test_a_hijacker_cannot_make_the_referee_fail_to_skip_its_checks(tmp_path, emit, timeout_s):
    # found by a red-team pass: either one left only a warning, and zeros passed as correct at 7x to 9x
    with WorkerPool() as own:
        m = measured(tmp_path, hijacker("torch.zeros_like(x)", emit=emit), own, QUICK.model_copy(update={"timeout_s": timeout_s}))
    assert m.status == MeasureStatus.incorrect, m.message
    assert "second worker that never loaded the candidate" in m.message


@linux_only
def test_a_reference_slowed_only_where_it_comes_second_is_still_compared(tmp_path):
    # a second red-team pass: with the referee comparing only the rounds where the reference came first,
    # slowing the others (and the candidate's second calls, to pass the after-the-other check) read 7x valid
    voided_by_the_referee(tmp_path, hijacker(HONEST, only_second=True))


@linux_only
def test_a_reference_slowed_so_much_that_few_rounds_are_timed_is_still_compared(tmp_path):
    # a red-team pass slowed each reference call by 2 s: too few rounds where it came first, and the
    # comparison was skipped (470x, valid); all of the reference's rounds are compared then
    m = voided_by_the_referee(tmp_path, hijacker(HONEST, slow_reference_ms=400.0))
    assert m.speedup > 5, m.message


@linux_only
def test_a_candidate_that_answers_for_its_worker_is_still_found_wrong(tmp_path):
    with WorkerPool() as own:
        m = measured(tmp_path, hijacker("torch.zeros_like(x)"), own)
    assert m.status == MeasureStatus.incorrect, m.message
    assert "second worker that never loaded the candidate" in m.message


@linux_only
def test_a_reference_slowed_by_a_candidate_that_answers_for_its_worker_voids_the_timing(tmp_path):
    m = voided_by_the_referee(tmp_path, hijacker(HONEST, slow_reference_ms=30.0))
    assert m.speedup and m.speedup > 5  # what the candidate's worker reported


def test_an_honest_candidate_gets_the_referees_checks_and_keeps_its_timing(measure_source):
    m = measure_source(HONEST_CANDIDATE)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert any("judged by a second worker" in c for c in m.checks), m.checks
    assert not any("second worker" in w for w in m.warnings), m.warnings


def test_the_reference_is_slowed_only_when_its_times_beside_and_alone_are_apart():
    alone = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03]
    assert slowed_beside_the_candidate([1.05, 1.1, 1.0, 1.08, 1.02], alone) is None  # machine noise
    assert slowed_beside_the_candidate([1.43, 1.45, 1.4, 1.44, 1.42], alone) is None  # seen beside an honest kernel
    assert slowed_beside_the_candidate([1.7, 1.8, 1.75, 1.65, 1.72], alone)  # 1.7x
    # medians, not spreads: a hijacker slowed 11 calls in 20, so that the middle halves overlapped (5x passed)
    assert slowed_beside_the_candidate([1.0] * 9 + [5.0] * 11, alone)
    assert slowed_beside_the_candidate([1.5, 1.6], alone[:2]) is None  # too few alone to tell
    # tiny kernels: 50 microseconds of difference are the worker's own cost, not a cheat
    assert slowed_beside_the_candidate([0.148, 0.15, 0.147], [0.104, 0.105, 0.103]) is None
    assert slowed_beside_the_candidate([0.25, 0.26, 0.25], [0.104, 0.105, 0.103])


def test_a_reference_crowded_off_its_cpu_while_timed_alone_is_a_busy_machine_not_a_failure():
    """A machine that grew busy between the candidate's timing and the referee's: the search must read the
    busy machine's words, to wait and time the candidate again."""
    from kernelscout.sandbox.stats import BUSY_REASON
    from kernelscout.tools.schema import Measurement

    def measured():
        return Measurement(status=MeasureStatus.ok, correct=True, speedup=2.0, timing_valid=True, message="ok")

    crowded = measured()
    referee._compare_reference(crowded, [1.0] * 20, lambda: ([], 40))  # every round alone left out
    assert not crowded.timing_valid
    assert crowded.timing_invalid_reason.startswith(BUSY_REASON)
    assert "timed the reference alone" in crowded.timing_invalid_reason and "Measure again when the machine is idle" in crowded.message
    short = measured()
    referee._compare_reference(short, [1.0] * 20, lambda: ([1.0, 1.0], 0))  # quiet, yet too few rounds: not the machine
    assert not short.timing_valid and not short.timing_invalid_reason.startswith(BUSY_REASON)
    quiet = measured()
    referee._compare_reference(quiet, [1.0] * 20, lambda: ([1.0] * 10, 2))
    assert quiet.timing_valid and quiet.reference_alone_ms == 1.0


@linux_only
@pytest.mark.parametrize("make, why", [
    (lambda p: p.symlink_to("/etc/hostname"), "as a plain file"),
    (lambda p: os.mkfifo(p), "as a plain file"),
    (lambda p: p.write_bytes(b"x" * 5000), "more than twice"),
])
def test_the_candidates_output_file_must_be_a_plain_file_of_sensible_size(tmp_path, make, why):
    source, target = tmp_path / "out.pt", tmp_path / "copy.pt"
    make(source)
    assert why in referee._hand_over(source, target, limit=4096)


def test_a_plain_output_file_is_handed_over_whole(tmp_path):
    (tmp_path / "out.pt").write_bytes(b"outputs" * 100)
    assert referee._hand_over(tmp_path / "out.pt", tmp_path / "copy.pt", limit=4096) is None
    assert (tmp_path / "copy.pt").read_bytes() == b"outputs" * 100


@linux_only
def test_a_frozen_worker_and_what_it_started_make_no_progress(tmp_path):
    # while the referee times the reference, nothing of the candidate's may run beside it
    worker = WorkerProcess("cpu", fork=False)
    try:
        worker.start()
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
        worker._seen[child.pid] = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        state = lambda pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # noqa: E731
        with worker.frozen():
            assert state(worker.pid) == "T" and state(child.pid) == "T"
            ticks = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[11]
            time.sleep(0.2)
            assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[11] == ticks
        time.sleep(0.05)
        assert state(child.pid) != "T" and worker.request("hello", 30)["status"] == "ok"
    finally:
        child.kill()
        child.wait()
        worker.close()


def test_inputs_that_differ_from_one_process_to_another_are_not_judged_by_the_referee(measure_source):
    # the candidate's worker and the referee make inputs from the same seed; a get_inputs() that also depends
    # on the process (here its folder) gives the referee other inputs, and it must say so, not find the candidate wrong.
    # Once in a fresh clone's suite (2026-12-03) the referee saw the same inputs: most likely two folder names of one
    # length whose hashes agreed modulo 97 (a 1-in-97 chance); modulo 1,000,003 it is one in a million
    problem = SMALL_PROBLEM.replace("def get_inputs():", "import os\n\ndef get_inputs():\n    return [torch.randn(256, 512) + len(os.getcwd()) + (hash(os.getcwd()) % 1_000_003) / 1_000_003, torch.randn(256, 512)]\n\ndef _unused():")
    m = measure_source(HONEST_CANDIDATE, problem=problem)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert any("did not judge the candidate's output" in w for w in m.warnings), m.warnings
    assert m.timing_valid is False  # unconfirmed: a hijacker could report other inputs to get here


def test_a_problem_whose_init_inputs_are_random_tensors_is_judged_on_the_same_tensors(measure_source):
    """get_init_inputs() returning a random tensor (a projection, fixed weights) is common; every worker must
    draw the same one, or the referee compares against another model and finds a copy of the reference wrong."""
    problem = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.register_buffer("proj", proj)

    def forward(self, x):
        return torch.cos(x @ self.proj)

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return [torch.randn(32, 16) / 32 ** 0.5]
"""
    copy = problem.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    # and a candidate that changes the tensor it was given must not change the reference's with it
    scaling = copy.replace('self.register_buffer("proj", proj)', 'self.register_buffer("proj", proj.mul_(2))')
    m = measure_source(copy, problem=problem)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    wrong = measure_source(scaling, problem=problem, name="scaling.py")
    assert wrong.status == MeasureStatus.incorrect, wrong.message


@linux_only
def test_cpu_time_a_frozen_process_still_used_is_counted():
    # a stop takes effect on the way back to user space: a process inside a long system call runs on (a red-team
    # pass kept one busy with a 2 GB write), so the referee reads what the tree used while it was to be stopped
    from kernelscout.sandbox.pool import Freeze

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        freeze = Freeze([busy.pid])  # never sent SIGSTOP: it stands for a process the stop has not reached
        freeze.start()
        time.sleep(0.4)
        freeze.end()
        assert freeze.ran_s >= 0.2
        os.kill(busy.pid, signal.SIGSTOP)
        time.sleep(0.1)
        freeze = Freeze([busy.pid])
        freeze.start()
        time.sleep(0.3)
        freeze.end()
        assert freeze.ran_s < 0.05
    finally:
        busy.kill()
        busy.wait()
