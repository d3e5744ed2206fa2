"""Measuring on Ray actors: a local Ray instance with two CPU actors, one killed mid-measurement."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kernelscout.agent.dispatch import open_dispatcher  # noqa: E402
from kernelscout.agent.runner import start_search  # noqa: E402

from test_workers import SPACE, assert_ledger_sound, code_search, events, measured_ok, needs_hub  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module (starting one takes seconds): two CPUs, so two actors."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


class ActorKiller(threading.Thread):
    """Kills the actor that was handed the n-th job, right after it got it: in the middle of that measurement."""

    def __init__(self, run_dir: Path, nth: int):
        super().__init__(daemon=True)
        self.run_dir, self.nth = run_dir, nth
        self.killed: list[str] = []
        self.finished_before: set[int] = set()
        self.start()

    def run(self) -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not self.killed:
            if (self.run_dir / "events.jsonl").exists():
                jobs = events(self.run_dir, "dispatch")
                if len(jobs) >= self.nth:
                    self.finished_before = measurement_ids(self.run_dir)
                    ray.kill(ray.get_actor(jobs[self.nth - 1]["worker"]), no_restart=False)
                    self.killed.append(jobs[self.nth - 1]["worker"])
            time.sleep(0.01)


def measurement_ids(run_dir: Path) -> set[int]:
    return {r[0] for r in sqlite3.connect(run_dir / "run.db").execute("SELECT id FROM measurements")}


def assert_nothing_finished_was_lost(run_dir: Path, finished_before_kill: set[int]) -> None:
    final = measurement_ids(run_dir)
    assert finished_before_kill <= final
    assert {e["measurement_id"] for e in events(run_dir, "measure_end")} == final


def assert_the_lost_job_was_measured_again(run_dir: Path, actor: str) -> None:
    lost = events(run_dir, "worker_lost")
    assert [e["worker"] for e in lost] == [actor]
    again = [e for e in events(run_dir, "dispatch") if e["candidate"] == lost[0]["candidate"] and e["attempt"] == 2]
    assert len(again) == 1
    assert len(list((run_dir / "crashes").iterdir())) == 1  # the loss is on file in the run directory
    rows = sqlite3.connect(run_dir / "run.db").execute("SELECT result_json FROM measurements").fetchall()
    assert sum("after losing 1 worker" in " ".join(json.loads(r[0])["warnings"]) for r in rows) == 1


@needs_hub
def test_replay_search_on_two_ray_actors_survives_a_killed_actor(tmp_path):
    run_dir, budget = tmp_path / "run", 6
    killer = ActorKiller(run_dir, nth=3)

    result = start_search(problem=None, space=str(SPACE), budget=budget, run_dir=str(run_dir), quiet=True, ray="auto",
                          replay_delay_s=1.0)

    assert killer.killed, "no actor was killed"
    assert result.measurements_used == budget and result.stop_reason == "measurement budget spent"
    assert {e["worker"] for e in events(run_dir, "dispatch")} == set(events(run_dir, "workers")[0]["names"])
    assert_the_lost_job_was_measured_again(run_dir, killer.killed[0])
    assert_nothing_finished_was_lost(run_dir, killer.finished_before)
    assert_ledger_sound(run_dir, cap=budget)


def test_cpu_example_on_two_ray_actors_survives_a_killed_actor(tmp_path):
    run_dir = tmp_path / "run"
    killer = ActorKiller(run_dir, nth=2)

    run_dir, state = code_search(tmp_path, budget=4, dispatcher_of=lambda run: open_dispatcher(run, "cpu", ray_address="auto"))

    assert killer.killed and state["stop_reason"] == "measurement budget spent"
    rows = measured_ok(run_dir, 4)
    assert all(any(c.startswith("measured on kscout-") for c in json.loads(r)["checks"]) for _, r in rows)
    logs = "".join(p.read_text() for p in (run_dir / "workers").iterdir())
    assert "hello from the sandbox" in logs  # a remote worker's output lands in the run directory
    assert_the_lost_job_was_measured_again(run_dir, killer.killed[0])
    assert_nothing_finished_was_lost(run_dir, killer.finished_before)
    assert_ledger_sound(run_dir, cap=4)


def test_asking_for_more_actors_than_the_cluster_has_is_a_clear_error(tmp_path):
    from kernelscout.tools.rundir import RunDir

    with pytest.raises(ValueError, match="5 workers need 5 CPUs, but the Ray cluster has 2"):
        open_dispatcher(RunDir(tmp_path / "run"), "cpu", workers=5, ray_address="auto")
    with pytest.raises(ValueError, match="has no GPUs"):
        open_dispatcher(RunDir(tmp_path / "run"), "cuda", ray_address="auto")


def test_ray_actors_replay_the_objective_the_search_was_asked_for(tmp_path):
    """Under `--objective time` each actor loads the space the same way as the search: the best is the shortest call
    at its recorded time, not the equal-work time the file's own objective (GFLOP/s) would replay."""
    from kernelscout.agent.run_view import view_run

    from test_space_objective import _steps_space

    path = _steps_space(tmp_path / "hotspot_like.json")
    result = start_search(problem=None, space=str(path), budget=12, run_dir=str(tmp_path / "run"), quiet=True, ray="auto",
                          seed=1, objective="time", report=False)

    assert result.measurements_used >= 1
    assert events(tmp_path / "run", "workers")[0]["names"]  # measured on the actors
    view = view_run(tmp_path / "run")
    assert view.best.params == {"steps": 1, "block": 64}
    assert view.best_runtime_ms == pytest.approx(1.0, rel=0.05)  # recorded; the equal-work time would be 3.0 ms
