"""Bad input to a search fails before anything is spent: exit 2, a message saying what to do, no traceback,
and no run directory left behind that `kscout resume` would fail on again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GOOD_CANDIDATE, SMALL_PROBLEM
from test_space_usage_errors import assert_usage_error, kscout, timed, write_cache

LLM_ENV = ("KSCOUT_PROVIDER", "KSCOUT_MODEL", "KSCOUT_BASE_URL", "KSCOUT_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY")


@pytest.fixture
def problem(tmp_path: Path) -> Path:
    path = tmp_path / "problem.py"
    path.write_text(SMALL_PROBLEM)
    return path


@pytest.fixture
def no_llm(monkeypatch):
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("flag", ["--policy", "--surrogate"])
def test_an_llm_asked_for_without_a_provider_is_refused_before_the_run_exists(problem, tmp_path, no_llm, flag):
    run = tmp_path / "run"
    result = kscout("optimize", str(problem), "--budget", "3", flag, "llm", "--run-dir", str(run))
    assert_usage_error(result, "needs a model provider", "KSCOUT_PROVIDER", "[llm]")  # the bracketed section name survives
    assert not run.exists()


def test_kscout_run_checks_the_provider_once_up_front(problem, tmp_path, no_llm):
    run = tmp_path / "night"
    assert_usage_error(kscout("run", str(problem), "--policy", "llm", "--run-dir", str(run)), "needs a model provider")
    assert not run.exists()


@pytest.mark.parametrize("args, phrase", [
    (["--proposals", "0"], "--proposals must be at least 1"),
    (["--patience", "-2"], "--patience must be 0"),
    (["--max-wall", "-5"], "--max-wall must be more than 0"),
    (["--max-device-seconds", "0"], "--max-device-seconds must be more than 0"),
    (["--max-usd", "-1"], "--max-usd must be more than 0"),
    (["--max-tokens", "-5"], "--max-tokens must be more than 0"),
])
def test_a_limit_that_would_stop_the_search_at_once_is_refused(problem, tmp_path, args, phrase):
    run = tmp_path / "run"
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(run), *args), phrase)
    assert not run.exists()


@pytest.mark.parametrize("command", ["optimize", "run"])
def test_a_negative_seed_is_refused_before_the_run_exists(problem, tmp_path, command):
    # it failed deep in numpy: a traceback from optimize, and in `kscout run` every problem in turn, the folder spent
    run = tmp_path / "run"
    assert_usage_error(kscout(command, str(problem), "--run-dir", str(run), "--seed", "-1"), "--seed")
    assert not run.exists()


@pytest.mark.parametrize("device", ["gpu", "cuda:99", "cuda:x"])  # cuda:x: once printed as an emoji
def test_kscout_run_checks_the_device_once_up_front(problem, tmp_path, device):
    run = tmp_path / "night"
    assert_usage_error(kscout("run", str(problem), "--device", device, "--run-dir", str(run)), f"--device {device}")
    assert not run.exists()


def test_a_run_directory_that_is_a_file_is_a_usage_error_everywhere(problem, tmp_path):
    file = tmp_path / "afile"
    file.write_text("")
    candidate = tmp_path / "candidate.py"
    candidate.write_text(GOOD_CANDIDATE)
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(file)), "is a file, not a folder")
    assert_usage_error(kscout("run", str(problem), "--run-dir", str(file)), "is a file, not a folder")
    measured = kscout("measure", str(problem), str(candidate), "--run-dir", str(file), "--json")
    assert measured.exit_code == 2 and "is a file, not a folder" in json.loads(measured.stdout)["message"]


def test_a_run_directory_path_too_long_for_sqlite_says_so(problem, tmp_path):
    """Not "give a folder you can write to", which is what SQLite's own error read as: the folder is fine."""
    deep = tmp_path.joinpath(*["d" * 120] * 4)
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(deep)), "is too long a path for the run's database")


