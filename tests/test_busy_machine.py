"""A measurement taken while other processes hold the worker's cores says so instead of reporting a speedup.

On a 2-core VM, an op-by-op reference slowed from 2.7 ms to 15-50 ms beside one busy process (its
threads wait at every operator's barrier for the one pushed off its core), a fused candidate far less,
and the timing passed every other check at 5.0x against 2.4x on the idle machine.
"""

import contextlib
import json
import subprocess
import sys
import time

from kernelscout.tools.schema import MeasureStatus
from conftest import EXAMPLES, usable_cores
from test_space_usage_errors import kscout

SOFTMAX = EXAMPLES / "softmax"  # an op-by-op reference of a few ms: long enough that a busy core always reaches it


@contextlib.contextmanager
def every_core_busy():
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]
    try:
        time.sleep(0.3)  # running, not starting
        yield
    finally:
        for p in burners:
            p.kill()
            p.wait()


def test_a_measurement_beside_processes_that_hold_every_core_is_not_valid(measure_source):
    with every_core_busy():
        m = measure_source((SOFTMAX / "fast.py").read_text(), problem=(SOFTMAX / "problem.py").read_text())
    assert m.status == MeasureStatus.ok, m.message
    assert not m.timing_valid
    assert "machine was busy" in m.timing_invalid_reason
    assert "Measure again when the machine is idle" in m.message
    assert any("waited for a CPU" in check for check in m.checks)



def test_a_search_on_a_busy_machine_stops_and_goes_on_once_it_is_idle(tmp_path):
    run = tmp_path / "run"
    starts = ["--start", str(SOFTMAX / "fast.py"), "--start", str(SOFTMAX / "naive.py")]  # measured first, in this order
    with every_core_busy():
        result = kscout("optimize", str(SOFTMAX / "problem.py"), "--budget", "4", *starts, "--run-dir", str(run), "--json")
    out = json.loads(result.stdout)
    assert out["stop_reason"].startswith("the machine is busy"), out
    assert out["measurements_used"] == 2  # two void timings in a row, and the rest of the budget kept
    shown = json.loads(kscout("show", str(run), "--json").stdout)
    assert [f["status"] for f in shown["failures"]] == ["timing not valid"] * 2
    assert all("the machine was busy" in f["why"] for f in shown["failures"])
    assert out["continue_with"] == f"kscout resume {run}"
    assert "timed again first" in out["stop_reason"]
    resumed = json.loads(kscout("resume", str(run), "--json").stdout)
    assert resumed["measurements_used"] == 4
    assert not (resumed["stop_reason"] or "").startswith("the machine is busy")
    # the two candidates the busy machine kept from being judged were the resume's first two measurements
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    after = events[next(i for i, e in enumerate(events) if e["event"] == "continue"):]
    requeued = next(e for e in after if e["event"] == "requeue")["candidates"]
    assert len(requeued) == 2
    assert [e["candidate"] for e in after if e["event"] == "measure"][:2] == requeued


def test_a_busy_stop_on_the_last_of_the_budget_says_to_raise_it_before_resuming(tmp_path):
    run = tmp_path / "run"
    starts = ["--start", str(SOFTMAX / "fast.py"), "--start", str(SOFTMAX / "naive.py")]
    with every_core_busy():
        result = kscout("optimize", str(SOFTMAX / "problem.py"), "--budget", "2", *starts, "--run-dir", str(run), "--json")
    out = json.loads(result.stdout)
    assert out["stop_reason"].startswith("the machine is busy") and out["measurements_used"] == 2, out
    # a bare resume would find no room to time the two void candidates again
    assert out["continue_with"] == f"kscout budget {run} --set 4 && kscout resume {run}"
    again = json.loads(kscout("resume", str(run), "--json").stdout)  # without the budget: nothing to do, nothing hidden
    assert again["measurements_used"] == 2 and again["stop_reason"].startswith("the machine is busy")
    assert again["continue_with"] == out["continue_with"]
    shown = json.loads(kscout("show", str(run), "--json").stdout)
    assert [f["status"] for f in shown["failures"]] == ["timing not valid"] * 2


