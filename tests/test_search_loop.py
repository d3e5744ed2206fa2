"""The search loop: predicts before it measures, never exceeds its budget, and survives kill -9."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelscout.agent.runner import OptimizeError, resume_search, start_search
from kernelscout.sandbox.replay import recorded_spaces_dir
from kernelscout.tools.archive import Archive, clear_gain
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir, reading

from conftest import sigint_as_from_a_terminal

HUB = recorded_spaces_dir()
SPACE = HUB / "convolution_A100.json.gz"
UNSEEN = Path(__file__).parent / "data" / "unseen"

needs_hub = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")


@needs_hub
def test_replay_search_considers_many_and_measures_within_budget(tmp_path):
    result = start_search(problem=None, space=str(SPACE), budget=15, run_dir=str(tmp_path / "run"), quiet=True)
    assert result.status == "finished" and result.stop_reason == "measurement budget spent"
    assert result.measurements_used == 15
    assert result.considered_per_measurement >= 3
    assert result.best_speedup and result.best_speedup > 1.0
    best = json.loads(Path(result.best_path).read_text())
    assert best["runtime_ms"] == pytest.approx(result.best_runtime_ms)
    assert (tmp_path / "run" / "report.html").read_text().count("<img") == 3
    forecasts = sqlite3.connect(tmp_path / "run" / "run.db").execute("SELECT COUNT(*), COUNT(DISTINCT candidate_id) FROM forecasts").fetchone()
    assert forecasts[1] == result.candidates_considered


def test_a_shelved_candidate_proposed_again_goes_back_in_the_queue_and_a_skipped_one_stays_skipped(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    add = lambda sha: archive.add(sha, None, None, "screened", {"x": sha}, "", {}, 1)  # noqa: E731
    shelved, skipped = add("a"), add("b")
    archive.record_forecast(shelved.id, 1, "learned", {}, "shelve", "worth measuring but ranked below the 32 kept for later")
    archive.record_forecast(skipped.id, 1, "learned", {}, "skip", "confidently slower than the best")
    assert archive.shas("shelved") == {"a"} and archive.shas() == {"a", "b"}
    assert add("a").state == "proposed" and add("b").state == "skipped"
    assert add("a").id == shelved.id  # the same candidate, its first forecast kept beside the next
    assert archive.shas("shelved") == set()


@needs_hub
def test_candidates_shelved_for_want_of_room_come_back_when_the_ranking_returns_to_them(tmp_path):
    """More configurations are worth measuring than the loop keeps pending. Those that lose their place
    were never judged worse, so the space's ranking may propose them again: a good one is not lost for good."""
    run_dir = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=20, run_dir=str(run_dir), quiet=True, report=False)
    steps = sqlite3.connect(run_dir / "checkpoints.db").execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert steps == 1  # the latest checkpoint is all a resume reads; the stopped search kept no other
    db = sqlite3.connect(run_dir / "run.db")
    shelved_before = {cid for (cid,) in db.execute("SELECT id FROM candidates WHERE state = 'shelved'")}
    (last_iteration,) = db.execute("SELECT MAX(iteration) FROM forecasts").fetchone()
    Budget(RunDir(run_dir)).set_cap(60)
    resume_search(str(run_dir), quiet=True)  # a fresh process's policy: what it knows of the shelf is in run.db
    history: dict[int, list[str]] = {}
    for cid, decision in db.execute("SELECT candidate_id, decision FROM forecasts ORDER BY iteration, id"):
        history.setdefault(cid, []).append(decision)
    state = dict(db.execute("SELECT id, state FROM candidates"))
    shelved = [cid for cid, decisions in history.items() if "shelve" in decisions]
    came_back = [cid for cid in shelved if history[cid][-1] != "shelve"]
    assert shelved and any(state[cid] == "measured" for cid in came_back)
    proposed_again = {cid for (cid,) in db.execute(
        "SELECT candidate_id FROM forecasts WHERE iteration > ? AND decision != 'shelve'", (last_iteration,))}
    assert shelved_before & proposed_again  # shelved before the resume, proposed again after it
    assert all(state[cid] == "shelved" for cid in shelved if history[cid][-1] == "shelve")


@pytest.mark.parametrize("running", [5, 15])
def test_a_space_where_few_configurations_run_is_searched_to_the_end_shelf_included(tmp_path, running):
    """60 configurations, of which 5 (the surrogate never gets the 8 timings it needs) or 15 run. Most proposals
    are shelved while the queue is full of failures; once nothing untried is left, the shelf is what is proposed,
    so a budget larger than the space measures every configuration, the optimum included, before the search stops."""
    rng = random.Random(5)
    configs = [(a, b) for a in range(1, 13) for b in (1, 2, 4, 8, 16)]
    runs = set(rng.sample(range(len(configs)), running))
    cache = {f"{a},{b}": {"a": a, "b": b, "time": 1.0 + 0.1 * abs(a - 7) + 0.05 * abs(b - 4) if i in runs else "RuntimeFailedConfig"}
             for i, (a, b) in enumerate(configs)}
    space = tmp_path / "mostly_failing.json"
    space.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": ["a", "b"], "objective": "time",
                                 "tune_params": {"a": list(range(1, 13)), "b": [1, 2, 4, 8, 16]}, "cache": cache}))
    optimum = min(r["time"] for r in cache.values() if r["time"] != "RuntimeFailedConfig")
    result = start_search(problem=None, space=str(space), budget=100, seed=0, run_dir=str(tmp_path / "run"), quiet=True, report=False)
    assert result.measurements_used == len(configs) - 1  # all but the reference, which every session times
    assert result.best_runtime_ms == pytest.approx(optimum)
    assert result.stop_reason.endswith("every configuration of the space has been measured (the reference's is timed in every session)")


