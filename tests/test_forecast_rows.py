"""A candidate waiting in the queue is forecast again every iteration; run.db keeps one row per run of the same
decision, so a long search's database grows with its candidates, not with candidates times iterations."""

import json
import sqlite3

import pytest

from kernelscout.agent.runner import start_search
from kernelscout.sandbox.replay import recorded_spaces_dir
from kernelscout.tools.archive import Archive
from kernelscout.tools.forecast_check import check_forecasts, deciding_forecasts
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus

SPACE = recorded_spaces_dir() / "convolution_A100.json.gz"
needs_hub = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")


def _forecast(p_faster: float) -> dict:
    return {"informative": True, "p_faster": p_faster, "expected_speedup": 1.0 + p_faster, "speedup_interval_80": [0.8, 2.0],
            "bin_edges": [1.0], "bin_probs": [1 - p_faster, p_faster]}


def test_a_deferred_candidate_keeps_one_row_holding_its_latest_forecast_and_how_many_it_stands_for(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    rec = archive.add("a", None, None, "screened", {"x": 1}, "", {}, 1)
    for iteration, p in ((1, 0.2), (2, 0.3), (3, 0.4)):
        archive.record_forecast(rec.id, iteration, "learned", _forecast(p), "defer", f"kept for later ({iteration})")
    archive.record_forecast(rec.id, 4, "learned", _forecast(0.9), "measure", "likeliest clear win")
    archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=1.5))

    rows = archive.forecasts()
    assert [(r["decision"], r["first_iteration"], r["iteration"], r["repeats"]) for r in rows] == \
        [("defer", 1, 3, 2), ("measure", 4, 4, 0)]
    assert rows[0]["forecast"]["p_faster"] == 0.4 and rows[0]["reason"] == "kept for later (3)"
    assert deciding_forecasts(rows)[rec.id]["forecast"]["p_faster"] == 0.9
    check = check_forecasts(archive)
    assert check.forecasts == 4 and check.candidates_forecast == 1 and check.scored == 1


def test_a_new_decision_starts_a_row_and_a_resumed_iteration_replaces_its_own_forecast(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    rec = archive.add("a", None, None, "screened", {"x": 1}, "", {}, 1)
    archive.record_forecast(rec.id, 1, "learned", _forecast(0.2), "defer", "")
    archive.record_forecast(rec.id, 2, "learned", _forecast(0.3), "shelve", "")
    archive.record_forecast(rec.id, 3, "learned", _forecast(0.4), "defer", "")
    archive.record_forecast(rec.id, 3, "learned", _forecast(0.5), "defer", "")  # iteration 3 again, after a resume
    rows = archive.forecasts()
    assert [(r["decision"], r["iteration"], r["repeats"]) for r in rows] == [("defer", 1, 0), ("shelve", 2, 0), ("defer", 3, 0)]
    assert rows[-1]["forecast"]["p_faster"] == 0.5
    assert check_forecasts(archive).forecasts == 3


def _earlier_run(path) -> None:
    """A run made before the columns `repeats` and `first_iteration` existed."""
    archive = Archive(RunDir(path))
    rec = archive.add("a", None, None, "screened", {"x": 1}, "", {}, 1)
    archive.record_forecast(rec.id, 1, "learned", _forecast(0.2), "defer", "")
    db = sqlite3.connect(path / "run.db")
    db.execute("ALTER TABLE forecasts DROP COLUMN repeats")
    db.execute("ALTER TABLE forecasts DROP COLUMN first_iteration")
    db.execute("INSERT INTO forecasts (candidate_id, iteration, surrogate, forecast_json, decision, reason, created)"
               " VALUES (?, 2, 'learned', ?, 'defer', '', 0)", (rec.id, json.dumps(_forecast(0.3))))
    db.commit()
    db.close()


def test_an_earlier_run_reads_as_one_forecast_per_row_and_goes_on_with_the_new_columns(tmp_path):
    _earlier_run(tmp_path / "run")
    read = Archive(RunDir(tmp_path / "run", read_only=True))
    assert [(r["iteration"], r["repeats"], r["first_iteration"]) for r in read.forecasts()] == [(1, 0, 1), (2, 0, 2)]
    assert check_forecasts(read).forecasts == 2

    archive = Archive(RunDir(tmp_path / "run"))  # as a resume opens it
    archive.record_forecast(1, 3, "learned", _forecast(0.4), "defer", "")
    rows = archive.forecasts()
    assert [(r["iteration"], r["repeats"], r["first_iteration"]) for r in rows] == [(1, 0, 1), (3, 1, 2)]
    assert check_forecasts(archive).forecasts == 3


@needs_hub
def test_a_search_stores_fewer_rows_than_forecasts_and_counts_every_forecast_it_made(tmp_path):
    run_dir = tmp_path / "run"
    result = start_search(problem=None, space=str(SPACE), budget=20, run_dir=str(run_dir), quiet=True, report=False)
    made = sum(e["considered"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines()) if e["event"] == "predict")
    rows = sqlite3.connect(run_dir / "run.db").execute("SELECT COUNT(*) FROM forecasts").fetchone()[0]
    check = check_forecasts(Archive(RunDir(run_dir, read_only=True)))
    assert check.forecasts == made and rows < made / 2
    assert check.candidates_forecast == result.candidates_considered
