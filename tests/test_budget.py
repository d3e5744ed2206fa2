"""The budget cannot be exceeded: not by repeats, not by crashes, not by racing processes."""

import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import pytest

from kernelscout.tools.budget import Budget, BudgetExhausted, InFlight, process_start
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM


@contextmanager
def search_running_in(folder) -> Iterator[None]:
    """Another process holding `folder` as a search does (its advisory lock), for as long as the block runs."""
    holding = subprocess.Popen([sys.executable, "-c", "import time\nfrom kernelscout.tools.runlock import exclusive\n"
                                f"with exclusive({str(folder)!r}, 'kscout search'):\n    print('held', flush=True)\n    time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline().strip() == "held"
        yield
    finally:
        holding.kill()
        holding.wait()


def test_reservations_count_as_spent_and_the_cap_holds(tmp_path):
    ledger = Budget(RunDir(tmp_path))
    ledger.set_cap(2)
    a = ledger.reserve("a")
    ledger.reserve("b")
    with pytest.raises(BudgetExhausted, match="2 of 2 used"):
        ledger.reserve("c")
    ledger.settle(a, charged=False)
    assert ledger.status().used == 1
    ledger.reserve("c")
    assert ledger.status().remaining == 0


def test_a_dead_process_reservation_is_adopted_not_paid_twice(tmp_path):
    run = RunDir(tmp_path)
    ledger = Budget(run)
    ledger.set_cap(1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with run.transaction() as db:
        db.execute("INSERT INTO ledger (key, state, owner_pid, owner_host, created) VALUES ('k', 'reserved', ?, ?, 0)",
                   (dead.pid, __import__("socket").gethostname()))
    again = ledger.reserve("k")
    assert again.adopted
    assert ledger.status().used == 1
    with pytest.raises(BudgetExhausted):
        ledger.reserve("other")


def test_measure_stops_at_the_cap_and_reuses_what_it_measured(tmp_path, write, pool):
    problem = write("problem.py", SMALL_PROBLEM)
    cands = [write(f"c{i}.py", GOOD_CANDIDATE + f"\n# variant {i}\n") for i in range(3)]
    run = str(tmp_path / "run")
    results = [measure(MeasureRequest(problem=str(problem), candidate=str(c), device="cpu", run_dir=run, budget=2, harness=QUICK), pool=pool) for c in cands]
    assert [r.status for r in results] == [MeasureStatus.ok, MeasureStatus.ok, MeasureStatus.budget_exhausted]
    assert [r.charged for r in results] == [True, True, False]
    assert "budget" in results[2].message
    repeat = measure(MeasureRequest(problem=str(problem), candidate=str(cands[0]), device="cpu", run_dir=run, harness=QUICK), pool=pool)
    assert repeat.status == MeasureStatus.ok and not repeat.charged
    assert "already measured" in repeat.message
    assert Budget(RunDir(run)).status().used == 2


def test_preflight_failures_are_not_charged(tmp_path, write, pool):
    problem = write("problem.py", SMALL_PROBLEM)
    broken = write("broken.py", "import torch\nclass ModelNew(:\n    pass\n")
    m = measure(MeasureRequest(problem=str(problem), candidate=str(broken), device="cpu", run_dir=str(tmp_path / "run"), budget=1, harness=QUICK), pool=pool)
    assert m.status == MeasureStatus.compile_error and not m.charged
    assert Budget(RunDir(tmp_path / "run")).status().used == 0


def test_a_candidate_that_could_not_import_is_measured_afresh_not_replayed(tmp_path, write, pool):
    # the first result cost nothing and said nothing about the candidate (a package was missing);
    # replaying it would keep the user's fix from taking effect
    problem = write("problem.py", SMALL_PROBLEM)
    cand = write("cand.py", "import kscout_test_missing_helper\n" + GOOD_CANDIDATE)
    request = MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"), budget=2, harness=QUICK)
    first = measure(request, pool=pool)
    assert first.status == MeasureStatus.compile_error and not first.charged
    second = measure(request, pool=pool)
    assert second.status == MeasureStatus.compile_error and "already measured" not in second.message
    assert Budget(RunDir(tmp_path / "run")).status().used == 0


@pytest.mark.slow
def test_five_racing_processes_with_a_cap_of_three(tmp_path, write):
    # five, not eight as before: the same race (more processes than the cap allows) for less of the suite's time
    problem = write("problem.py", SMALL_PROBLEM)
    run = tmp_path / "run"
    Budget(RunDir(run)).set_cap(3)
    procs = []
    for i in range(5):
        cand = write(f"cand{i}.py", GOOD_CANDIDATE + f"\n# racer {i}\n")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "kernelscout", "measure", str(problem), str(cand), "--device", "cpu",
             "--run-dir", str(run), "--json", "--timing-budget", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    statuses = []
    for p in procs:
        out, errout = p.communicate(timeout=600)
        statuses.append(json.loads(out)["status"])
    assert sorted(statuses) == ["budget_exhausted"] * 2 + ["ok"] * 3
    status = Budget(RunDir(run)).status()
    assert status.used == 3 and status.reserved == 0


def test_kscout_budget_never_reads_a_mistyped_run_directory_as_uncapped(tmp_path):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    missing = tmp_path / "runs" / "typo"
    shown = CliRunner().invoke(app, ["budget", str(missing)])
    assert shown.exit_code == 2 and "does not exist" in shown.output
    assert not missing.exists()
    assert CliRunner().invoke(app, ["budget", str(missing), "--set", "-1"]).exit_code == 2  # refused by the option itself


def test_kscout_budget_set_on_a_new_directory_creates_it_with_that_cap(tmp_path):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    new = tmp_path / "runs" / "scratch"
    result = CliRunner().invoke(app, ["budget", str(new), "--set", "20", "--json"])
    assert result.exit_code == 0, result.output
    assert '"cap":20' in result.stdout.replace(" ", "")
    assert Budget(RunDir(new)).status().cap == 20


@pytest.mark.skipif(process_start(os.getpid()) is None, reason="no /proc: a process's start cannot be read here")
def test_a_reservation_whose_pid_a_later_process_reuses_is_adopted_not_waited_for_or_paid_twice(tmp_path):
    """A restarted container gives its processes the same low pids: the resuming process, or another one, can have
    the pid of the process that was killed holding a reservation. A live process whose start differs from the one
    recorded with the reservation is not its owner: the reservation is adopted (the resuming process paid the key
    again and left the old reservation in flight for ever; another process's pid made it wait an hour)."""
    run = RunDir(tmp_path)
    ledger = Budget(run)
    ledger.set_cap(3)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with run.transaction() as db:
            for key, pid, start in (("mine", os.getpid(), "another boot:1"), ("theirs", other.pid, "another boot:2"),
                                    ("live", other.pid, process_start(other.pid))):
                db.execute("INSERT INTO ledger (key, state, owner_pid, owner_host, owner_start, created) "
                           "VALUES (?, 'reserved', ?, ?, ?, 0)", (key, pid, socket.gethostname(), start))
        assert ledger.adoptable() == 2 and ledger.in_flight() == ((other.pid, socket.gethostname()),)
        assert ledger.reserve("mine").adopted and ledger.reserve("theirs").adopted
        with pytest.raises(InFlight):  # its real owner, alive: waited for
            ledger.reserve("live")
        assert ledger.status().used == 3 and ledger.adoptable() == 0  # this process holds the two it took over
        assert set(ledger.in_flight()) == {(os.getpid(), socket.gethostname()), (other.pid, socket.gethostname())}
    finally:
        other.kill()
        other.wait()


def test_a_live_process_measuring_the_same_candidate_is_waited_for_not_paid_twice(tmp_path, write, pool, monkeypatch):
    from kernelscout.tools import measure as measure_tool

    problem, cand = write("problem.py", SMALL_PROBLEM), write("c.py", GOOD_CANDIDATE)
    run_dir = tmp_path / "run"
    first = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run_dir), harness=QUICK), pool=pool)
    run = RunDir(run_dir)
    # as if another process (the parent of this test, alive) were still measuring it: its reservation
    # stands while the recorded result is hidden, then it "finishes" during the wait
    with run.transaction() as db:
        db.execute("INSERT INTO ledger (key, state, owner_pid, owner_host, created) SELECT key, 'reserved', ?, ?, 0 "
                   "FROM measurements", (__import__("os").getppid(), __import__("socket").gethostname()))
    real_find, calls = measure_tool.find_measurement, []

    def find_after_a_while(run_, key):
        calls.append(key)
        if len(calls) < 3:
            return None
        with run_.transaction() as db:
            db.execute("UPDATE ledger SET state = 'charged' WHERE state = 'reserved'")
        return real_find(run_, key)

    monkeypatch.setattr(measure_tool, "find_measurement", find_after_a_while)
    monkeypatch.setattr(measure_tool, "SAME_KEY_POLL_S", 0.01)
    second = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run_dir), harness=QUICK), pool=pool)
    assert second.status == MeasureStatus.ok and not second.charged
    assert second.measurement_id == first.measurement_id
    assert len(calls) == 3


