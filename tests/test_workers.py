"""Measuring on several workers: candidates in flight together, one exact budget, lost workers retried."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kernelscout.agent.dispatch import Dispatcher, LocalSlots, open_dispatcher
from kernelscout.agent.forecaster import make_forecaster
from kernelscout.agent.graph import SearchLoop, SearchSettings
from kernelscout.agent.policies.tuner import Proposal
from kernelscout.agent.runner import OptimizeError, start_search
from kernelscout.agent.targets import CodeTarget, ReplayTarget, reference_ms
from kernelscout.sandbox.replay import ReplaySpace, recorded_spaces_dir
from kernelscout.sandbox.slot import SlotResult, WorkerLost
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import MeasureStatus

from conftest import QUICK, SMALL_PROBLEM

HUB = recorded_spaces_dir()
SPACE = HUB / "convolution_A100.json.gz"
needs_hub = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")


# -- what every multi-worker run must satisfy -------------------------------------------------------
def assert_ledger_sound(run_dir: Path, cap: int) -> None:
    """Never over the cap, nothing left in flight, no key paid twice, each reservation settled by one result."""
    db = sqlite3.connect(run_dir / "run.db")
    status = Budget(RunDir(run_dir)).status()
    assert status.used <= cap and status.reserved == 0
    charged = [k for (k,) in db.execute("SELECT key FROM ledger WHERE state = 'charged'")]
    assert len(charged) == len(set(charged)), "a measurement was paid for twice"
    ledger_ids = [i for (i,) in db.execute("SELECT ledger_id FROM measurements WHERE ledger_id IS NOT NULL")]
    assert len(ledger_ids) == len(set(ledger_ids)), "one reservation settled two results"
    settled = db.execute("SELECT COUNT(*) FROM ledger WHERE state != 'reserved'").fetchone()[0]
    assert settled == len(ledger_ids), "a settled reservation has no recorded measurement"


def measured_ok(run_dir: Path, n: int) -> list[tuple[str, str]]:
    """The run's measurement rows, after checking there are `n`, all ok; a failure shows what went wrong in each."""
    rows = sqlite3.connect(run_dir / "run.db").execute("SELECT status, result_json FROM measurements").fetchall()
    assert len(rows) == n and all(status == "ok" for status, _ in rows), [(s, json.loads(r)["message"][:400]) for s, r in rows]
    return rows


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def most_in_flight(run_dir: Path) -> int:
    """Measurements reserved and not yet settled at the same time, from the event log."""
    level = peak = 0
    for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines()):
        level += {"measure_start": 1, "measure_end": -1}.get(e["event"], 0)
        peak = max(peak, level)
    return peak


# -- a replay search on local workers -----------------------------------------------------------------
@needs_hub
def test_two_local_workers_keep_two_measurements_in_flight_within_the_cap(tmp_path):
    run_dir = tmp_path / "run"
    result = start_search(problem=None, space=str(SPACE), budget=8, run_dir=str(run_dir), quiet=True, workers=2, replay_delay_s=0.2)

    assert result.measurements_used == 8 and result.stop_reason == "measurement budget spent"
    assert most_in_flight(run_dir) == 2
    assert {e["worker"] for e in events(run_dir, "dispatch")} == {"local-0", "local-1"}
    assert sorted(p.name for p in (run_dir / "workers").iterdir()) == ["local-0.log", "local-1.log"]
    assert_ledger_sound(run_dir, cap=8)


@needs_hub
def test_without_ray_local_workers_still_work_and_ray_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the optional extra were not installed
    monkeypatch.delitem(sys.modules, "kernelscout.sandbox.ray_pool", raising=False)
    with pytest.raises(OptimizeError, match=r"pip install 'kernelscout\[ray\]'"):
        start_search(problem=None, space=str(SPACE), budget=2, ray="auto", run_dir=str(tmp_path / "ray"), quiet=True)

    result = start_search(problem=None, space=str(SPACE), budget=2, workers=2, run_dir=str(tmp_path / "local"), quiet=True)

    assert result.measurements_used == 2


