"""`kscout show`: a run read after the fact, its forecasts scored against its measurements."""

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelscout.agent.cli import app
from kernelscout.agent.llm_pricing import ModelTally, UsageState, usage_line
from kernelscout.agent.runner import start_search
from kernelscout.sandbox.replay import recorded_spaces_dir
from kernelscout.tools.archive import Archive
from kernelscout.tools.budget import Budget
from kernelscout.tools.forecast_check import check_forecasts
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus

SPACE = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
needs_hub = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
EDGES = [0.8, 1.25]  # three bins: slower, about the same, faster


def _forecast(p_faster, expected, interval, bins, informative=True):
    return {"informative": informative, "p_faster": p_faster, "expected_speedup": expected, "speedup_interval_80": interval,
            "bin_edges": EDGES, "bin_probs": bins}


def _candidate(archive, n, parent, forecast, speedup, decision="measure", reason="promising"):
    rec = archive.add(f"sha{n}", None, parent, "test", {"n": n}, "", {}, 1)
    archive.record_forecast(rec.id, 1, "learned", forecast, decision, reason)
    if speedup is not None:
        archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=speedup))
    return rec.id


def test_scores_are_those_of_the_forecasts_the_candidates_were_measured_on(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    a = _candidate(archive, 1, None, _forecast(0.8, 1.5, (1.1, 2.5), [0.1, 0.2, 0.7]), 2.0)  # right, inside, top bin
    # measured 1.0x over a parent at 2.0x: a child twice as slow as its parent, where 0.3 said "probably not faster"
    _candidate(archive, 2, a, _forecast(0.3, 0.9, (0.7, 1.2), [0.5, 0.4, 0.1]), 1.0)
    _candidate(archive, 3, None, _forecast(0.9, 3.0, (2.0, 4.0), [0.0, 0.1, 0.9]), None, decision="skip")  # never measured
    _candidate(archive, 4, None, _forecast(0.5, 1.0, None, [0.3, 0.4, 0.3], informative=False), 1.2)  # cold start

    check = check_forecasts(archive)

    assert (check.candidates_forecast, check.scored, check.uninformative) == (4, 2, 1)
    assert check.brier_p_faster == pytest.approx(((0.8 - 1) ** 2 + (0.3 - 0) ** 2) / 2)
    assert check.direction_accuracy == 1.0
    assert check.interval_80_coverage == 0.5  # 0.5x over the parent falls below (0.7, 1.2)
    # ranked probability score over 3 ordinal bins, normalised by 2: outcome bins 2 (faster) and 0 (slower)
    rps_a = ((0.1 - 0) ** 2 + (0.3 - 0) ** 2) / 2
    rps_b = ((0.5 - 1) ** 2 + (0.9 - 1) ** 2) / 2
    assert check.ranked_probability_score == pytest.approx((rps_a + rps_b) / 2)
    assert check.spearman is None  # fewer than 3 pairs: no rank correlation claimed
    assert "measured candidates only" in check.note


def test_a_pending_candidate_is_scored_on_the_forecast_that_got_it_measured(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    rec = archive.add("sha", None, None, "test", {}, "", {}, 1)
    archive.record_forecast(rec.id, 1, "learned", _forecast(0.6, 1.1, (0.9, 1.3), [0.2, 0.4, 0.4]), "measure", "promising")
    archive.record_forecast(rec.id, 2, "learned", _forecast(0.1, 0.7, (0.5, 0.9), [0.8, 0.1, 0.1]), "defer", "later")
    archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=1.2))
    check = check_forecasts(archive)
    assert check.forecasts == 2 and check.scored == 1
    assert check.brier_p_faster == pytest.approx(0.16)  # (0.6 - 1)^2, not (0.1 - 1)^2