def test_a_second_search_in_a_running_searchs_folder_is_refused(tmp_path):
    from kernelscout.tools.runlock import RunBusy, exclusive, holder

    assert holder(tmp_path) is None
    with exclusive(tmp_path, "kscout search"):
        assert "kscout search" in holder(tmp_path)
        # another process, as `kscout resume` typed in a second terminal
        probe = subprocess.run([sys.executable, "-c", "from kernelscout.tools.runlock import exclusive\n"
                                f"with exclusive({str(tmp_path)!r}, 'resume'):\n    pass"], capture_output=True, text=True)
        assert probe.returncode != 0 and "still running" in probe.stderr
        with pytest.raises(RunBusy):
            with exclusive(tmp_path, "again"):
                pass
    assert holder(tmp_path) is None  # released with the search, as when its process dies


def test_a_busy_folder_names_the_command_the_user_typed():
    from kernelscout.tools.runlock import this_command

    assert this_command(["/home/me/.venv/bin/kscout", "optimize", "examples/softmax", "--budget", "10"]) == "kscout optimize"
    assert this_command(["/usr/local/bin/kscout", "chat", "examples/softmax"]) == "kscout chat"
    assert this_command(["/src/kernelscout/__main__.py", "run", "problems/"]) == "kscout run"  # python -m kernelscout
    assert this_command(["/home/me/tune.py", "--budget", "5"]) == "python tune.py"  # a script calling start_search
    assert this_command(["-c"]) == this_command([]) == "python"