def test_the_top_folder_of_a_multi_problem_run_is_no_run_directory_for_one_search(problem, tmp_path):
    # what optimize, measure or serve wrote there could not be reached again: show, budget and resume read it as
    # the multi-problem run
    from kernelscout.sandbox.replay import recorded_spaces_dir

    night = tmp_path / "night"
    assert kscout("run", str(recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"), "--budget", "2", "--run-dir", str(night),
                  "--json").exit_code == 0
    before = sorted(p.name for p in night.iterdir())
    candidate = tmp_path / "candidate.py"
    candidate.write_text(GOOD_CANDIDATE)
    said = "is a multi-problem run (kscout run)"
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(night), "--budget", "1"), said)
    assert_usage_error(kscout("serve", "--device", "cpu", "--run-dir", str(night)), said)
    measured = kscout("measure", str(problem), str(candidate), "--run-dir", str(night), "--json")
    assert measured.exit_code == 2 and said in json.loads(measured.stdout)["message"]
    assert sorted(p.name for p in night.iterdir()) == before  # no run.db, no kernels/


def test_a_run_directory_that_cannot_be_made_is_a_usage_error_not_a_traceback(problem, tmp_path):
    inside_a_file = tmp_path / "afile" / "run"
    inside_a_file.parent.write_text("")
    candidate = tmp_path / "candidate.py"
    candidate.write_text(GOOD_CANDIDATE)
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(inside_a_file)), "cannot be used as a run directory")
    measured = kscout("measure", str(problem), str(candidate), "--run-dir", str(inside_a_file), "--json")
    assert measured.exit_code == 2 and "cannot be used as a run directory" in json.loads(measured.stdout)["message"]


def test_bad_measure_numbers_are_named_by_their_flags(problem, tmp_path):
    result = kscout("measure", str(problem), str(problem), "--timeout", "-1", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"status": "failed", "message": "--timeout: input should be greater than 0"}