def test_an_llm_plans_expected_speedups_are_scored_against_what_was_measured(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))

    def experiment(n, parent, claim, outcome):
        features = {"origin": "llm"} if claim is None else {"origin": "llm", "expected_speedup": claim}
        rec = archive.add(f"sha{n}", None, parent, "llm", {}, f"experiment {n}", features, 1)
        if outcome == "wrong":
            archive.record_measurement(rec.id, Measurement(status=MeasureStatus.incorrect, correct=False))
        elif outcome is not None:
            archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=outcome))
        return rec.id

    a = experiment(1, None, 1.5, 1.2)  # claimed 1.5x, gave 1.2x: right way, 1.25 times overclaimed
    experiment(2, a, 2.0, 1.8)  # 1.5x over its parent at 1.2x, claimed 2.0x: 1.33 times
    experiment(3, None, 1.2, 0.8)  # claimed faster, was slower: 1.5 times
    experiment(4, None, 1.3, "wrong")
    experiment(5, None, 1.1, None)  # not measured yet
    experiment(6, None, None, 1.4)  # no claim: not scored

    claims = check_forecasts(archive).plan_claims

    assert (claims.claims, claims.measured, claims.failed) == (5, 3, 1)
    assert claims.direction_right == pytest.approx(2 / 3)
    assert claims.median_overclaim == pytest.approx(2.0 / 1.5)
    assert claims.spearman == pytest.approx(1.0)  # ranked right, however much promised
    assert claims.line() == ("the plans' expected speedups: 5 made, 3 measured, 1 failed; direction right 67%, "
                                   "claimed / measured 1.33x at the median (the plans promised more than they gave), "
                                   "rank correlation 1.00")


def test_a_policy_that_claims_nothing_has_no_claims_to_score(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    _candidate(archive, 1, None, _forecast(0.8, 1.5, (1.1, 2.5), [0.1, 0.2, 0.7]), 2.0)
    assert check_forecasts(archive).plan_claims is None


def test_an_empty_archive_scores_nothing(tmp_path):
    check = check_forecasts(Archive(RunDir(tmp_path / "run")))
    assert check.scored == 0 and check.brier_p_faster is None and check.reliability == []


@needs_hub
def test_show_reports_what_the_search_found_and_its_forecast_scores(tmp_path):
    result = start_search(problem=None, space=str(SPACE), budget=20, run_dir=str(tmp_path / "run"), quiet=True, seed=3)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--json", "--top", "3"])
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.output)
    assert view["status"] == "finished" and view["stop_reason"] == result.stop_reason
    assert view["budget"]["used"] == 20 and view["kind"] == "space"
    assert view["best"]["speedup"] == pytest.approx(result.best_speedup)
    assert len(view["top"]) == 3 and view["top"][0]["speedup"] >= view["top"][-1]["speedup"]
    check = view["forecast_check"]
    assert 0 < check["scored"] <= 20 and 0.0 <= check["brier_p_faster"] <= 1.0
    # beside each forecast (over the parent) its measured outcome on the same footing, as the scores judge it
    archive = Archive(RunDir(tmp_path / "run"))
    for row in view["top"]:
        parent = 1.0 if row["parent"] == "ref" else archive.get(int(row["parent"][1:])).speedup
        assert row["over_parent"] == pytest.approx(row["search_speedup"] / parent)
    # what the speedups are over, and the times to compare runs of other seeds by
    from kernelscout.agent.targets import ReplayTarget
    from kernelscout.sandbox.replay import ReplaySpace

    drawn = ReplayTarget(ReplaySpace.load(str(SPACE)), RunDir(tmp_path / "other"), seed=3).reference
    assert view["reference"] == "the configuration --seed 3 drew: " + ", ".join(f"{k}={v}" for k, v in drawn.items())
    assert view["best_runtime_ms"] == pytest.approx(result.best_runtime_ms)
    assert view["reference_ms"] == pytest.approx(result.best_runtime_ms * result.best_speedup, rel=0.05)
    assert view["reference_range_ms"] is None  # a replayed machine does not drift: no range to show
    # the two times of the best's own measurement give its speedup exactly, whatever the run's median reference is
    assert view["best_reference_ms"] / view["best_runtime_ms"] == pytest.approx(view["best"]["speedup"], rel=1e-9)
    with sqlite3.connect(tmp_path / "run" / "run.db") as db:  # a run made before the configuration was kept
        db.execute("DELETE FROM meta WHERE key = 'replay_reference'")
    again = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--json"]).output)
    assert again["reference"] == view["reference"]  # drawn again from the space and the seed

    text = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "160"})
    assert text.exit_code == 0
    assert "finished" in text.output and "Brier of P(faster)" in text.output and f"{result.best_speedup:.3f}x" in text.output


