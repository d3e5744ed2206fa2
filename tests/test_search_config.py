"""`[search]` in kscout.toml: a project's or a user's defaults for searches, under the flags."""

import json

import pytest
from typer.testing import CliRunner

from kernelscout.agent.cli import app
from kernelscout.agent.search_config import SearchConfigError, search_defaults
from kernelscout.sandbox.replay import recorded_spaces_dir

SPACE = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
needs_hub = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder as the working directory, with an empty user config home."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home"))
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    return tmp_path


def test_the_project_file_overrides_the_users_setting_by_setting(project):
    (project / "home" / "kscout").mkdir(parents=True)
    (project / "home" / "kscout" / "config.toml").write_text('[search]\nbudget = 7\ndevice = "cpu"\n')
    (project / "proj" / "kscout.toml").write_text('[llm]\nprovider = "anthropic"\n\n[search]\nbudget = 5\nconfirm = 2\n')
    d = search_defaults()
    assert (d.budget, d.device, d.confirm, d.surrogate) == (5, "cpu", 2, None)
    assert d.sources["budget"].endswith("proj/kscout.toml") and d.sources["device"].endswith("config.toml")
    assert d.pick("budget", None) == 5 and d.pick("budget", 3) == 3 and d.pick("proposals", None) == 6  # file, flag, built-in


@pytest.mark.parametrize("text, phrase", [
    ('[search]\nbugdet = 5\n', "bugdet"),
    ('[search]\nbudget = 0\n', "budget"),
    ('[search]\npolicy = "genetic"\n', "policy"),
    ('[search]\nsurrogate = "xgb"\n', "'xgb'"),
    ('[search]\ndevice = "gpu"\n', "device 'gpu'"),  # neither this machine's nor an installed package's
    ('[search]\nsolved_chance = 1\n', "solved_chance"),
    ('[search]\nsolved_chance = "0.1"\n', "solved_chance"),
    ('[search]\nsolved_chance = nan\n', "a chance from 0 (never stop for it) to under 1, not nan"),
    ('[search\nbudget = 5\n', "cannot read"),
    # tomllib calls this one a section declared twice; the line itself is quoted, and what it lacks named
    ('[search]\nbudget = 3\n[search\npolicy = "tuner"\n', "`[search`; a section header needs its closing ]"),
])
def test_a_bad_setting_is_an_error_that_names_the_file(project, text, phrase):
    (project / "proj" / "kscout.toml").write_text(text)
    with pytest.raises(SearchConfigError, match="kscout.toml") as err:
        search_defaults()
    assert phrase in str(err.value)


@pytest.mark.parametrize("text, section", [
    ('[serch]\nbudget = 3\n', "[serch]"),
    ('[search]\nbudget = 3\n\n[extra]\nnote = "x"\n', "[extra]"),
    ('budget = 3\n', "budget"),  # a setting above every section
])
def test_an_unknown_section_is_an_error_that_names_the_file_and_the_known_ones(project, text, section):
    (project / "proj" / "kscout.toml").write_text(text)
    with pytest.raises(SearchConfigError, match="kscout.toml") as err:
        search_defaults()
    assert section in str(err.value) and "[llm]" in str(err.value) and "[search]" in str(err.value)


def test_a_typo_in_a_section_name_stops_optimize_before_anything_is_made(project):
    (project / "proj" / "kscout.toml").write_text('[serch]\nbudget = 3\n')
    failed = CliRunner().invoke(app, ["optimize", "anything.py", "--run-dir", "r", "--json"])
    assert failed.exit_code == 2
    message = json.loads(failed.stdout)["message"]
    assert "[serch]" in message and "did you mean [search]" in message
    assert not (project / "proj" / "r").exists()


@needs_hub
def test_optimize_takes_its_defaults_from_the_project_file_and_flags_win(project):
    (project / "proj" / "kscout.toml").write_text('[search]\nbudget = 4\nsurrogate = "none"\n')
    from_file = CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--run-dir", "a", "--json"])
    result = json.loads(from_file.stdout.strip().splitlines()[-1])
    assert (result["measurements_used"], result["surrogate"]) == (4, "none")
    flagged = CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--run-dir", "b", "--budget", "2", "--json"])
    result = json.loads(flagged.stdout.strip().splitlines()[-1])
    assert (result["measurements_used"], result["surrogate"]) == (2, "none")
    shown = CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--run-dir", "c", "--budget", "2"])
    assert "from " in shown.stderr and "surrogate=none" in shown.stderr  # says where the defaults came from
    assert "budget=4" not in shown.stderr  # the flag won: the file's value was not used, so it is not named