def test_bad_worker_counts_are_clear_errors(tmp_path):
    with pytest.raises(OptimizeError, match="--workers must be at least 1"):
        start_search(problem=None, space=str(SPACE), budget=3, workers=0, run_dir=str(tmp_path / "run"))


# -- lost workers, with a backend that loses them on purpose ------------------------------------------
class FlakyBackend:
    """Two replay workers; the listed worker indices are 'lost' (raise WorkerLost) on their next call."""

    def __init__(self, lose: list[int]):
        self.slots = LocalSlots(2, "cpu")
        self.names = self.slots.names
        self.lose = list(lose)
        self.calls: list[int] = []

    def call(self, index: int, job) -> SlotResult:
        self.calls.append(index)
        if index in self.lose:
            self.lose.remove(index)
            raise WorkerLost("actor died (simulated)")
        return self.slots.call(index, job)

    def recover(self, index: int) -> bool:
        return True

    def describe(self) -> str:
        return "flaky test backend"

    def close(self) -> None:
        self.slots.close()


@needs_hub
def test_a_lost_worker_means_the_same_reservation_is_measured_elsewhere(tmp_path):
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(3)
    backend = FlakyBackend(lose=[0])
    with Dispatcher(backend, run) as dispatcher:
        target = ReplayTarget(ReplaySpace.load(SPACE), run, dispatcher=dispatcher)
        m = target.measure(type("Rec", (), {"params": target.space.config(5)})())

    assert m.status == MeasureStatus.ok and m.charged
    assert backend.calls == [0, 1], "the retry went to the other worker"
    assert any("losing 1 worker" in w for w in m.warnings)
    assert Budget(run).status().used == 1
    assert [e["worker"] for e in events(run.path, "worker_lost")] == ["local-0"]
    assert len(list((run.path / "crashes").iterdir())) == 1
    assert_ledger_sound(run.path, cap=3)


@needs_hub
def test_a_candidate_that_loses_every_worker_is_charged_once_as_crashed(tmp_path):
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(3)
    with Dispatcher(FlakyBackend(lose=[0, 1]), run, max_attempts=2) as dispatcher:
        target = ReplayTarget(ReplaySpace.load(SPACE), run, dispatcher=dispatcher)
        m = target.measure(type("Rec", (), {"params": target.space.config(5)})())

    assert m.status == MeasureStatus.crashed and m.charged and "lost 2 workers" in m.message
    assert Budget(run).status().used == 1
    assert_ledger_sound(run.path, cap=3)


@needs_hub
def test_the_cap_holds_when_many_measurements_race_on_the_workers(tmp_path):
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(5)
    space = ReplaySpace.load(SPACE)
    results = []
    with Dispatcher(LocalSlots(3, "cpu"), run, replay_delay_s=0.05) as dispatcher:
        target = ReplayTarget(space, run, dispatcher=dispatcher)

        def one(i: int) -> None:
            results.append(target.measure(type("Rec", (), {"params": space.config(10 + i)})()))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    spent = [m for m in results if m.status != MeasureStatus.budget_exhausted]
    assert len(spent) == 5 and len(results) == 12
    assert Budget(run).status().used == 5
    assert_ledger_sound(run.path, cap=5)


# -- a CPU example on two local workers -----------------------------------------------------------------
VARIANTS = {
    "printing": "print('hello from the sandbox')\n        return torch.relu(x * self.scale + y) + 0.5 * x",
    "fused": "return torch.relu(torch.addcmul(y, x, torch.full_like(x, self.scale))) + 0.5 * x",
    "inplace": "out = x * self.scale\n        out.add_(y).relu_()\n        return out.add_(x, alpha=0.5)",
    "where": "z = x * self.scale + y\n        return torch.where(z > 0, z, torch.zeros_like(z)) + 0.5 * x",
    "clamp": "return (x * self.scale + y).clamp_min(0) + x * 0.5",
}