@needs_hub
def test_a_cold_surrogate_leaves_no_empty_forecast_columns_and_piped_rows_stay_whole(tmp_path):
    """Three measurements are too few for the learned surrogate: no candidate was measured on a forecast,
    so the table drops those columns and says why. Piped (not a terminal, no COLUMNS), it is not cut to 80
    columns, so each candidate keeps to one line."""
    start_search(problem=None, space=str(SPACE), budget=3, run_dir=str(tmp_path / "run"), quiet=True, confirm=0)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": None})
    assert shown.exit_code == 0, shown.output
    assert "P(faster)" not in shown.output and "no forecast columns" in shown.output
    assert "last abstention: cold start" in " ".join(shown.output.split())  # and says why: too few measurements yet
    rows = [line for line in shown.output.splitlines() if line.startswith("│ #")]
    assert len(rows) == 3 and all(line.rstrip().endswith("measured │") for line in rows), shown.output


@needs_hub
def test_show_marks_an_interrupted_run_and_says_how_to_go_on(tmp_path):
    run = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=8, run_dir=str(run), quiet=True)
    with open(run / "events.jsonl", "a") as f:  # a resume that measured once more and was then killed
        f.write(json.dumps({"ts": 0, "event": "measure", "candidate": 99}) + "\n")
    shown = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "160"})
    assert shown.exit_code == 0
    assert "unfinished" in shown.output and f"kscout resume {run}" in shown.output


@needs_hub
def test_a_finished_run_whose_budget_was_raised_since_says_how_to_go_on(tmp_path):
    run = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=4, run_dir=str(run), quiet=True)
    before = " ".join(CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"}).output.split())
    assert "finished (measurement budget spent)" in before and "since been raised" not in before
    assert CliRunner().invoke(app, ["budget", str(run), "--set", "6"]).exit_code == 0
    after = " ".join(CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"}).output.split())
    assert f"the budget has since been raised to 6: `kscout resume {run}` goes on" in after


def test_show_refuses_a_path_that_is_not_a_run_and_creates_nothing(tmp_path):
    missing = tmp_path / "runs" / "typo"
    shown = CliRunner().invoke(app, ["show", str(missing), "--json"])
    assert shown.exit_code == 2
    assert json.loads(shown.output)["status"] == "failed" and "does not exist" in shown.output
    assert not missing.exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "run.db").write_text("not SQLite")  # a stray file of that name
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "notes"), "--json"])
    assert shown.exit_code == 2 and "is not a run's database" in json.loads(shown.output)["message"]


def test_a_predict_tool_forecast_is_scored_only_by_a_measurement_taken_after_it(tmp_path):
    """Forecasts asked of the MCP server or chat about a file: hindsight (a forecast made after the file
    was measured) is not scored, a forecast followed by a measurement is, and `kscout show` prints it."""
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    run = RunDir(tmp_path / "run")
    archive = Archive(run)

    def measure(sha, speedup):
        rec = MeasurementRecord(key=sha, problem_sha="p", candidate_sha=sha, problem_path="p.py", candidate_path=f"{sha}.py", device="cpu")
        ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=speedup,
                                               runtime_ms=1 / speedup, ref_runtime_ms=1.0))

    measure("early", 2.0)
    archive.record_tool_forecast("p", "early", None, "cpu", 1.0, _forecast(0.99, 2.0, (1.9, 2.1), [0.0, 0.0, 1.0]), "early.py")
    archive.record_tool_forecast("p", "late", None, "cpu", 1.0, _forecast(0.7, 1.3, (1.0, 1.6), [0.1, 0.3, 0.6]), "late.py")
    assert check_forecasts(archive).scored == 0
    measure("late", 0.9)

    check = check_forecasts(archive)
    assert (check.forecasts, check.scored, check.from_tools) == (2, 1, 1)
    assert check.brier_p_faster == pytest.approx(0.49)  # 0.7 said faster; it measured 0.9x
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "160"})
    assert shown.exit_code == 0 and "1 from predict tool calls" in shown.output and "0.490" in shown.output


