"""The budget cannot be exceeded: not by repeats, not by crashes, not by racing processes."""

import json
import subprocess
import sys

import pytest

from kernelscout.tools.budget import Budget, BudgetExhausted
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM


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


@pytest.mark.slow
def test_eight_racing_processes_with_a_cap_of_five(tmp_path, write):
    problem = write("problem.py", SMALL_PROBLEM)
    run = tmp_path / "run"
    Budget(RunDir(run)).set_cap(5)
    procs = []
    for i in range(8):
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
    assert sorted(statuses) == ["budget_exhausted"] * 3 + ["ok"] * 5
    status = Budget(RunDir(run)).status()
    assert status.used == 5 and status.reserved == 0


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