def candidate(body: str) -> str:
    return textwrap.dedent('''
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.scale = scale

            def forward(self, x, y):
                BODY
    ''').replace("BODY", body)


class ScriptedPolicy:
    """Proposes a fixed list of hand-written candidates, so the test spends its time measuring, not compiling."""

    def propose(self, info, k, rng):
        fresh = [Proposal(source=candidate(body), origin=f"test:{name}", params={"variant": name}, hypothesis=name,
                          features={"variant": name}) for name, body in VARIANTS.items()]
        return [p for p in fresh if p.sha not in info.tried_shas][:k]


def code_search(tmp_path: Path, budget: int, dispatcher_of) -> tuple[Path, dict]:
    """A search over SMALL_PROBLEM with quick harness settings, measuring on the given dispatcher."""
    problem = tmp_path / "problem.py"
    problem.write_text(SMALL_PROBLEM)
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(budget)
    run.set_meta("sol_bounds", "unavailable")  # skip counting FLOPs in a child process: not what these tests are about
    target = CodeTarget(problem, "cpu", run, harness=QUICK)
    predictor = make_forecaster("none", None, lambda: reference_ms(run), lambda rec: dict(rec.features))
    loop = SearchLoop(run, target, ScriptedPolicy(), predictor, SearchSettings(budget=budget, proposals_per_iteration=5))
    with dispatcher_of(run) as dispatcher:
        loop.scale_out(dispatcher)
        state = loop.run_to_end()
    return run.path, state


def test_a_cpu_example_measured_on_two_local_workers(tmp_path):
    run_dir, state = code_search(tmp_path, budget=4, dispatcher_of=lambda run: open_dispatcher(run, "cpu", workers=2))

    assert state["stop_reason"] == "measurement budget spent"
    rows = measured_ok(run_dir, 4)
    where = {c for _, r in rows for c in json.loads(r)["checks"] if c.startswith("measured on")}
    assert {w.split("@")[0] for w in where} == {"measured on local-0", "measured on local-1"}
    assert most_in_flight(run_dir) == 2
    logs = "".join(p.read_text() for p in (run_dir / "workers").iterdir())
    assert "hello from the sandbox" in logs  # the worker's own output lands in the run directory
    assert_ledger_sound(run_dir, cap=4)


# -- kill -9 of the whole agent while two workers are measuring -----------------------------------------
SEARCH = """
import sys
from kernelscout.agent.runner import resume_search, start_search
if sys.argv[1] == "start":
    start_search(problem=None, space=sys.argv[3], budget=int(sys.argv[4]), run_dir=sys.argv[2], surrogate="none", quiet=True,
                 workers=2, replay_delay_s=0.3)
else:
    print(resume_search(sys.argv[2], quiet=True).model_dump_json())
"""


@needs_hub
@pytest.mark.slow
def test_kill_nine_with_two_workers_in_flight_then_resume(tmp_path):
    run_dir, budget = tmp_path / "run", 24
    proc = subprocess.Popen([sys.executable, "-c", SEARCH, "start", str(run_dir), str(SPACE), str(budget)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once measurements are flowing, with two in flight
        if (run_dir / "events.jsonl").exists() and len(events(run_dir, "measure_end")) >= 5:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {r[0] for r in sqlite3.connect(run_dir / "run.db").execute("SELECT id FROM measurements")}
    assert Budget(RunDir(run_dir)).status().used < budget, "the run finished before it could be killed"

    out = subprocess.run([sys.executable, "-c", SEARCH, "resume", str(run_dir)], capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert result["measurements_used"] == budget
    assert finished <= {r[0] for r in sqlite3.connect(run_dir / "run.db").execute("SELECT id FROM measurements")}
    assert_ledger_sound(run_dir, cap=budget)