def test_asking_predict_again_before_measuring_scores_that_measurement_once(tmp_path):
    # an agent that re-asks must not weigh one measurement three times in the Brier score
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    run = RunDir(tmp_path / "run")
    archive = Archive(run)
    for p_faster in (0.9, 0.8, 0.2):  # the last word before the measurement counts
        archive.record_tool_forecast("p", "c", None, "cpu", 1.0, _forecast(p_faster, 1.1, (0.8, 1.4), [0.2, 0.3, 0.5]), "c.py")
    rec = MeasurementRecord(key="c", problem_sha="p", candidate_sha="c", problem_path="p.py", candidate_path="c.py", device="cpu")
    ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=0.5,
                                           runtime_ms=2.0, ref_runtime_ms=1.0))
    check = check_forecasts(archive)
    assert (check.scored, check.from_tools) == (1, 1)
    assert check.brier_p_faster == pytest.approx(0.04)  # 0.2 said faster; it measured 0.5x


def test_show_lists_files_measured_directly_with_their_latest_result(tmp_path):
    """A run directory of `kscout measure` (or the MCP server): no search, so the files and their results."""
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    run = RunDir(tmp_path / "run")
    for sha, speedup, correct in (("a", 1.7, True), ("b", None, False), ("a", 1.9, True)):  # a measured twice (--again)
        rec = MeasurementRecord(key=f"p-{sha}", problem_sha="p", candidate_sha=sha, problem_path="examples/softmax/problem.py",
                                candidate_path=f"{sha}.py", device="cpu")
        ledgered(run, rec, lambda: Measurement(status="ok", correct=correct, timing_valid=correct, charged=True, speedup=speedup),
                 again=True)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--json"])
    files = json.loads(shown.output)["measured_files"]
    assert [(f["candidate"], f["usable"], f["measurement"]["speedup"]) for f in files] == [("a.py", True, 1.9), ("b.py", False, None)]
    text = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "160"}).output
    assert "1.900x" in text and "ok, incorrect" in text and "softmax" in text and "3 (uncapped)" in text
    asked = CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--report"], env={"COLUMNS": "160"})
    assert "no report written" in asked.output and "1.900x" in asked.output  # said, and the files still listed
    assert not (tmp_path / "run" / "report.html").exists()


def test_files_an_earlier_version_measured_into_a_searchs_folder_are_listed_apart_from_its_candidates(tmp_path):
    """Before 2026-12-06 `kscout serve` could measure into a finished search's folder: charged to its budget, and
    `show` named none of it. Such a folder now lists those files under a title of their own."""
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    space = tmp_path / "three.json"
    space.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": ["bs"], "objective": "time",
                                 "tune_params": {"bs": [1, 2, 3]}, "cache": {str(v): {"bs": v, "time": v} for v in (1, 2, 3)}}))
    run_dir = tmp_path / "run"
    start_search(problem=None, space=str(space), budget=2, run_dir=str(run_dir), quiet=True, report=False, confirm=0)
    run = RunDir(run_dir)
    Budget(run).set_cap(3)
    rec = MeasurementRecord(key="outside", problem_sha="p", candidate_sha="c", problem_path="examples/softmax/problem.py",
                            candidate_path="mine.py", device="cpu")  # what the older server wrote, past today's refusal
    ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=1.693))
    view = json.loads(CliRunner().invoke(app, ["show", str(run_dir), "--json"]).output)
    assert [f["candidate"] for f in view["measured_files"]] == ["mine.py"]
    assert view["budget"]["used"] == 3 and view["best"]["speedup"] != 1.693  # not passed off as the search's best
    text = " ".join(CliRunner().invoke(app, ["show", str(run_dir)], env={"COLUMNS": "200"}).output.split())
    assert "1 file(s) measured here outside the search, listed below" in text
    assert "files measured here outside the search (charged to its budget" in text and "1.693x" in text


def test_the_reports_plots_judge_the_forecasts_the_scores_judge(tmp_path):
    from kernelscout.agent.report import write_report
    from kernelscout.tools.forecast_check import scored_search_forecasts

    archive = Archive(RunDir(tmp_path / "run"))
    a = _candidate(archive, 1, None, _forecast(0.8, 1.5, (1.1, 2.5), [0.1, 0.2, 0.7]), 2.0)
    _candidate(archive, 2, a, _forecast(0.3, 0.9, (0.7, 1.2), [0.5, 0.4, 0.1]), 1.0)
    _candidate(archive, 3, None, _forecast(0.5, 1.0, None, [0.3, 0.4, 0.3], informative=False), 1.2)  # cold start: not judged
    long = archive.add("sha9", None, None, "test", {f"parameter_{i}": '"quoted"' for i in range(12)}, "", {}, 1)

    pairs = scored_search_forecasts(archive)

    assert sorted(ratio for _, ratio in pairs) == [0.5, 2.0]
    assert len(pairs) == check_forecasts(archive).scored
    page = (write_report(tmp_path / "run")).read_text()
    row = next(r for r in page.split("<tr>") if r.startswith(f"<td>#{long.id}<"))
    assert "…" in row and "&quot;" in row
    assert all(cell.count("&") == cell.count(";") for cell in row.split("<td>"))  # no entity cut in half