def test_a_search_on_a_problem_whose_reference_raises_fails_and_says_so(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text(SMALL_PROBLEM.replace("def forward(self, x, y):", "def forward(self, x, y):\n        raise RuntimeError('reference broken')"))
    assert "reference broken" in broken.read_text()
    result = kscout("optimize", str(broken), "--budget", "3", "--run-dir", str(tmp_path / "run"), "--json")
    assert result.exit_code == 2, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "failed" and out["measurements_used"] == 0
    assert "the problem cannot be measured" in out["stop_reason"] and "reference broken" in out["stop_reason"]
    # `kscout show` says the same, and does not suggest resuming what cannot be measured
    shown = json.loads(kscout("show", str(tmp_path / "run"), "--json").stdout)
    assert shown["status"] == "failed" and "reference broken" in shown["stop_reason"]
    text = kscout("show", str(tmp_path / "run")).output
    assert "failed" in text and "kscout resume" not in text


def test_a_resume_of_a_folder_a_kill_left_before_the_search_began_says_to_start_it_again(tmp_path):
    (tmp_path / "killed early").mkdir()  # what a kill before run.db was made leaves
    assert_usage_error(kscout("resume", str(tmp_path / "killed early")), "nothing in it to resume", "start it again")
    assert_usage_error(kscout("resume", str(tmp_path / "never made")), "no such run directory")


def test_a_resume_while_the_search_is_still_running_is_refused(tmp_path):
    from kernelscout.agent.run_view import view_run

    run = tmp_path / "run"
    space = write_cache(tmp_path / "k.json", timed(8))
    assert kscout("optimize", "--space", str(space), "--budget", "3", "--run-dir", str(run), "--json").exit_code == 0
    before = view_run(run)
    holding = subprocess.Popen([sys.executable, "-c", "import time\nfrom kernelscout.tools.runlock import exclusive\n"
                                f"with exclusive({str(run)!r}, 'kscout search'):\n    print('held', flush=True)\n    time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline().strip() == "held"
        assert view_run(run).status == "running"
        assert_usage_error(kscout("resume", str(run)), "still running", "kscout search")
        assert_usage_error(kscout("optimize", "--space", str(space), "--budget", "3", "--run-dir", str(run)), "still running")
    finally:
        holding.kill()
        holding.wait()
    after = view_run(run)  # the refused commands changed nothing, and the folder is free again
    assert after.status == "finished" and after.budget == before.budget


@pytest.mark.parametrize("mode, said", [("LOCK_EX", "in use by a search that is still running (just started"),
                                         ("LOCK_SH", "in use by a measurement made outside a search")])
def test_a_refused_search_tells_a_starting_search_from_a_measurement(tmp_path, mode, said):
    # a search writes its name into search.lock just after taking it; in that moment the empty file alone
    # would read like a measurement (which holds the lock shared and writes nothing)
    from kernelscout.tools.runlock import RunBusy, exclusive

    (tmp_path / "search.lock").touch()
    holding = subprocess.Popen([sys.executable, "-c", f"import fcntl, time\nh = open({str(tmp_path / 'search.lock')!r})\n"
                                f"fcntl.flock(h, fcntl.{mode})\nprint('held', flush=True)\ntime.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline().strip() == "held"
        with pytest.raises(RunBusy) as refused:
            with exclusive(tmp_path, "kscout search"):
                pass
    finally:
        holding.kill()
        holding.wait()
    assert said in str(refused.value)


def _contents(folder: Path) -> tuple[list[str], list[str]]:
    """A folder's files and its run.db's rows (SQLite's own -wal and -shm come and go with connections)."""
    import sqlite3

    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.name.endswith(("-wal", "-shm")))
    with sqlite3.connect(folder / "run.db") as db:
        return files, list(db.iterdump())


def test_a_folder_of_kscout_measure_results_is_not_taken_over_by_a_search(problem, tmp_path):
    run = tmp_path / "run"
    candidate = tmp_path / "candidate.py"
    candidate.write_text(GOOD_CANDIDATE)
    assert kscout("measure", str(problem), str(candidate), "--device", "cpu", "--run-dir", str(run), "--json").exit_code == 0
    before = _contents(run)

    space = write_cache(tmp_path / "k.json", timed(8))
    refused = kscout("optimize", "--space", str(space), "--budget", "2", "--run-dir", str(run))
    assert_usage_error(refused, "already holds 1 measurement", "new --run-dir", f"kscout show {run}")
    assert _contents(run) == before  # not a lock file, not a budget, not a stored search


def test_a_search_started_again_with_another_budget_says_how_to_raise_it(tmp_path):
    run = tmp_path / "run"
    space = write_cache(tmp_path / "k.json", timed(8))
    assert kscout("optimize", "--space", str(space), "--budget", "3", "--run-dir", str(run), "--json").exit_code == 0

    more = kscout("optimize", "--space", str(space), "--budget", "5", "--run-dir", str(run))
    assert_usage_error(more, "already holds a different search", "--budget 3 there, 5 here",
                       f"kscout budget {run} --set 5 && kscout resume {run}")

    other = kscout("optimize", "--space", str(space), "--budget", "5", "--seed", "1", "--run-dir", str(run))
    assert_usage_error(other, "--budget 3 there, 5 here", "--seed 0 there, 1 here", "new --run-dir")
    assert "kscout budget" not in other.output  # more than the budget differs: resuming would not give what was asked


def test_warm_start_on_a_code_problem_is_refused_not_ignored(problem, tmp_path):
    space = write_cache(tmp_path / "k.json", timed(8))
    assert_usage_error(kscout("optimize", str(problem), "--warm-start", str(space), "--run-dir", str(tmp_path / "run")),
                       "--warm-start takes recorded spaces", "--history")


def test_a_provider_set_up_wrongly_is_not_silently_replaced_by_the_offline_policy(problem, tmp_path, no_llm, monkeypatch):
    monkeypatch.setenv("KSCOUT_PROVIDER", "anthropic")  # and no ANTHROPIC_API_KEY
    assert_usage_error(kscout("optimize", str(problem), "--budget", "2", "--run-dir", str(tmp_path / "run")),
                       "ANTHROPIC_API_KEY", "--policy tuner")
    assert_usage_error(kscout("run", str(problem), "--budget", "2", "--run-dir", str(tmp_path / "night")), "ANTHROPIC_API_KEY")


def test_the_python_api_takes_one_path_where_it_takes_a_list(problem, tmp_path):
    import kernelscout as ks
    from kernelscout.agent.runner import OptimizeError

    # the whole path, not its first letter; named as the keyword a script gave (start='...'), not as a CLI flag
    with pytest.raises(OptimizeError, match=r"^start='.*/mine\.py': no such file"):
        ks.optimize(str(problem), budget=2, start=str(tmp_path / "mine.py"), run_dir=str(tmp_path / "run"))


@pytest.mark.parametrize("line, phrase", [('device = "tpu"', "device"), ("budget = true", "budget")])
def test_a_bad_kscout_toml_value_is_an_error_naming_the_file(problem, tmp_path, monkeypatch, line, phrase):
    (tmp_path / "kscout.toml").write_text(f"[search]\n{line}\n")
    monkeypatch.chdir(tmp_path)
    assert_usage_error(kscout("optimize", str(problem), "--run-dir", str(tmp_path / "run")), "kscout.toml", phrase)


def test_a_triton_start_kernel_on_the_cpu_is_flagged_before_it_costs_a_measurement(problem, tmp_path):
    kernels = []
    for name in ("a.py", "b.py"):
        path = tmp_path / name
        path.write_text("import triton\n" + GOOD_CANDIDATE + f"\n# {name}\n")
        kernels += ["--start", str(path)]
    result = kscout("optimize", str(problem), "--device", "cpu", "--budget", "1", *kernels, "--run-dir", str(tmp_path / "run"))
    assert_usage_error(result, "is a Triton kernel", "timing is refused", "--budget is 1")


def test_a_missing_candidate_file_is_a_usage_error_with_nothing_measured(problem, tmp_path):
    run = tmp_path / "run"
    result = kscout("measure", str(problem), str(tmp_path / "nope.py"), "--run-dir", str(run))
    assert_usage_error(result, "nope.py: no such file")
    assert "compile_error" not in result.output and "charged" not in result.output  # no measurement table
    assert not run.exists()


def test_a_search_whose_recorded_space_changed_is_not_resumed_until_the_file_is_put_back(tmp_path):
    space = write_cache(tmp_path / "k.json", timed(12))
    run = tmp_path / "run"
    assert kscout("optimize", "--space", str(space), "--budget", "3", "--run-dir", str(run)).exit_code == 0
    original = space.read_text()
    write_cache(space, {**timed(12), 5: 0.01})  # re-recorded: one configuration is now far faster
    assert kscout("budget", str(run), "--set", "5").exit_code == 0
    for args in (("resume", str(run)), ("optimize", "--space", str(space), "--budget", "3", "--run-dir", str(run))):
        result = kscout(*args)
        assert_usage_error(result, "this recorded space has changed since", "3 measurements were made against the earlier version",
                           "put the file back as it was")
    space.write_text(original)
    assert kscout("resume", str(run)).exit_code == 0
    assert json.loads(kscout("budget", str(run), "--json").output)["used"] == 5


def test_a_search_whose_problem_changed_is_not_resumed_and_nothing_is_spent(problem, tmp_path):
    run = tmp_path / "run"
    first = kscout("optimize", str(problem), "--budget", "1", "--run-dir", str(run))
    assert first.exit_code == 0, first.output
    problem.write_text(SMALL_PROBLEM.replace("torch.relu", "torch.tanh"))  # the same file, another problem now
    assert kscout("budget", str(run), "--set", "2").exit_code == 0
    result = kscout("resume", str(run))
    assert_usage_error(result, "this problem has changed since", "1 measurement was made against the earlier version",
                       "a new --run-dir")
    assert json.loads(kscout("budget", str(run), "--json").output)["used"] == 1
    problem.unlink()
    assert_usage_error(kscout("resume", str(run)), "no such file", "put it back as it was")
