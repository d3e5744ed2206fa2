"""`kscout predict FILE`: a forecast from a script, recorded where `kscout measure` puts the measurement, and scored
once the file is measured. The LLM path goes through the real OpenAI SDK against a local server."""

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelscout.agent.cli import app
from kernelscout.sandbox.problem import load_candidate, load_problem
from kernelscout.tools.archive import Archive
from kernelscout.tools.forecast_check import check_forecasts
from kernelscout.tools.measure import MeasurementRecord, ledgered
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES
from conftest import GOOD_CANDIDATE, SMALL_PROBLEM

sys.path.insert(0, str(Path(__file__).parent))
from fake_llm_server import fake_llm_server, reply_text, unauthorized  # noqa: E402,F401 - fake_llm_server is a fixture

runner = CliRunner()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A problem and a candidate in the current folder, and no LLM configured anywhere."""
    # a server test in this process may have left the root logger writing to a stream pytest has since closed
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    for key in ("KSCOUT_PROVIDER", "KSCOUT_BASE_URL", "KSCOUT_MODEL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "problem.py").write_text(textwrap.dedent(SMALL_PROBLEM))
    (tmp_path / "fast.py").write_text(textwrap.dedent(GOOD_CANDIDATE))
    return tmp_path


def _use(server, monkeypatch) -> None:
    """What a user of a local OpenAI-compatible server sets: provider, address and model, no key."""
    monkeypatch.setenv("KSCOUT_PROVIDER", "openai-compatible")
    monkeypatch.setenv("KSCOUT_BASE_URL", server.openai_base_url)
    monkeypatch.setenv("KSCOUT_MODEL", "local-coder")


def _answer(rationale: str) -> str:
    """An answer the LLM surrogate takes: most probability on the faster bins."""
    k = len(DEFAULT_EDGES) + 1
    return json.dumps({"probs": [0.0] * (k - 4) + [0.1, 0.2, 0.4, 0.3], "rationale": rationale})


def _measured(run: RunDir, speedup: float) -> None:
    """fast.py's measurement as `kscout measure` records it (the ledger's own function, without the minutes of timing)."""
    rec = MeasurementRecord(key="k", problem_sha=load_problem("problem.py").sha, candidate_sha=load_candidate("fast.py").sha,
                            problem_path="problem.py", candidate_path="fast.py", device="cpu")
    ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=speedup,
                                           runtime_ms=1 / speedup, ref_runtime_ms=1.0))


def test_without_a_provider_it_says_there_is_no_forecast_and_spends_nothing(project):
    done = runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("no forecast: no LLM provider is configured") and "KSCOUT_PROVIDER" in done.output
    as_json = json.loads(runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu", "--json"]).output)
    assert as_json["informative"] is False and as_json["p_faster"] == 0.5
    # recorded where `kscout measure` would record the measurement, and never scored once it is measured: it said nothing
    run = RunDir(project / "runs" / "scratch")
    _measured(run, speedup=1.4)
    check = check_forecasts(Archive(run))
    assert (check.candidates_forecast, check.uninformative, check.scored) == (1, 1, 0)  # asked twice, one file
    assert json.loads(runner.invoke(app, ["budget", str(run.path), "--json"]).output)["used"] == 1  # the measurement alone
    shown = " ".join(runner.invoke(app, ["show", str(run.path)]).output.split())
    assert "forecasts: 1 for 1 candidate; none informative, and a forecast that says nothing is never scored" in shown


def test_a_forecast_from_a_local_server_is_recorded_and_scored_once_the_file_is_measured(project, fake_llm_server, monkeypatch):  # noqa: F811
    _use(fake_llm_server, monkeypatch)
    answer = _answer("fuses the two element-wise passes")
    fake_llm_server.script(reply_text(answer), reply_text(answer))  # the forecast and its self-critique

    done = runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu", "--run-dir", "run", "--json"])
    assert done.exit_code == 0, done.output
    forecast = json.loads(done.output)
    assert forecast["informative"] and forecast["surrogate"] == "llm" and forecast["p_faster"] > 0.5
    assert forecast["rationale"].startswith("fuses the two element-wise passes")
    assert (forecast["cost"]["tokens_in"], forecast["cost"]["tokens_out"]) == (22, 14)  # two calls, as the server billed them

    run = RunDir(project / "run")
    assert check_forecasts(Archive(run)).scored == 0  # nothing measured yet
    _measured(run, speedup=1.4)
    check = check_forecasts(Archive(run))
    assert (check.from_tools, check.scored) == (1, 1)
    assert check.direction_accuracy == 1.0  # forecast faster, measured 1.4x
    assert "files measured after their predict call" in check.note  # not the search's selection note

    # asked again once measured: the answer says that only a new measurement scores it
    fake_llm_server.script(reply_text(answer), reply_text(answer))
    again = runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu", "--run-dir", "run"])
    text = " ".join(again.output.split())
    assert again.exit_code == 0 and "P(faster)" in text and "a forecast, not a measurement" in text
    assert "fast.py was already measured in this run (1.400x)" in text and "kscout measure --again" in text


def test_a_provider_that_refuses_the_call_is_one_line_and_exit_2(project, fake_llm_server, monkeypatch):  # noqa: F811
    _use(fake_llm_server, monkeypatch)
    fake_llm_server.script(unauthorized())
    done = runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu", "--run-dir", "run", "--json"])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert json.loads(done.output)["status"] == "failed" and "401" in json.loads(done.output)["message"]
    assert check_forecasts(Archive(RunDir(project / "run"))).forecasts == 0  # nothing recorded

    monkeypatch.setenv("KSCOUT_LLM_MAX_TOKENS", "10")  # a cap the first call could cross: refused before it is made
    capped = runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu"])
    assert capped.exit_code == 2 and "token cap" in capped.output and "Traceback" not in capped.output


def test_a_parent_that_was_never_measured_is_refused_with_what_to_do(project, fake_llm_server, monkeypatch):  # noqa: F811
    _use(fake_llm_server, monkeypatch)
    done = runner.invoke(app, ["predict", "problem.py", "fast.py", "--parent", "fast.py", "--device", "cpu"])
    assert done.exit_code == 2
    assert "has no valid measurement" in done.output and "measure it first" in done.output
    assert fake_llm_server.request_count == 0  # refused before the LLM was asked

    missing = runner.invoke(app, ["predict", "problem.py", "nope.py", "--device", "cpu"])
    assert missing.exit_code == 2 and "nope.py" in missing.output


def test_the_python_face_takes_the_same_request(project):
    import kernelscout as ks

    request = ks.PredictFileRequest(problem="problem.py", candidate="fast.py", device="cpu", run_dir="nb")
    forecast = ks.predict(request, chat_model=None)
    assert forecast.informative is False and forecast.rationale.startswith("no forecast")
    assert check_forecasts(Archive(RunDir(project / "nb"))).uninformative == 1  # recorded in the request's run directory


def test_a_later_predict_learns_from_what_the_run_measured_after_an_earlier_one(project, fake_llm_server, monkeypatch):  # noqa: F811
    # each `kscout predict` is a new process: what it knows of earlier outcomes is what the run directory recorded
    _use(fake_llm_server, monkeypatch)
    answer = _answer("fewer passes")
    (project / "other.py").write_text(textwrap.dedent(GOOD_CANDIDATE) + "\n# a variant\n")
    fake_llm_server.script(*[reply_text(answer)] * 4)

    assert runner.invoke(app, ["predict", "problem.py", "fast.py", "--device", "cpu", "--run-dir", "run"]).exit_code == 0
    first_prompt = json.dumps(fake_llm_server.requests[0].body)
    assert "measured 1.400x" not in first_prompt and "(none yet)" in first_prompt
    _measured(RunDir(project / "run"), speedup=1.4)
    assert runner.invoke(app, ["predict", "problem.py", "other.py", "--device", "cpu", "--run-dir", "run"]).exit_code == 0
    assert "fast.py vs reference: measured 1.400x over its parent" in json.dumps(fake_llm_server.requests[2].body)