@needs_hub
def test_show_and_the_report_say_what_the_llm_calls_used_and_which_model_was_counted_at_0(tmp_path, monkeypatch):
    """A search with an LLM: its meter (what agent/factory.py keeps in run.db after every call) is printed
    with its caps, and the local model with no known price is named, so "$0.0000" of it does not read as free."""
    run = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=2, run_dir=str(run), quiet=True, confirm=0)
    RunDir(run).set_meta("llm_usage", UsageState(
        calls=12, input_tokens=10_234, output_tokens=2_111, cost_usd=0.0523, max_usd=2.0,
        by_model={"claude-sonnet-4-5": ModelTally(calls=10, input_tokens=9_000, output_tokens=2_000, cost_usd=0.0523),
                  "qwen2.5-coder:7b": ModelTally(calls=2, input_tokens=1_234, output_tokens=111)},
        unpriced_models=["qwen2.5-coder:7b"]).model_dump_json())

    text = CliRunner().invoke(app, ["show", str(run), "--report"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    line = next(line for line in text.output.splitlines() if line.startswith("LLM "))
    assert "12 calls, 12,345 tokens (10,234 in, 2,111 out), $0.0523 of $2.00 cap" in line
    assert "no price known for qwen2.5-coder:7b (counted at $0)" in line
    assert "LLM use: 12 calls, 12,345 tokens" in (run / "report.html").read_text()

    usage = json.loads(CliRunner().invoke(app, ["show", str(run), "--json"]).output)["llm_usage"]
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (12, 10_234, 2_111)
    assert usage["cost_usd"] == pytest.approx(0.0523) and usage["max_usd"] == 2.0 and usage["max_tokens_total"] is None
    assert usage["unpriced_models"] == ["qwen2.5-coder:7b"] and usage["by_model"]["qwen2.5-coder:7b"]["calls"] == 2

    # `kscout optimize`'s closing table says it in the same words
    from rich.console import Console

    from kernelscout.agent import cli as cli_module

    closing = type("Result", (), {"status": "finished", "message": "m", "stop_reason": "s", "measurements_used": 2,
                                  "considered_per_measurement": 1.0, "candidates_considered": 2, "llm_tokens": 12_345,
                                  "llm_usd": 0.0523, "best_path": None, "run_dir": str(run), "notes": [], "continue_with": None})()
    console = Console(record=True, width=200)
    monkeypatch.setattr(cli_module, "out", console)
    cli_module._print_search(closing)
    printed = console.export_text()
    assert "12 calls, 12,345 tokens (10,234 in, 2,111 out)" in printed and "no price known for qwen2.5-coder:7b" in printed


@needs_hub
def test_an_offline_run_says_nothing_about_llm_use(tmp_path):
    run = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=2, run_dir=str(run), quiet=True, confirm=0)

    text = CliRunner().invoke(app, ["show", str(run), "--report"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "LLM" not in text.output
    assert "LLM" not in (run / "report.html").read_text()
    assert json.loads(CliRunner().invoke(app, ["show", str(run), "--json"]).output)["llm_usage"] is None


def test_the_llm_line_names_a_token_cap_and_leaves_out_caps_that_were_not_set():
    capped = UsageState(calls=1, input_tokens=900, output_tokens=100, cost_usd=0.6, max_tokens_total=5_000)
    assert usage_line(capped) == "1 call, 1,000 tokens (900 in, 100 out) of 5,000 cap, $0.6000"
    assert "cap" not in usage_line(UsageState(calls=3, input_tokens=30, output_tokens=3, cost_usd=0.001))


def test_a_chat_only_run_directory_shows_what_the_chat_spent(tmp_path):
    """`kscout chat` keeps its meter beside the run's measurements; a folder with no search still shows it."""
    from kernelscout.agent.llm_pricing import CHAT_USAGE_META

    run = RunDir(tmp_path / "chat")
    run.set_meta(CHAT_USAGE_META, UsageState(calls=4, input_tokens=3_000, output_tokens=500, cost_usd=0.021).model_dump_json())

    text = CliRunner().invoke(app, ["show", str(tmp_path / "chat")], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    line = next(line for line in text.output.splitlines() if line.startswith("LLM (chat)"))
    assert "4 calls, 3,500 tokens (3,000 in, 500 out), $0.0210" in line
    shown = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "chat"), "--json"]).output)
    assert shown["chat_llm_usage"]["calls"] == 4 and shown["llm_usage"] is None