def _v_space(folder: Path) -> Path:
    """One parameter, 1-500, a V-shaped time with its minimum (1.0) at 333."""
    values = list(range(1, 501))
    space = folder / "v.json"
    space.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": ["bs"], "objective": "time",
                                 "tune_params": {"bs": values}, "cache": {str(v): {"bs": v, "time": 1 + abs(v - 333) / 100} for v in values}}))
    return space


def test_a_search_the_surrogate_stopped_says_so_and_how_to_measure_without_it(tmp_path, monkeypatch):
    """One parameter, a V-shaped time with its minimum at 333 of 1-500. The decision rule may skip a candidate
    only once enough measured candidates have beaten the best to bound how often it would skip a winner (19 at
    its 5 % miss rate, more than most searches see); here it is allowed to after 3 (a 25 % miss rate), so once
    the surrogate has the V it rules out the rest, and the search stops with most of its budget left. The stop
    says why, since "nothing left worth measuring" alone reads as if the space were used up."""
    from kernelscout.agent import forecaster
    from kernelscout.tools.surrogates.decision import RiskControlledGate

    class TrustingGate(RiskControlledGate):
        def __init__(self, target_risk: float = 0.05, **kwargs):
            super().__init__(target_risk=0.25, **kwargs)

    monkeypatch.setattr(forecaster, "RiskControlledGate", TrustingGate)
    # solved_chance 0: the stop for a solved space, which would come first here, is another test's subject
    result = start_search(problem=None, space=str(_v_space(tmp_path)), budget=600, seed=0, run_dir=str(tmp_path / "run"), quiet=True,
                          report=False, solved_chance=0)
    assert result.measurements_used < 100
    assert "the surrogate judged the last" in result.stop_reason and "unlikely to beat the best" in result.stop_reason
    assert "--surrogate none" in result.stop_reason


def test_a_search_that_has_solved_its_space_stops_before_its_budget_and_says_why(tmp_path):
    """The rule that skips single candidates never sees the 19 winners it needs here (the optimum is found within
    about 30 measurements), so before this stop the search measured all 499 configurations under a budget of 600.
    It now stops once the surrogate gives everything left, together, under a 5 % chance of a clear win: a time
    more than CLEAR_WIN (2 %) under the best. So the best it stops at is within that of the optimum (1.0); here it
    is 1.01, the optimum's neighbour, whose measurement leaves the optimum itself no clear win to offer."""
    from kernelscout.agent.graph import SOLVED
    from kernelscout.tools.predict import CLEAR_WIN

    result = start_search(problem=None, space=str(_v_space(tmp_path)), budget=600, seed=1, run_dir=str(tmp_path / "run"), quiet=True,
                          report=False)
    assert result.best_runtime_ms * (1 - CLEAR_WIN) <= 1.0
    assert result.measurements_used < 150
    assert result.stop_reason.startswith(SOLVED) and "chance, together" in result.stop_reason
    assert result.continue_with == f"kscout resume {tmp_path / 'run'} --solved-chance 0" and result.continue_with in result.stop_reason
    # the same stop for scripts (`--json`), the chance that stopped it under the setting's value
    assert (result.stop.kind, result.stop.setting, result.stop.value) == ("solved", "solved_chance", 0.05)
    assert 0 < result.stop.chance < 0.05 and f"a {result.stop.chance * 100:.3g} % chance" in result.stop_reason


@pytest.mark.parametrize("seed", [1, 3])
def test_a_solved_search_resumed_spends_nothing_until_its_stop_is_lowered(tmp_path, seed):
    """The stop is decided from the iteration's screen before anything is measured, so a search that spent its
    budget while already solved stops at once when the budget is raised, and `--solved-chance 0` goes on. The resume
    screens afresh and finds the very chance the uninterrupted search stopped on, since it replays the surrogate's fits
    (fitted once on everything, seed 3's resume measured on to the raised budget)."""
    from kernelscout.agent.graph import BUDGET_SPENT, SOLVED

    space = _v_space(tmp_path)
    solved = start_search(problem=None, space=str(space), budget=600, seed=seed, run_dir=str(tmp_path / "solved"), quiet=True, report=False)
    again = resume_search(str(tmp_path / "solved"), quiet=True)
    assert again.measurements_used == solved.measurements_used and again.stop_reason == solved.stop_reason
    with pytest.raises(OptimizeError, match=r"--set 700 && kscout resume \S+ --solved-chance 0`"):  # a larger budget alone would not do
        start_search(problem=None, space=str(space), budget=700, seed=seed, run_dir=str(tmp_path / "solved"), quiet=True, report=False)

    run_dir = str(tmp_path / "run")  # the same search, whose budget ends where the other one stopped as solved
    spent = start_search(problem=None, space=str(space), budget=solved.measurements_used, seed=seed, run_dir=run_dir, quiet=True, report=False)
    assert spent.stop_reason == BUDGET_SPENT and spent.best_runtime_ms == solved.best_runtime_ms and spent.stop.kind == "budget"
    Budget(RunDir(run_dir)).set_cap(solved.measurements_used + 3)
    raised = resume_search(run_dir, quiet=True)
    assert raised.stop_reason.startswith(SOLVED) and raised.measurements_used == solved.measurements_used
    assert raised.stop.chance == solved.stop.chance

    lowered = resume_search(run_dir, quiet=True, solved_chance=0)
    assert lowered.stop_reason == BUDGET_SPENT and lowered.measurements_used == solved.measurements_used + 3