def test_a_command_with_a_bad_file_fails_before_anything_is_made(project):
    (project / "proj" / "kscout.toml").write_text('[search]\ndevise = "cpu"\n')
    failed = CliRunner().invoke(app, ["optimize", "anything.py", "--run-dir", "r", "--json"])
    assert failed.exit_code == 2
    assert "devise" in json.loads(failed.stdout)["message"]
    assert not (project / "proj" / "r").exists()


def test_history_in_a_file_is_read_relative_to_that_file(project):
    (project / "home" / "kscout").mkdir(parents=True)
    (project / "home" / "kscout" / "config.toml").write_text('[search]\nhistory = ["runs", "/abs/runs"]\n')
    assert search_defaults().history == [str(project / "home" / "kscout" / "runs"), "/abs/runs"]
    (project / "proj" / "kscout.toml").write_text('[search]\nhistory = ["none"]\n')  # the project turns it off
    assert search_defaults().history == ["none"]


@needs_hub
def test_a_files_history_does_not_stop_a_search_of_a_recorded_space(project):
    (project / "proj" / "runs").mkdir()
    (project / "proj" / "kscout.toml").write_text('[search]\nhistory = ["runs"]\n')
    done = CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--budget", "3", "--run-dir", "r", "--json"])
    assert done.exit_code == 0, done.output
    refused = CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--budget", "3", "--run-dir", "r2", "--json",
                                       "--history", "runs"])
    assert refused.exit_code == 2 and "--warm-start" in json.loads(refused.stdout)["message"]


@needs_hub
def test_a_files_solved_chance_is_stored_with_a_search_of_a_recorded_space_and_the_flag_wins(project):
    from kernelscout.agent.session import load_spec
    from kernelscout.tools.rundir import RunDir

    (project / "proj" / "kscout.toml").write_text('[search]\nsolved_chance = 0\n')
    CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--budget", "2", "--run-dir", "a", "--json"])
    CliRunner().invoke(app, ["optimize", "--space", str(SPACE), "--budget", "2", "--run-dir", "b", "--json", "--solved-chance", "0.2"])
    assert load_spec(RunDir(project / "proj" / "a")).settings.solved_chance == 0
    assert load_spec(RunDir(project / "proj" / "b")).settings.solved_chance == 0.2


def test_solved_chance_on_a_code_problem_is_refused_before_anything_is_made(project):
    refused = CliRunner().invoke(app, ["optimize", "problem.py", "--run-dir", "r", "--solved-chance", "0.1", "--json"])
    assert refused.exit_code == 2 and "recorded space" in json.loads(refused.stdout)["message"]
    assert not (project / "proj" / "r").exists()


def test_a_headless_run_of_code_problems_does_not_name_a_files_solved_chance(project):
    """`solved_chance` is a recorded space's stop: a run of code problems never uses it, so the note of the defaults a
    run took from kscout.toml leaves it out (the run stops at the bad policy, after the note)."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    (project / "proj" / "kscout.toml").write_text('[search]\nbudget = 3\nsolved_chance = 0\n')
    shown = CliRunner().invoke(app, ["run", str(examples / "softmax"), "--run-dir", "r", "--policy", "bogus"])
    assert shown.exit_code == 2 and "budget=3" in shown.stderr and "solved_chance" not in shown.stderr
    flagged = CliRunner().invoke(app, ["run", str(examples / "softmax"), "--run-dir", "r", "--solved-chance", "0.1", "--json"])
    assert flagged.exit_code == 2 and "none of these problems is one" in json.loads(flagged.stdout)["message"]
    assert not (project / "proj" / "r").exists()
    spaces = CliRunner().invoke(app, ["run", str(SPACE), "--run-dir", "r", "--policy", "bogus"])
    assert spaces.exit_code == 2 and "solved_chance=0" in spaces.stderr