def test_show_says_why_a_measurement_did_not_count(tmp_path):
    """A start kernel with the wrong output shape: the reason is in the log line, and `kscout show` lists it."""
    from conftest import SMALL_PROBLEM

    problem, start = tmp_path / "problem.py", tmp_path / "wrong.py"
    problem.write_text(SMALL_PROBLEM)
    start.write_text(SMALL_PROBLEM.replace("class Model(", "class ModelNew(").replace(
        "return torch.relu(x * self.scale + y) + 0.5 * x", "return (torch.relu(x * self.scale + y) + 0.5 * x)[:, :-1]"))
    start_search(problem=str(problem), space=None, budget=1, run_dir=str(tmp_path / "run"), quiet=True, start=[str(start)], confirm=0)
    view = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--json"]).output)
    assert view["failed"] == 1 and view["reference"] == "the problem's Model"  # (not timed: nothing was correct)
    [failure] = view["failures"]
    assert failure["status"] == "incorrect" and "shape (256, 511), expected (256, 512)" in failure["why"]
    assert Path(failure["file"]).read_text() == start.read_text()  # the file to open and fix
    text = CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "200"}).output
    assert "measurements that did not count (1)" in text and failure["why"][:40] in text
    assert str(Path(failure["file"]).relative_to(tmp_path / "run")) in text
    report = CliRunner().invoke(app, ["show", str(tmp_path / "run"), "--report"])
    assert report.exit_code == 0
    page = (tmp_path / "run" / "report.html").read_text()
    assert "Measurements that did not count (1)" in page and "Speedups are over the problem&#x27;s Model." in page
    assert "<td>did not count (incorrect)</td>" in page  # in the lineage too, in the words of the table below it
    assert f"<td>{Path(failure['file']).relative_to(tmp_path / 'run')}</td>" in page
    # a run directory copied elsewhere points into itself, not back to the original
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    shutil.rmtree(tmp_path / "run")
    copied = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "copy"), "--json"]).output)
    assert Path(copied["failures"][0]["file"]).read_text() == start.read_text()
    assert copied["continue_with"] == f"kscout budget {tmp_path / 'copy'} --set 2 && kscout resume {tmp_path / 'copy'}"


@needs_hub
def test_forecasts_are_parsed_only_where_they_are_read(tmp_path):
    """A long search stores each waiting candidate's forecast again every iteration; a view reads few of them."""
    start_search(problem=None, space=str(SPACE), budget=12, run_dir=str(tmp_path / "run"), quiet=True)
    assert isinstance(Archive(RunDir(tmp_path / "run")).forecasts()[0]["forecast"], dict)  # plain JSON for a script
    rows = Archive(RunDir(tmp_path / "run")).forecasts(lazy=True)
    assert len(rows) > 12 and not any(r["forecast"]._value for r in rows)  # nothing parsed yet
    ids = [c.id for c in Archive(RunDir(tmp_path / "run")).all()]
    assert ids == list(range(1, len(ids) + 1))  # a candidate proposed again takes no id of its own
    first = dict(rows[0]["forecast"])
    assert 0.0 <= first["p_faster"] <= 1.0 and rows[0]["forecast"]["surrogate"] == first["surrogate"]
    check = check_forecasts(Archive(RunDir(tmp_path / "run")), forecasts=rows)
    assert check.forecasts == sum(1 + r["repeats"] for r in rows)
    assert sum(r["forecast"]._value is not None for r in rows) <= 1 + check.candidates_forecast