def test_a_killed_search_leaves_its_folder_free(tmp_path):
    from kernelscout.tools.runlock import holder

    holding = subprocess.Popen([sys.executable, "-c", "import time\nfrom kernelscout.tools.runlock import exclusive\n"
                                f"with exclusive({str(tmp_path)!r}, 'search'):\n    print('held', flush=True)\n    time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    assert holding.stdout.readline().strip() == "held"
    assert holder(tmp_path) is not None
    holding.kill()
    holding.wait()
    assert holder(tmp_path) is None


def test_kscout_budget_will_not_set_a_cap_below_what_is_used(tmp_path):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    run = RunDir(tmp_path / "run")
    ledger = Budget(run)
    for key in ("a", "b", "c"):
        ledger.reserve(key)
    result = CliRunner().invoke(app, ["budget", str(run.path), "--set", "1"])
    assert result.exit_code == 2 and "--set 3 stops any further measurement" in result.output
    assert ledger.cap is None


def test_no_adapter_can_set_a_cap_below_what_is_used_since_the_ledger_refuses_it(tmp_path):
    from kernelscout.tools.budget import CapBelowUsed

    ledger = Budget(RunDir(tmp_path / "run"))
    ledger.set_cap(5)
    for key in ("a", "b", "c"):
        ledger.reserve(key)
    with pytest.raises(CapBelowUsed, match="below the 3 measurements already used"):
        ledger.set_cap(2)
    assert ledger.status().cap == 5  # left as it was
    ledger.set_cap(3)  # equal to what is used: stops further measurement, which is allowed
    assert ledger.status().remaining == 0
    ledger.set_cap(None)
    assert ledger.cap is None


def test_a_killed_process_not_yet_reaped_is_dead_to_the_ledger(tmp_path):
    import os
    import signal
    import socket
    import time

    run = RunDir(tmp_path)
    ledger = Budget(run)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGKILL)
    time.sleep(0.3)  # killed, not waited for: a zombie still answers kill(pid, 0)
    with run.transaction() as db:
        db.execute("INSERT INTO ledger (key, state, owner_pid, owner_host, created) VALUES ('k', 'reserved', ?, ?, 0)",
                   (child.pid, socket.gethostname()))
    assert ledger.reserve("k").adopted  # not waited on as if it were still measuring
    child.wait()


def test_a_measurement_into_a_folder_another_process_is_searching_in_is_refused_not_charged(tmp_path, write):
    # it would be charged to that search's budget, and its --budget would change that search's cap under it
    # (a QA pass saw a search capped at 4 go on to 12 measurements)
    problem, cand = write("problem.py", SMALL_PROBLEM), write("cand.py", GOOD_CANDIDATE)
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(4)
    with search_running_in(run.path):
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run.path), budget=12,
                                   harness=QUICK))
    assert m.status == MeasureStatus.run_dir_unusable and not m.charged
    assert "in use by a search that is still running (kscout search, pid" in m.message and "another run directory" in m.message
    assert Budget(run).status().cap == 4 and Budget(run).status().used == 0