def test_a_burst_of_load_that_voids_one_timing_has_that_candidate_timed_again_in_the_same_run(tmp_path, monkeypatch):
    from kernelscout.agent import targets
    from kernelscout.agent.runner import start_search

    measure, calls = targets.CodeTarget.measure, []

    def first_under_load(self, rec, again=False):  # other processes take every core for one measurement only
        calls.append(rec.id)
        if len(calls) == 1:
            with every_core_busy():
                return measure(self, rec, again=again)
        return measure(self, rec, again=again)

    monkeypatch.setattr(targets.CodeTarget, "measure", first_under_load)
    run = tmp_path / "run"
    result = start_search(problem=str(SOFTMAX / "problem.py"), space=None, budget=3, device="cpu", run_dir=str(run), quiet=True,
                          report=False, confirm=0, start=[str(SOFTMAX / "fast.py"), str(SOFTMAX / "naive.py")])
    assert result.measurements_used == 3
    assert calls[2] == calls[0]  # fast.py, voided, was the third measurement; naive.py's valid timing came between
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["candidates"] for e in events if e["event"] == "requeue"] == [[calls[0]]]
    assert result.best_speedup and result.best_speedup > 1.2  # fast.py, judged the second time
    shown = json.loads(kscout("show", str(run), "--json").stdout)
    assert shown["measured_again"] == 1 and shown["failed"] == 0  # 3 spent on 2 candidates, and why



def _softmax_search_killed(tmp_path, monkeypatch, call: int, after_measuring: bool):
    """fast.py, then naive.py (`--start`), budget 3; fast.py's first timing is voided under load, and the process dies
    at measure call `call`: before that measurement starts, or after the ledger stored it. Returns (resume, calls)."""
    import pytest
    from kernelscout.agent import targets
    from kernelscout.agent.runner import resume_search, start_search

    measure, calls = targets.CodeTarget.measure, []

    def under_load_then_killed(self, rec, again=False):
        calls.append(rec.id)
        if len(calls) == 1:
            with every_core_busy():
                return measure(self, rec, again=again)
        if len(calls) == call and not after_measuring:
            raise KeyboardInterrupt  # the process dies before this measurement starts
        m = measure(self, rec, again=again)
        if len(calls) == call:
            raise KeyboardInterrupt  # stored and charged; never recorded
        return m

    monkeypatch.setattr(targets.CodeTarget, "measure", under_load_then_killed)
    with pytest.raises(KeyboardInterrupt):
        start_search(problem=str(SOFTMAX / "problem.py"), space=None, budget=3, device="cpu", run_dir=str(tmp_path / "run"),
                     quiet=True, report=False, confirm=0, start=[str(SOFTMAX / "fast.py"), str(SOFTMAX / "naive.py")])
    return resume_search(str(tmp_path / "run"), quiet=True), calls


def test_a_void_timing_is_still_timed_again_after_a_kill_before_the_next_valid_one(tmp_path, monkeypatch):
    """The voided candidates are read from the ledger, not remembered: a search killed right after a void
    still times that candidate again once the resumed search gets a valid timing."""
    resumed, calls = _softmax_search_killed(tmp_path, monkeypatch, call=2, after_measuring=False)
    assert resumed.measurements_used == 3
    assert calls[2:] == [calls[1], calls[0]]  # naive.py's valid timing, then fast.py, voided before the kill, again
    assert resumed.best_speedup and resumed.best_speedup > 1.2


def test_a_new_timing_after_a_void_one_stored_before_a_kill_is_taken_up_on_resume_not_paid_again(tmp_path, monkeypatch):
    """The last unit of the budget retimes fast.py (voided under load); the process dies after the ledger stored that
    timing and before the search recorded it. The resume takes it up free (it found no room and stopped, and the
    paid timing belonged to nothing: fast.py stayed out of the result)."""
    import sqlite3

    resumed, calls = _softmax_search_killed(tmp_path, monkeypatch, call=3, after_measuring=True)
    assert resumed.measurements_used == 3 and calls[2:] == [calls[0], calls[0]]  # the retime, then taken up on resume
    with sqlite3.connect(tmp_path / "run" / "run.db") as db:  # fast.py's record holds the retime, the last of the 3
        assert db.execute("SELECT measurement_id FROM candidates WHERE id = ?", (calls[0],)).fetchone()[0] == \
            db.execute("SELECT MAX(id) FROM measurements WHERE charged = 1").fetchone()[0] == 3
    assert resumed.best_speedup and resumed.best_speedup > 1.2