def test_a_view_reads_one_moment_of_a_run_a_search_is_writing_to(tmp_path):
    """`kscout show` during a search: the ledger and the archive are read in one snapshot, never out of step."""
    writer = RunDir(tmp_path / "run")
    writer.set_meta("measurement_cap", "9")
    reader = RunDir(tmp_path / "run", read_only=True)
    with reader.snapshot():
        assert reader.get_meta("measurement_cap") == "9"
        writer.set_meta("measurement_cap", "12")  # a write lands mid-view
        assert reader.get_meta("measurement_cap") == "9"
    assert reader.get_meta("measurement_cap") == "12"


@needs_hub
def test_two_runs_are_compared_side_by_side_and_told_apart_by_time_when_their_references_differ(tmp_path):
    for seed in (0, 1):
        start_search(problem=None, space=str(SPACE), budget=10, run_dir=str(tmp_path / f"seed{seed}"), quiet=True, seed=seed)
    runs = [str(tmp_path / "seed0"), str(tmp_path / "seed1")]
    views = json.loads(CliRunner().invoke(app, ["show", *runs, "--json"]).output)
    assert [v["seed"] for v in views] == [0, 1] and views[0]["reference"] != views[1]["reference"]
    text = " ".join(CliRunner().invoke(app, ["show", *runs], env={"COLUMNS": "250"}).output.split())
    assert "runs compared" in text and "compare these runs by their best time" in text
    assert f"{views[1]['best_runtime_ms']:.4g} ms" in text
    refused = CliRunner().invoke(app, ["show", *runs, "--report"])
    assert refused.exit_code == 2 and "give one run directory" in refused.output
    same = " ".join(CliRunner().invoke(app, ["show", runs[0], runs[0]], env={"COLUMNS": "250"}).output.split())
    assert "runs compared" in same and "different references" not in same  # one space, one seed: one reference


def test_runs_compared_say_why_each_stopped(tmp_path):
    """A search that measured its whole space and one that ran out of budget both finished; the table tells them apart."""
    space = tmp_path / "three.json"
    space.write_text(json.dumps({"device_name": "GPU", "kernel_name": "k", "tune_params_keys": ["bs"], "objective": "time",
                                 "tune_params": {"bs": [1, 2, 3]}, "cache": {str(v): {"bs": v, "time": v} for v in (1, 2, 3)}}))
    for name, budget in (("spent", 2), ("whole", 10)):
        start_search(problem=None, space=str(space), budget=budget, run_dir=str(tmp_path / name), quiet=True, report=False, confirm=0)
    runs = [str(tmp_path / "spent"), str(tmp_path / "whole")]
    views = json.loads(CliRunner().invoke(app, ["show", *runs, "--json"]).output)
    assert [v["stop"]["kind"] for v in views] == ["budget", "nothing_left"]
    text = " ".join(CliRunner().invoke(app, ["show", *runs], env={"COLUMNS": "250"}).output.split())
    assert "finished (budget spent)" in text and "finished (nothing left to measure)" in text


def test_the_reference_time_is_of_timings_that_counted_and_the_command_to_go_on_follows_a_moved_run(tmp_path):
    from kernelscout.agent.run_view import _here
    from kernelscout.agent.targets import reference_ms, search_reference_ms
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    run = RunDir(tmp_path / "run")
    for i, (ref_ms, valid) in enumerate([(38.9, False), (52.5, False), (6.6, True)]):  # two timed on a busy machine
        rec = MeasurementRecord(key=f"k{i}", problem_sha="p", candidate_sha=f"c{i}", problem_path="p.py", candidate_path="c.py", device="cpu")
        ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=valid, charged=True, runtime_ms=3.0,
                                               ref_runtime_ms=ref_ms, speedup=ref_ms / 3.0))
        if i == 1:  # before any timing counted, the search forecasts against what it has
            assert search_reference_ms(run) == 52.5
    assert reference_ms(run, valid_only=True) == 6.6 and reference_ms(run) == 38.9
    assert search_reference_ms(run) == 6.6  # the search's forecasts, like show, go by the timings that counted
    old = {"continue_with": "kscout budget /runs/R s --set 10 && kscout resume /runs/R s", "run_dir": "/runs/R s"}  # unquoted, as written before
    assert _here(old, Path("/runs/R moved")) == "kscout budget '/runs/R moved' --set 10 && kscout resume '/runs/R moved'"
    new = {"continue_with": "kscout resume '/runs/R s'", "run_dir": "/runs/R s"}
    assert _here(new, Path("/runs/R s2")) == "kscout resume '/runs/R s2'"