def test_a_search_cannot_start_in_a_folder_between_a_measurements_check_and_its_charge(tmp_path, write, monkeypatch):
    # a search starting in that moment would find the measurement charged to its own budget (once the
    # measurement is charged, the search is refused anyway, for measurements made outside a search)
    problem, cand = write("problem.py", SMALL_PROBLEM), write("cand.py", GOOD_CANDIDATE)
    run_dir = tmp_path / "run"
    seen, reserve = {}, Budget.reserve

    def search_then_reserve(self, key, share=False):
        if "search" not in seen:
            seen["search"] = subprocess.run([sys.executable, "-m", "kernelscout.agent.cli", "optimize", str(problem), "--budget", "2",
                                             "--device", "cpu", "--run-dir", str(run_dir)], capture_output=True, text=True)
        return reserve(self, key, share)

    monkeypatch.setattr(Budget, "reserve", search_then_reserve)
    m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run_dir), harness=QUICK))
    assert m.status == MeasureStatus.ok and m.charged
    assert seen["search"].returncode == 2, seen["search"].stderr
    assert "in use by a measurement made outside a search" in seen["search"].stderr
    assert Budget(RunDir(run_dir)).status().used == 1 and RunDir(run_dir).get_meta("search_spec") is None
    from kernelscout.tools.runlock import holder

    assert holder(run_dir) is None  # free again once the measurement is done


def test_a_finished_searchs_folder_takes_only_the_searchs_own_measurements(tmp_path, write):
    # a server measured two files into a finished search's folder: charged to its budget, and `kscout show` (which
    # reads the search's candidates) named neither; now they are refused, nothing charged, with the ways on
    from kernelscout.agent.runner import resume_search, start_search
    from kernelscout.sandbox.replay import recorded_spaces_dir
    from kernelscout.tools.mcp_server import ensure_cap
    from kernelscout.tools.measure import would_charge

    problem, cand = write("problem.py", SMALL_PROBLEM), write("cand.py", GOOD_CANDIDATE)
    run_dir = tmp_path / "run"
    start_search(problem=None, space=str(recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"), budget=3, run_dir=str(run_dir),
                 quiet=True, report=False)
    m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run_dir), harness=QUICK))
    assert m.status == MeasureStatus.run_dir_unusable and not m.charged
    assert "holds a search of" in m.message and "pnpoly_RTX_3090" in m.message
    assert "whose budget is spent (3 of 3)" in m.message and "charged" not in m.message  # nothing could be charged
    assert f"kscout budget {run_dir} --set N && kscout resume {run_dir}" in m.message and "another run directory" in m.message
    assert not would_charge(RunDir(run_dir), str(problem), str(cand), "cpu")  # a chat would not ask to spend it
    with pytest.raises(ValueError, match="whose budget is the search's own"):  # `kscout serve --budget 12`, `kscout chat --budget 12`
        ensure_cap(str(run_dir), 12)
    assert ensure_cap(str(run_dir), None).cap == 3  # a server may still read the folder
    from kernelscout.agent.cli_chat import ChatSetupError, open_chat

    for asked in (str(problem), None):  # a new chat there, or "the earlier chat" of that folder
        with pytest.raises(ChatSetupError, match="takes only the search's own measurements"):
            open_chat(asked, str(run_dir), device="cpu", model=None)
    assert Budget(RunDir(run_dir)).status().used == 3
    Budget(RunDir(run_dir)).set_cap(5)
    m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(run_dir), harness=QUICK))
    assert not m.charged and "would be charged to its budget" in m.message  # with room left, that is the reason
    assert resume_search(str(run_dir), quiet=True).measurements_used == 5  # the search itself measures there as before