def test_a_resumed_search_weighs_what_is_left_as_the_search_that_stopped_did(tmp_path):
    """The chance sums the configurations never proposed and those still in the queue or shelved, all read from
    run.db, so a resume, whose policy starts afresh, gets about the figure the stop gave (it summed only the shelved
    ones once, 0.00 % against 3.2 %, and stopped at once): a threshold lowered below that figure goes on. One lowered
    but still above it does not: nothing was measured since, so the figure the stop gave stands."""
    import shutil

    from kernelscout.agent.graph import SOLVED
    from kernelscout.agent.search_spec import SOLVED_CHANCE

    solved = start_search(problem=None, space=str(_v_space(tmp_path)), budget=600, seed=1, run_dir=str(tmp_path / "run"), quiet=True,
                          report=False)
    chance = solved.stop.chance
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    below = resume_search(str(tmp_path / "run"), quiet=True, solved_chance=chance / 2)
    above = resume_search(str(tmp_path / "copy"), quiet=True, solved_chance=(chance + SOLVED_CHANCE) / 2)
    assert below.measurements_used > solved.measurements_used
    assert above.measurements_used == solved.measurements_used and above.stop_reason.startswith(SOLVED)
    said = [json.loads(line) for line in (tmp_path / "copy" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "stop" and e["reason"].startswith("still solved") for e in said)  # why it did not go on


def _measured_whole_and_cut(tmp_path: Path, space: str, seed: int, cut: int, budget: int) -> tuple[list[str], list[str]]:
    """The configurations a search measured in order, uninterrupted, and cut short by its budget at `cut` and resumed
    with it raised to `budget`."""
    settings = dict(problem=None, space=space, seed=seed, quiet=True, report=False, solved_chance=0)
    start_search(budget=budget, run_dir=str(tmp_path / "whole"), **settings)
    start_search(budget=cut, run_dir=str(tmp_path / "cut"), **settings)
    Budget(RunDir(tmp_path / "cut")).set_cap(budget)
    resume_search(str(tmp_path / "cut"), quiet=True)

    def measured(folder: str) -> list[str]:
        with reading(tmp_path / folder / "run.db") as db:
            return [row[0] for row in db.execute("SELECT candidate_path FROM measurements WHERE charged = 1 ORDER BY id")]

    return measured("whole"), measured("cut")


def test_a_search_cut_short_by_its_budget_and_resumed_measures_what_the_uninterrupted_one_did(tmp_path):
    """The resume replays the measurements into the surrogate with the fits the search made between them, so its
    forecasts are the ones the search would have made (fitted once on everything, the V-shaped space's search went
    elsewhere after the resume). On a space small enough to be screened whole, nothing else differs."""
    whole, resumed = _measured_whole_and_cut(tmp_path, str(_v_space(tmp_path)), seed=1, cut=12, budget=30)
    assert len(whole) == 30 and resumed == whole


@needs_hub
def test_a_resumed_search_of_a_space_too_large_to_screen_whole_measures_what_the_uninterrupted_one_did(tmp_path):
    """A space larger than the screen's pool is ranked in parts, the best of each ranking carried into the next; that
    memory rides in the loop's checkpoint, so a search cut short and resumed goes on as if never cut (before, it measured
    another configuration right after the resume)."""
    whole, resumed = _measured_whole_and_cut(tmp_path, str(SPACE), seed=300, cut=20, budget=26)
    assert len(whole) == 26 and resumed == whole


def test_a_search_killed_between_its_screen_and_its_stop_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch):
    """The solved stop reads the chance its policy summed in that iteration's screen. A kill after the screen's
    checkpoint and before the stop leaves the resumed search at the next step with a new policy, which must take that
    chance up from the checkpoint: without it, the search measured on past the stop."""
    from kernelscout.agent.graph import SOLVED, SearchLoop

    space = str(_v_space(tmp_path))
    whole = start_search(problem=None, space=space, budget=600, seed=1, run_dir=str(tmp_path / "whole"), quiet=True, report=False)
    assert whole.stop_reason.startswith(SOLVED)

    predict = SearchLoop.predict

    def killed_at_the_stop(self, state):
        if self._solved():
            raise KeyboardInterrupt  # as a kill would: the screen is checkpointed, the stop not yet taken
        return predict(self, state)

    monkeypatch.setattr(SearchLoop, "predict", killed_at_the_stop)
    _killed_then_resumed_stops_as(whole, tmp_path, space, undo=lambda: monkeypatch.setattr(SearchLoop, "predict", predict))