@needs_hub
def test_runs_compared_in_a_plot_of_their_best_times(tmp_path):
    """`show A B --plot FILE`: times, not speedups, since runs of other seeds have other references."""
    from kernelscout.agent.compare_plot import run_curve

    for seed in (1, 2):
        start_search(problem=None, space=str(SPACE), budget=8, run_dir=str(tmp_path / f"s{seed}"), quiet=True, seed=seed)
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "s1"), str(tmp_path / "s2"), "--plot", str(tmp_path / "cmp.png")])
    assert shown.exit_code == 0, shown.output
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    curve = run_curve(RunDir(tmp_path / "s1", read_only=True), "s1")
    with sqlite3.connect(tmp_path / "s1" / "run.db") as db:
        times = [json.loads(r[0]) for r in db.execute("SELECT result_json FROM measurements WHERE charged = 1 ORDER BY id")]
    valid = [m["runtime_ms"] for m in times if m["correct"] and m["timing_valid"]]
    assert len(curve.best_ms) == len(times) == 8 and curve.best_ms[-1] == min([curve.reference_ms, *valid])
    assert curve.reference_ms == json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "s1"), "--json"]).output)["reference_ms"]
    assert all(b <= a for a, b in zip(curve.best_ms, curve.best_ms[1:]) if a is not None and b is not None)

    one = CliRunner().invoke(app, ["show", str(tmp_path / "s1"), "--plot", str(tmp_path / "one.png")])
    assert one.exit_code == 2 and "two or more run directories" in one.output
    odd = CliRunner().invoke(app, ["show", str(tmp_path / "s1"), str(tmp_path / "s2"), "--plot", str(tmp_path / "cmp.jpeg")])
    assert odd.exit_code == 2 and ".png, .svg or .pdf" in odd.output and not (tmp_path / "cmp.jpeg").exists()


@needs_hub
def test_a_search_without_a_surrogate_is_not_told_it_has_nothing_to_score_yet(tmp_path):
    start_search(problem=None, space=str(SPACE), budget=3, run_dir=str(tmp_path / "run"), quiet=True, surrogate="none")
    text = " ".join(CliRunner().invoke(app, ["show", str(tmp_path / "run")], env={"COLUMNS": "200"}).output.split())
    assert "--surrogate none measures every candidate" in text and "nothing to score yet" not in text


def test_show_says_how_far_the_machines_pace_moved_over_a_code_search(tmp_path, monkeypatch, write):
    """Each measurement times the reference beside its candidate; the range of those times is the drift a speedup
    cancels (and a raw time does not), so `kscout show` puts it beside the median."""
    import kernelscout.tools.measure as measure_tool
    from conftest import SMALL_PROBLEM

    paces = iter([1.0, 1.5, 1.2, 1.1])  # the machine ran half as slow again during the second measurement

    def drifting(pool, problem, candidate, config):  # no sandbox: only what show reads is under test
        ref = 4.0 * next(paces)
        return Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=2.0, runtime_ms=ref / 2.0,
                           ref_runtime_ms=ref)

    monkeypatch.setattr(measure_tool, "run_measurement", drifting)
    run = tmp_path / "run"
    start_search(problem=str(write("problem.py", SMALL_PROBLEM)), space=None, budget=3, device="cpu", run_dir=str(run),
                 quiet=True, report=False, confirm=0)
    view = json.loads(CliRunner().invoke(app, ["show", str(run), "--json"]).output)
    assert view["reference_timings"] == 3 and view["reference_ms"] == 4.8 and view["reference_range_ms"] == [4.0, 6.0]
    text = " ".join(CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "250"}).output.split())
    assert "4.8 ms a call, the median over the run (4 ms to 6 ms over its 3 timings: each speedup is over the reference " \
           "timed beside that candidate)" in text
    assert CliRunner().invoke(app, ["show", str(run), "--report"]).exit_code == 0
    assert ("(median 4.8 ms a call over the search's measurements, from 4 to 6 ms: each speedup is over the reference "
            "timed beside that candidate)") in (run / "report.html").read_text()