def test_a_measurement_will_not_set_a_cap_below_what_the_folder_has_used(tmp_path, write):
    run = RunDir(tmp_path / "run")
    ledger = Budget(run)
    for key in ("a", "b", "c"):
        ledger.reserve(key)
    m = measure(MeasureRequest(problem=str(write("problem.py", SMALL_PROBLEM)), candidate=str(write("cand.py", GOOD_CANDIDATE)),
                               device="cpu", run_dir=str(run.path), budget=2, harness=QUICK))
    assert m.status == MeasureStatus.run_dir_unusable and not m.charged
    assert "below the 3 measurements" in m.message and "--budget 3" in m.message
    assert ledger.cap is None


def test_serve_and_chat_leave_the_cap_of_a_search_running_in_their_folder_alone(tmp_path, write):
    # `kscout serve --run-dir FOLDER --budget 12` set the cap first and refused the folder after: the search went on to 12
    from kernelscout.tools.mcp_server import ensure_cap

    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(4)
    with search_running_in(run.path), pytest.raises(ValueError, match="in use by a search that is still running"):
        ensure_cap(str(run.path), 12)
    assert Budget(run).status().cap == 4
    from kernelscout.agent.cli_chat import ChatSetupError, open_chat

    problem = write("problem.py", SMALL_PROBLEM)
    with search_running_in(run.path), pytest.raises(ChatSetupError, match="still running .*chat in another run directory"):
        open_chat(str(problem), str(run.path), device="cpu", model=None)  # not "resume it", which fails while it runs
    assert ensure_cap(str(run.path), 12).cap == 12  # once the search is gone, the cap is the user's to set


def test_what_would_be_charged_is_the_measure_tools_own_rule(tmp_path, write):
    """`kscout chat` asks before spending; it asks by this rule, so it never asks about a measurement that is free
    or refused (and never skips asking about one that is charged)."""
    from kernelscout.sandbox.problem import load_candidate, load_problem
    from kernelscout.tools.measure import MeasurementRecord, ledgered, measurement_key, would_charge
    from kernelscout.tools.schema import Measurement

    problem, cand = write("problem.py", SMALL_PROBLEM), write("cand.py", GOOD_CANDIDATE)
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(2)
    assert would_charge(run, str(problem), str(cand), "cpu")
    assert not would_charge(run, str(problem), str(tmp_path / "missing.py"), "cpu")  # refused before anything runs
    key = measurement_key(load_problem(str(problem)).sha, load_candidate(str(cand)).sha, "cpu")
    record = MeasurementRecord(key=key, problem_sha=load_problem(str(problem)).sha, candidate_sha=load_candidate(str(cand)).sha,
                               problem_path=str(problem), candidate_path=str(cand), device="cpu")
    ledgered(run, record, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=1.2))
    assert not would_charge(run, str(problem), str(cand), "cpu")  # recorded: handed back free
    assert would_charge(run, str(problem), str(cand), "cpu", again=True)
    with search_running_in(run.path):
        assert not would_charge(run, str(problem), str(cand), "cpu", again=True)  # refused while a search runs there
    Budget(run).set_cap(1)
    assert not would_charge(run, str(problem), str(cand), "cpu", again=True)  # no budget left: refused


def test_a_ledger_made_before_owner_start_is_read_as_it_is_and_given_the_column_when_written(tmp_path):
    import sqlite3

    run = RunDir(tmp_path / "old")
    Budget(run).reserve("k")
    with sqlite3.connect(tmp_path / "old" / "run.db") as db:  # as an earlier version made it
        db.execute("ALTER TABLE ledger DROP COLUMN owner_start")
    reader = Budget(RunDir(tmp_path / "old", read_only=True))
    assert reader.in_flight() == ((os.getpid(), socket.gethostname()),) and reader.adoptable() == 0
    writer = Budget(RunDir(tmp_path / "old"))
    assert writer.reserve("k2") and writer.status().used == 2
    with sqlite3.connect(tmp_path / "old" / "run.db") as db:
        assert [r[0] is None for r in db.execute("SELECT owner_start FROM ledger ORDER BY id")] == [True, process_start(os.getpid()) is None]