def _killed_then_resumed_stops_as(whole, tmp_path: Path, space: str, undo) -> None:
    """The V-shaped space's search of seed 1, killed where the test's patches kill it, then (`undo` having lifted
    them) resumed: it stops where the uninterrupted search `whole` did, with the same reason."""
    with pytest.raises(KeyboardInterrupt):
        start_search(problem=None, space=space, budget=600, seed=1, run_dir=str(tmp_path / "killed"), quiet=True, report=False)
    undo()
    resumed = resume_search(str(tmp_path / "killed"), quiet=True)

    assert resumed.measurements_used == whole.measurements_used
    assert resumed.stop_reason == whole.stop_reason.replace(str(tmp_path / "whole"), str(tmp_path / "killed"))


def test_a_search_killed_before_its_screens_checkpoint_was_written_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch):
    """A kill can land after the screen's writes are saved and before its checkpoint is: the resumed search then takes
    the screen's result from the saved writes without running it again, and its policy must take that step's memory
    from there too, not from the checkpoint before, which holds the previous screen's chance of a faster configuration."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from kernelscout.agent.graph import SOLVED, SearchLoop

    space = str(_v_space(tmp_path))
    put_writes, put, predict = SqliteSaver.put_writes, SqliteSaver.put, SearchLoop.predict
    screens = {"count": 0, "kill_after": None, "killing": False}

    def counting_writes(self, config, writes, task_id, task_path=""):
        put_writes(self, config, writes, task_id, task_path)
        if any(channel == "policy_state" for channel, _ in writes):
            screens["count"] += 1
            screens["killing"] = screens["count"] == screens["kill_after"]

    def lost_while_killing(self, config, *args, **kwargs):
        return config if screens["killing"] else put(self, config, *args, **kwargs)  # the kill took the write with it

    def killed(self, state):
        if screens["killing"]:
            raise KeyboardInterrupt
        return predict(self, state)

    monkeypatch.setattr(SqliteSaver, "put_writes", counting_writes)
    monkeypatch.setattr(SqliteSaver, "put", lost_while_killing)
    monkeypatch.setattr(SearchLoop, "predict", killed)
    whole = start_search(problem=None, space=space, budget=600, seed=1, run_dir=str(tmp_path / "whole"), quiet=True, report=False)
    assert whole.stop_reason.startswith(SOLVED)
    screens.update(count=0, kill_after=screens["count"])  # the last screen, the one whose chance stopped the search
    _killed_then_resumed_stops_as(whole, tmp_path, space, undo=lambda: screens.update(kill_after=None, killing=False))


def test_a_snapshot_that_lists_the_killed_screen_as_a_task_gives_the_policy_that_screens_memory():
    """LangGraph 1.2 applies a finished step's saved writes to the live snapshot's values (the test above); a version
    whose snapshot lists that step as a task with its result instead must give the same memory, not the checkpoint's
    older one."""
    from types import SimpleNamespace

    from kernelscout.agent.graph import SearchLoop

    class Policy:
        loaded = None

        def load_state_dict(self, state):
            self.loaded = state

    def restored(values, tasks):
        loop = SimpleNamespace(policy=Policy())
        SearchLoop._restore_policy(loop, SimpleNamespace(values=values, tasks=tasks))
        return loop.policy.loaded

    older, newer = {"chance_left": 0.2}, {"chance_left": 0.01}
    screen = SimpleNamespace(name="propose", result={"policy_state": newer})
    assert restored({"policy_state": older}, [screen]) == newer
    assert restored({"policy_state": older}, [SimpleNamespace(name="measure", result={"policy_state": newer})]) == older
    assert restored({"policy_state": older}, [SimpleNamespace(name="propose", result=None)]) == older  # not run yet
    assert restored(None, []) is None  # a new search: nothing to take up


def test_a_flat_space_is_not_called_solved_before_the_surrogate_has_seen_enough(tmp_path):
    """500 configurations within 1 % of each other but one, twice as fast: a handful of timings make the surrogate
    sure of a flat space, the lone fast one included, so the stop waits for SOLVED_AFTER measurements."""
    from kernelscout.agent.graph import SOLVED, SOLVED_AFTER

    values = list(range(1, 501))
    space = tmp_path / "needle.json"
    space.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": ["bs"], "objective": "time",
                                 "tune_params": {"bs": values},
                                 "cache": {str(v): {"bs": v, "time": 0.5 if v == 400 else 1 + (v * 7919 % 100) / 10_000} for v in values}}))
    result = start_search(problem=None, space=str(space), budget=100, seed=2, run_dir=str(tmp_path / "run"), quiet=True, report=False)
    assert result.stop_reason.startswith(SOLVED) and result.measurements_used == SOLVED_AFTER


@needs_hub
def test_surrogate_none_measures_everything_it_considers(tmp_path):
    result = start_search(problem=None, space=str(SPACE), budget=8, surrogate="none", run_dir=str(tmp_path / "run"), quiet=True)
    assert result.measurements_used == 8
    assert result.considered_per_measurement <= 1.5


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(OptimizeError, match="either a PROBLEM"):
        start_search(problem=None, space=None, budget=3)
    with pytest.raises(OptimizeError, match="no such problem"):
        start_search(problem=str(tmp_path / "nope.py"), space=None, budget=3)
    with pytest.raises(OptimizeError, match="not a run directory"):
        resume_search(str(tmp_path))
    with pytest.raises(OptimizeError, match="--solved-chance is a chance, from 0"):
        start_search(problem=None, space=str(_v_space(tmp_path)), budget=3, solved_chance=1.5)


def _charged_keys(run_dir: Path) -> list[str]:
    db = sqlite3.connect(run_dir / "run.db")
    return [r[0] for r in db.execute("SELECT key FROM measurements WHERE charged = 1")]


def _measurement_ids(run_dir: Path) -> set[int]:
    if not (run_dir / "run.db").exists():
        return set()
    db = sqlite3.connect(run_dir / "run.db")
    try:
        return {r[0] for r in db.execute("SELECT id FROM measurements")}
    except sqlite3.OperationalError:
        return set()


@needs_hub
@pytest.mark.slow
def _wait_for_progress(proc: subprocess.Popen, events: Path, timeout: float = 120.0) -> None:
    """Return once the events log has grown (or the process ended)."""
    start = events.stat().st_size if events.exists() else 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if events.exists() and events.stat().st_size > start:
            return
        time.sleep(0.05)


def test_kill_nine_then_resume_loses_nothing_and_never_overspends(tmp_path):
    run_dir = tmp_path / "run"
    budget = 150
    rng = random.Random(7)
    # --surrogate none measures whole batches, so kills land between and inside multi-measurement steps
    cmd = [sys.executable, "-m", "kernelscout", "optimize", "--space", str(SPACE), "--budget", str(budget), "--run-dir", str(run_dir),
           "--surrogate", "none", "--confirm", "3", "--json"]
    kills = 0
    seen: set[int] = set()
    for attempt in range(6):
        proc = subprocess.Popen(cmd if attempt == 0 else [sys.executable, "-m", "kernelscout", "resume", str(run_dir), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            # Kill at a random moment once this attempt has made progress: start-up time (imports)
            # varies with machine load, and a kill before any progress tests nothing.
            _wait_for_progress(proc, run_dir / "events.jsonl")
            proc.wait(timeout=rng.uniform(0.2, 2.5))
            out = proc.stdout.read()
            break
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            before = _measurement_ids(run_dir)
            assert seen <= before, "a measurement that finished before an earlier kill disappeared"
            seen = before
    else:
        proc = subprocess.run([sys.executable, "-m", "kernelscout", "resume", str(run_dir), "--json"], capture_output=True, text=True, timeout=600)
        out = proc.stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert kills >= 1, "the run finished before it could be killed; lengthen the budget"
    assert result["measurements_used"] <= budget
    assert seen <= _measurement_ids(run_dir)
    keys = _charged_keys(run_dir)
    assert len(keys) == len(set(keys)), "a measurement was paid for twice"
    status = Budget(RunDir(run_dir)).status()
    assert status.used <= budget and status.reserved == 0
    with sqlite3.connect(run_dir / "run.db") as db:  # the re-measurements at the end, each spent once
        assert db.execute("SELECT COUNT(*) FROM confirmations").fetchone()[0] == 3


def _interrupted_after_3_measurements(cmd: list[str], run_dir: Path, sig: int = signal.SIGINT) -> tuple[subprocess.Popen, str, str]:
    """Run `cmd` (a search) and press Ctrl-C (or send `sig`) once it has 3 measurements: the process, its stdout and stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_from_a_terminal)
    deadline = time.monotonic() + 120
    while len(_measurement_ids(run_dir)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc, out, err


@needs_hub
def test_ctrl_c_once_the_result_is_printed_leaves_the_exit_code_and_says_nothing_more(tmp_path):
    # the interpreter's teardown after the result took a few tenths of a second, and a Ctrl-C then ended the
    # process by SIGINT (-2, nothing said) or in a traceback from `threading`, after a search that had finished
    cmd = [sys.executable, "-m", "kernelscout", "optimize", "--space", str(SPACE), "--budget", "5", "--run-dir",
           str(tmp_path / "run"), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_from_a_terminal)
    result = json.loads(proc.stdout.readline())
    while proc.poll() is None:  # pressed again and again until it has gone
        proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
    err = proc.stderr.read()
    assert result["status"] == "finished" and result["measurements_used"] == 5
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "interrupted" not in err


@needs_hub
def test_ctrl_c_says_where_the_run_stands_and_resume_finishes_it(tmp_path):
    run_dir = tmp_path / "run"
    budget = 3000  # far more than it can spend before the interrupt, however fast the machine
    cmd = [sys.executable, "-m", "kernelscout", "optimize", "--space", str(SPACE), "--budget", str(budget), "--run-dir", str(run_dir),
           "--surrogate", "none", "--json"]
    proc, out, err = _interrupted_after_3_measurements(cmd, run_dir)

    assert proc.returncode == 130, (out, err)
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["status"] == "interrupted" and stopped["run_dir"] == str(run_dir) and stopped["budget"] == budget
    assert stopped["continue_with"] == f"kscout resume {run_dir}"
    used = stopped["measurements_used"]
    assert 3 <= used < budget and used == Budget(RunDir(run_dir)).status().used
    assert f"of {budget} measurements; nothing measured is lost. Continue with: kscout resume {run_dir}" in " ".join(err.split())
    Budget(RunDir(run_dir)).set_cap(used + 5)  # as `kscout budget RUN_DIR --set` would
    done = subprocess.run([sys.executable, "-m", "kernelscout", "resume", str(run_dir), "--json"], capture_output=True, text=True, timeout=600)
    assert json.loads(done.stdout.strip().splitlines()[-1])["measurements_used"] == used + 5


@needs_hub
def test_sigterm_from_a_scheduler_also_says_how_to_go_on(tmp_path):
    # what `timeout`, systemd or a batch scheduler sends; the log of an overnight run is all its user reads
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "kernelscout", "optimize", "--space", str(SPACE), "--budget", "3000", "--run-dir", str(run_dir),
           "--surrogate", "none"]
    proc, out, err = _interrupted_after_3_measurements(cmd, run_dir, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    used = Budget(RunDir(run_dir)).status().used
    assert f"interrupted after {used} of 3000 measurements; nothing measured is lost. Continue with: kscout resume {run_dir}" \
        in " ".join(err.split())


@needs_hub
def test_raising_the_cap_of_a_finished_search_and_resuming_goes_on_from_where_it_stopped(tmp_path):
    run_dir = tmp_path / "run"
    first = start_search(problem=None, space=str(SPACE), budget=6, run_dir=str(run_dir), quiet=True)
    assert first.stop_reason == "measurement budget spent" and first.measurements_used == 6
    assert resume_search(str(run_dir), quiet=True).measurements_used == 6  # nothing to go on with: a no-op
    Budget(RunDir(run_dir)).set_cap(10)  # as `kscout budget RUN_DIR --set 10` would
    more = resume_search(str(run_dir), quiet=True)
    assert more.stop_reason == "measurement budget spent" and more.measurements_used == 10
    assert len(set(_charged_keys(run_dir))) == 10  # four new configurations, none measured twice
    assert more.best_runtime_ms <= first.best_runtime_ms
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events.count("continue") == 1


@needs_hub
def test_a_search_stopped_by_a_limit_says_how_to_go_on_and_resume_with_a_higher_limit_does(tmp_path):
    run_dir = tmp_path / "run"
    first = start_search(problem=None, space=str(SPACE), budget=30, run_dir=str(run_dir), quiet=True, patience=3)
    assert first.stop_reason == "no new best in 3 measurements" and first.measurements_used < 30
    assert first.continue_with == f"kscout resume {run_dir} --patience 6"
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    shown = CliRunner().invoke(app, ["show", str(run_dir)], env={"COLUMNS": "300"}).output
    assert any(line.split() == ["to", "search", "on", "kscout", "resume", str(run_dir), "--patience", "6"]
               for line in shown.splitlines()), shown  # and `kscout show` says it again later
    # the same limit again changes nothing; a higher one (here: none) goes on to the budget
    assert resume_search(str(run_dir), quiet=True, patience=3).measurements_used == first.measurements_used
    more = resume_search(str(run_dir), quiet=True, patience=0)
    assert more.stop_reason == "measurement budget spent" and more.measurements_used == 30
    assert len(set(_charged_keys(run_dir))) == 30  # none measured twice
    assert more.continue_with == f"kscout budget {run_dir} --set 60 && kscout resume {run_dir}"


@needs_hub
def test_a_wall_clock_limit_raised_on_resume_does_not_count_the_time_between(tmp_path):
    run_dir = tmp_path / "run"
    first = start_search(problem=None, space=str(SPACE), budget=6, run_dir=str(run_dir), quiet=True, max_wall=1e-6)
    assert first.stop_reason.startswith("wall-clock limit") and first.measurements_used < 6
    assert first.continue_with == f"kscout resume {run_dir} --max-wall 2e-06"
    time.sleep(4)  # longer than the new limit: counted, it would stop the search at once
    more = resume_search(str(run_dir), quiet=True, max_wall=3.5)  # the rest of the cold start takes well under a second
    assert more.stop_reason == "measurement budget spent" and more.measurements_used == 6


@needs_hub
def test_a_finished_search_that_goes_on_days_later_is_not_stopped_by_a_wall_clock_limit_it_never_reached(tmp_path):
    run_dir = tmp_path / "run"
    first = start_search(problem=None, space=str(SPACE), budget=6, run_dir=str(run_dir), quiet=True, max_wall=3.0, patience=1)
    assert first.stop_reason == "no new best in 1 measurements" and first.measurements_used < 6
    time.sleep(4)  # the run lies finished longer than its wall-clock limit
    more = resume_search(str(run_dir), quiet=True, patience=0)
    assert more.stop_reason == "measurement budget spent" and more.measurements_used == 6


@needs_hub
def test_a_killed_search_resumed_later_does_not_count_the_time_it_lay_dead_against_its_wall_clock_limit(tmp_path):
    run_dir = tmp_path / "run"
    budget, limit = 3000, 20  # the part before the interrupt takes a second or two of the 20 s
    cmd = [sys.executable, "-m", "kernelscout", "optimize", "--space", str(SPACE), "--budget", str(budget), "--run-dir", str(run_dir),
           "--surrogate", "none", "--max-wall", str(limit), "--json"]
    proc, out, err = _interrupted_after_3_measurements(cmd, run_dir)
    assert proc.returncode == 130, (out, err)
    used = Budget(RunDir(run_dir)).status().used
    time.sleep(limit + 1)  # the run lies killed longer than its whole wall-clock limit
    Budget(RunDir(run_dir)).set_cap(used + 30)  # several iterations: the limit is checked after each
    done = subprocess.run([sys.executable, "-m", "kernelscout", "resume", str(run_dir), "--json"], capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # counted, the dead time would stop it after the step the kill interrupted
    assert result["measurements_used"] == used + 30, result


@needs_hub
def test_kscout_prints_how_to_search_on_and_resume_takes_the_new_limit(tmp_path):
    from test_space_usage_errors import assert_usage_error, kscout

    run_dir = tmp_path / "run"
    stopped = kscout("optimize", "--space", str(SPACE), "--budget", "20", "--patience", "2", "--run-dir", str(run_dir))
    assert stopped.exit_code == 0, stopped.output
    assert f"to search on: kscout resume {run_dir} --patience 4\n" in stopped.output  # whole, on one line to copy
    assert str(run_dir) in "".join(stopped.output.split())  # the table folds a long path, never cuts it short
    assert_usage_error(kscout("resume", str(run_dir), "--max-usd", "0"), "--max-usd must be more than 0")
    more = kscout("resume", str(run_dir), "--patience", "0", "--json")
    assert more.exit_code == 0, more.output
    assert json.loads(more.output)["measurements_used"] == 20


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(UNSEEN.glob("*.py")), ids=lambda p: p.stem)
def test_unseen_kernelbench_problems_run_to_completion_and_report_honestly(problem, tmp_path):
    result = start_search(problem=str(problem), space=None, budget=2, device="cpu", run_dir=str(tmp_path / "run"), quiet=True)
    assert result.status == "finished"
    assert result.measurements_used <= 2
    if not clear_gain(result.best_speedup):
        assert "nothing beat" in result.message or "reference stands" in result.message
        assert result.best_path is None and not (tmp_path / "run" / "best.py").exists()  # no regression to copy
    else:
        assert Path(result.best_path).exists()
        assert f"{result.best_speedup:.3f}x" in result.message


SLEEPS = """
import time
import torch
import torch.nn as nn

class Model{new}(nn.Module):
    def forward(self, x):
        time.sleep({seconds})  # a problem bound by something no kernel changes
        return x + 1

def get_inputs():
    return [torch.randn(16, 16)]

def get_init_inputs():
    return []
"""


def test_a_best_a_fraction_of_a_percent_faster_is_a_tie_not_a_kernel_to_copy(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(SLEEPS.format(new="", seconds=0.05))
    tie = tmp_path / "tie.py"
    tie.write_text(SLEEPS.format(new="New", seconds=0.0498).split("def get_inputs")[0])
    result = start_search(problem=str(problem), space=None, budget=1, device="cpu", run_dir=str(tmp_path / "run"),
                          quiet=True, confirm=0, start=[str(tie)], policy="tuner", surrogate="none")
    assert result.search_speedup is not None and 1.0 < result.search_speedup < 1.01, result.message
    assert "nothing clearly beat the reference" in result.message and "the reference stands" in result.message
    assert result.best_path is None and not (tmp_path / "run" / "best.py").exists()


def test_a_measurement_killed_while_it_held_the_last_of_the_budget_is_taken_up_on_resume(tmp_path, monkeypatch):
    from kernelscout.agent.runner import SearchInterrupted
    from kernelscout.sandbox.replay import ReplayDevice
    from test_space_usage_errors import timed, write_cache

    space, run_dir = write_cache(tmp_path / "k.json", timed(8)), tmp_path / "run"
    real, calls = ReplayDevice.measure, []

    def dies_in_the_second(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # reserved, not yet settled: the last unit of the budget is in flight
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ReplayDevice, "measure", dies_in_the_second)
    with pytest.raises(SearchInterrupted, match="1 of them in flight"):
        start_search(problem=None, space=str(space), budget=2, run_dir=str(run_dir), quiet=True)
    monkeypatch.setattr(ReplayDevice, "measure", real)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with RunDir(run_dir).transaction() as db:  # as if that process had been killed with it
        db.execute("UPDATE ledger SET owner_pid = ? WHERE state = 'reserved'", (dead.pid,))
    assert Budget(RunDir(run_dir)).status().remaining == 0

    result = resume_search(str(run_dir), quiet=True)

    status = Budget(RunDir(run_dir)).status()
    assert (result.measurements_used, status.used, status.reserved) == (2, 2, 0)
    with sqlite3.connect(run_dir / "run.db") as db:
        assert db.execute("SELECT COUNT(*) FROM measurements WHERE charged = 1").fetchone()[0] == 2


def test_the_last_measurement_of_the_budget_stored_but_not_recorded_before_a_kill_is_taken_up_on_resume(tmp_path, monkeypatch):
    """A kill between the ledger storing the budget's last measurement and the search recording it: the resume
    found no room and stopped, and that paid measurement belonged to no candidate (missing from best, report
    and counts). The resume now takes it up free, and ends where the uninterrupted search ends."""
    from kernelscout.agent.graph import SearchLoop
    from kernelscout.agent.runner import SearchInterrupted
    from test_space_usage_errors import write_cache

    space = write_cache(tmp_path / "k.json", {v: 2.0 - 0.1 * v for v in range(12)})
    straight = start_search(problem=None, space=str(space), budget=6, run_dir=str(tmp_path / "straight"), quiet=True, confirm=0)
    run_dir = tmp_path / "run"
    real = SearchLoop._record

    def dies_recording_the_last(self, rec, m, *args, **kwargs):
        if Budget(self.run).status().used == 6:
            raise KeyboardInterrupt  # stored and charged in the ledger; the search never records it
        return real(self, rec, m, *args, **kwargs)

    monkeypatch.setattr(SearchLoop, "_record", dies_recording_the_last)
    with pytest.raises(SearchInterrupted):
        start_search(problem=None, space=str(space), budget=6, run_dir=str(run_dir), quiet=True, confirm=0)
    monkeypatch.setattr(SearchLoop, "_record", real)

    result = resume_search(str(run_dir), quiet=True)

    with sqlite3.connect(run_dir / "run.db") as db:
        unrecorded = db.execute("SELECT COUNT(*) FROM measurements WHERE charged = 1 AND id NOT IN "
                                "(SELECT measurement_id FROM candidates WHERE measurement_id IS NOT NULL)").fetchone()[0]
    assert unrecorded == 0 and result.measurements_used == Budget(RunDir(run_dir)).status().used == 6
    assert result.best_runtime_ms == straight.best_runtime_ms and result.best_speedup == straight.best_speedup


def _grid_space(folder: Path, name: str, device: str, time_of) -> Path:
    """Two parameters, 8 x 8 values; `time_of(a, b)` gives each configuration's time."""
    values = [1, 2, 3, 4, 5, 6, 7, 8]
    space = folder / f"{name}.json"
    cache = {f"{a},{b}": {"a": a, "b": b, "time": time_of(a, b)} for a in values for b in values}
    space.write_text(json.dumps({"device_name": device, "kernel_name": "k", "tune_params_keys": ["a", "b"], "objective": "time",
                                 "tune_params": {"a": values, "b": values}, "cache": cache}))
    return space


def test_a_warm_started_search_measures_first_what_the_other_gpu_ran_fastest(tmp_path):
    """The design of a warm-started search begins at the three configurations the other device ran fastest: the
    surrogate cannot use the prior before this device has timed 8 configurations, and a space-filling design alone
    would spend those on configurations the prior already says are slow. A cold search of the same space and seed
    starts elsewhere, so it is the warm start that put them first."""
    here = _grid_space(tmp_path, "k_here", "GPU here", lambda a, b: 1.0 + 0.3 * abs(a - 6) + 0.2 * abs(b - 3))
    there = _grid_space(tmp_path, "k_there", "GPU there", lambda a, b: 2.0 + 0.1 * abs(a - 7) + 0.3 * abs(b - 2) + 0.01 * a)
    fastest_there = [(7, 2), (6, 2), (8, 2)]  # 2.06, 2.16, 2.18; (7, 1) and (7, 3) take 2.37

    def first_measured(run: Path, n: int) -> tuple[list[tuple[int, int]], list[str]]:
        with reading(run / "run.db") as db:
            rows = db.execute("SELECT c.params_json, c.hypothesis FROM candidates c JOIN measurements m ON m.id = c.measurement_id "
                              "WHERE m.charged = 1 ORDER BY m.id LIMIT ?", (n,)).fetchall()
        return [(json.loads(p)["a"], json.loads(p)["b"]) for p, _ in rows], [h for _, h in rows]

    start_search(problem=None, space=str(here), budget=4, seed=2, run_dir=str(tmp_path / "warm"), quiet=True, report=False,
                 warm_start=[str(there)])
    configs, said = first_measured(tmp_path / "warm", 3)
    assert configs == fastest_there
    assert all(s.startswith("warm start: among the 3 fastest on k_there (GPU there)") for s in said)
    start_search(problem=None, space=str(here), budget=4, seed=2, run_dir=str(tmp_path / "cold"), quiet=True, report=False)
    assert not set(first_measured(tmp_path / "cold", 3)[0]) & set(fastest_there)
