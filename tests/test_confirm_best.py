"""The search re-measures its best before reporting it, so the figure shown is not the lucky draw that chose it.

A small handmade recorded space with wide repeat spread stands in for a noisy device: each replayed
measurement resamples the recorded repeats, so a re-measurement differs from the one that chose the best.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kernelscout.agent.progress import SearchProgress
from kernelscout.agent.run_view import view_run as ks_show
from kernelscout.agent.runner import OptimizeError, default_confirm, resume_search, start_search
from kernelscout.tools.archive import Archive
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus


def noisy_space(folder: Path) -> Path:
    """a in 1..6, b in 1..5: time falls with a and rises with b; each configuration's repeats spread +-25 %."""
    cache = {}
    for a in range(1, 7):
        for b in range(1, 6):
            t = 10.0 / a + 0.7 * b
            times = [t * f for f in (0.75, 0.9, 1.0, 1.1, 1.25)]
            cache[f"{a},{b}"] = {"a": a, "b": b, "time": t, "times": times, "compile_time": 1.0, "verification_time": 0,
                                 "benchmark_time": 1.0}
    path = folder / "noisy_GPU.json"
    path.write_text(json.dumps({"device_name": "Noisy GPU", "kernel_name": "noisy_kernel", "problem_size": [64],
                                "tune_params_keys": ["a", "b"], "tune_params": {"a": list(range(1, 7)), "b": list(range(1, 6))},
                                "objective": "time", "cache": cache}))
    return path


def confirmations(run_dir: Path) -> list[tuple]:
    with sqlite3.connect(run_dir / "run.db") as db:
        return db.execute("SELECT label, candidate_id, speedup, ok FROM confirmations ORDER BY label").fetchall()


def test_the_last_measurement_re_measures_the_best_and_that_is_what_is_reported(tmp_path):
    run_dir = tmp_path / "run"
    result = start_search(None, str(noisy_space(tmp_path)), budget=10, surrogate="none", confirm=1, run_dir=str(run_dir), quiet=True)

    assert result.measurements_used == 10  # the re-measurement comes out of the budget, never on top of it
    [(label, candidate, speedup, ok)] = confirmations(run_dir)
    assert label == "confirm:10:0" and ok == 1
    assert result.confirmed_speedups == [pytest.approx(speedup)]
    assert result.best_speedup == pytest.approx(speedup)
    chosen = Archive(RunDir(run_dir)).get(candidate)
    assert result.search_speedup == pytest.approx(chosen.speedup)
    with sqlite3.connect(run_dir / "run.db") as db:  # a fresh, charged measurement, not the one that chose it
        fresh = db.execute("SELECT m.id, m.charged FROM confirmations f JOIN measurements m ON m.id = f.measurement_id").fetchone()
    assert fresh[0] != chosen.measurement_id and fresh[1] == 1
    assert "re-measured" in result.message and f"{chosen.speedup:.3f}x when the search chose it" in result.message
    best_json = json.loads(Path(result.best_path).read_text())
    assert best_json["speedup"] == pytest.approx(speedup) and best_json["confirmed_speedups"] == [pytest.approx(speedup)]
    # read alone, the file says what its figures are: over which configuration, timed where
    assert best_json["reference_ms"] / best_json["runtime_ms"] == pytest.approx(speedup, rel=1e-9)
    assert best_json["device"] == "replay:Noisy GPU" and set(best_json["reference_config"]) == {"a", "b"}
    # the report's lineage gives the re-measured figure the headline gives, with the single draw that chose it
    page = (run_dir / "report.html").read_text()
    assert f"<td>{speedup:.3f}x re-measured ({chosen.speedup:.3f}x once)</td>" in page
    assert "recorded timing on Noisy GPU, replayed from noisy_GPU.json" in page  # no kernel ran: it says so
    view = ks_show(run_dir)  # the times `kscout show` puts beside it are those of the re-measurement
    assert view.best_reference_ms / view.best_runtime_ms == pytest.approx(speedup, rel=1e-9)
    assert f"{view.best_runtime_ms:.4g} ms a call against the reference's {view.best_reference_ms:.4g} ms" in page
    # `show A B --plot`: the re-measurement is a marker where it was spent, not a step of the search's best
    from kernelscout.agent.compare_plot import run_curve

    curve = run_curve(RunDir(run_dir, read_only=True), "run")
    assert [n for n, _ in curve.remeasured] == [10] and curve.remeasured[0][1] == pytest.approx(view.best_runtime_ms)
    assert len(curve.best_ms) == 10 and curve.best_ms[-1] == curve.best_ms[-2]


def test_a_best_that_was_not_re_measured_says_it_was_measured_once(tmp_path):
    result = start_search(None, str(noisy_space(tmp_path)), budget=4, surrogate="none", confirm=0,
                          run_dir=str(tmp_path / "run"), quiet=True)

    assert result.best_speedup > 1.0 and result.confirmed_speedups == []
    assert result.message == (f"best verified kernel: {result.best_speedup:.3f}x over the reference "
                              "(measured once, not re-measured: --confirm was 0)")
    page = (tmp_path / "run" / "report.html").read_text()
    assert f"at {result.best_speedup:.3f}x, measured once (not re-measured)" in page


def test_replaying_the_confirmation_after_a_kill_spends_nothing(tmp_path):
    """A kill -9 between the re-measurement and the checkpoint replays the node: its label is found, not re-spent."""
    from kernelscout.agent.session import build_loop, load_spec

    run_dir = tmp_path / "run"
    start_search(None, str(noisy_space(tmp_path)), budget=8, surrogate="none", confirm=2, run_dir=str(run_dir), quiet=True)
    run = RunDir(run_dir)
    before = (Budget(run).status().used, confirmations(run_dir))
    loop = build_loop(run, load_spec(run))
    loop.confirm({})
    assert (Budget(run).status().used, confirmations(run_dir)) == before == (8, before[1])
    assert [c[0] for c in before[1]] == ["confirm:8:0", "confirm:8:1"]


def test_raising_the_cap_searches_on_and_re_measures_again(tmp_path):
    run_dir = tmp_path / "run"
    start_search(None, str(noisy_space(tmp_path)), budget=6, surrogate="none", confirm=1, run_dir=str(run_dir), quiet=True)
    Budget(RunDir(run_dir)).set_cap(9)
    result = resume_search(str(run_dir), quiet=True)

    assert result.measurements_used == 9
    assert [c[0] for c in confirmations(run_dir)] == ["confirm:6:0", "confirm:9:0"]


def test_a_search_that_never_beats_the_reference_keeps_its_budget_for_searching(tmp_path):
    """With nothing faster than the reference there is no claim to check, so no measurement is held back."""
    from kernelscout.agent.targets import ReplayTarget
    from kernelscout.sandbox.replay import ReplaySpace

    path = noisy_space(tmp_path)
    reference = ReplayTarget(ReplaySpace.load(path), RunDir(tmp_path / "probe"), seed=0).reference
    data = json.loads(path.read_text())
    for record in data["cache"].values():  # the reference becomes the fastest configuration by far
        t = 1.0 if (record["a"], record["b"]) == (reference["a"], reference["b"]) else 5.0
        record.update(time=t, times=[t * 0.99, t, t * 1.01])
    path.write_text(json.dumps(data))

    result = start_search(None, str(path), budget=6, surrogate="none", confirm=2, run_dir=str(tmp_path / "run"), quiet=True, seed=0)
    assert result.measurements_used == 6 and confirmations(tmp_path / "run") == []
    assert result.best_speedup < 1.0 and "nothing beat the reference" in result.message


def _measured(archive: Archive, sha: str, speedup: float, measurement_id: int):
    rec = archive.add(sha, None, 0, "test", {"k": sha}, "", {}, 1)
    archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=speedup,
                                                   measurement_id=measurement_id))
    return archive.get(rec.id)


def test_a_re_measured_candidate_competes_with_its_re_measurement_not_its_lucky_draw(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    lucky = _measured(archive, "a", 1.94, 1)
    steady = _measured(archive, "b", 1.70, 2)
    assert archive.best().id == lucky.id

    archive.record_confirmation("confirm:5:0", lucky.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True,
                                                                      speedup=1.60, measurement_id=3), ok=True)
    assert archive.reported_speedup(archive.get(lucky.id)) == pytest.approx(1.60)
    assert archive.best().id == steady.id  # the search's incumbent: 1.70 measured once beats 1.60 re-measured
    assert archive.reported_best().id == lucky.id  # the report: only a re-measured figure is reported


def test_a_candidate_that_fails_its_re_measurement_is_no_longer_the_best(tmp_path):
    archive = Archive(RunDir(tmp_path / "run"))
    flaky = _measured(archive, "a", 2.5, 1)
    other = _measured(archive, "b", 1.5, 2)
    archive.record_confirmation("confirm:5:0", flaky.id, Measurement(status=MeasureStatus.incorrect, correct=False, measurement_id=3),
                                ok=False)
    assert archive.get(flaky.id).state == "unconfirmed"
    assert archive.best().id == other.id and archive.reported_best().id == other.id


def test_confirm_defaults_to_one_for_a_problem_with_room_and_none_on_a_recorded_space():
    assert default_confirm(10, space=False) == 1
    assert default_confirm(4, space=False) == 0
    assert default_confirm(100, space=True) == 0


def test_a_confirm_count_that_leaves_no_search_is_refused_with_the_range(tmp_path):
    with pytest.raises(OptimizeError, match="give 0 to 4"):
        start_search(None, str(noisy_space(tmp_path)), budget=5, confirm=5, run_dir=str(tmp_path / "run"), quiet=True)


def test_a_re_measurement_a_busy_machine_voided_leaves_the_best_and_its_slot_for_a_resume(tmp_path, monkeypatch):
    """A busy machine judged nothing: the best stays the best, measured once, and says why; resuming spends the
    measurement kept for the check on a fresh re-measurement, not on the search."""
    from kernelscout.agent.targets import ReplayTarget
    from kernelscout.sandbox.stats import BUSY_REASON
    from kernelscout.tools.measure import measure_replay

    real, calls = ReplayTarget.confirm, []

    def busy_the_first_time(self, rec, label):
        calls.append(label)
        if len(calls) > 1:
            return real(self, rec, label)
        busy = lambda seed: Measurement(status="ok", correct=True, timing_valid=False, speedup=3.0, charged=True,  # noqa: E731
                                        timing_invalid_reason=f"{BUSY_REASON}: in 9 of 9 timed rounds ...")
        return measure_replay(self.space, rec.params, self.run, reference=self.reference, execute=busy, repeat=label)

    monkeypatch.setattr(ReplayTarget, "confirm", busy_the_first_time)
    run_dir = tmp_path / "run"
    # --patience stops the search with budget left, as a busy machine's stop does
    first = start_search(None, str(noisy_space(tmp_path)), budget=20, surrogate="none", confirm=1, patience=2,
                         run_dir=str(run_dir), quiet=True)
    assert first.best_speedup > 1.0 and first.confirmed_speedups == [] and first.measurements_used < 20
    assert f"(measured once: its re-measurement did not count: {BUSY_REASON}" in first.message
    assert Archive(RunDir(run_dir)).get(confirmations(run_dir)[0][1]).state == "measured"  # still the best, not unconfirmed
    shown = json.loads(__import__("subprocess").run(["kscout", "show", str(run_dir), "--json"], capture_output=True, text=True).stdout)
    assert shown["remeasurements"] == 1 and shown["best"]["remeasured_uncounted"][0].startswith(BUSY_REASON)

    again = resume_search(str(run_dir), quiet=True, patience=0)  # searches on to the budget, keeping one for the check
    assert again.measurements_used == 20 and len(again.confirmed_speedups) == 1
    assert calls == ["confirm:20:0", "confirm:20:0:again:1"]  # the open slot, measured anew
    assert [(c[0], c[3]) for c in confirmations(run_dir)] == [("confirm:20:0", 1), ("confirm:20:0:void:0", 0)]


def test_progress_says_what_the_re_measurement_found():
    progress = SearchProgress(10, "noisy", live=False)
    line = progress._describe("confirm", {"candidate": 7, "status": "ok", "speedup": 1.62, "search_speedup": 1.94, "ok": True, "used": 10})
    assert line == "re-measured the best, #7: 1.620x (the search measured 1.940x); budget 10/10"
    failed = progress._describe("confirm", {"candidate": 7, "status": "incorrect", "speedup": None, "search_speedup": 1.94, "ok": False})
    assert failed.endswith("it no longer counts as the best; budget 10/10")
    void = progress._describe("confirm", {"candidate": 7, "status": "ok", "speedup": 2.1, "search_speedup": 1.94, "ok": False,
                                          "void": True, "why": "the machine was busy: in 9 of 9 timed rounds"})
    assert "it stays the best, measured once (the machine was busy: in 9 of 9 timed rounds)" in void


def test_a_labelled_re_measurement_of_a_kernel_is_spent_once_per_label(tmp_path, write, pool):
    """What the search's confirmation of a real kernel relies on: `measure` with a `repeat` label."""
    from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM
    from kernelscout.tools.measure import MeasureRequest, measure

    problem, candidate = write("problem.py", SMALL_PROBLEM), write("candidate.py", GOOD_CANDIDATE)

    def request(repeat: str = "") -> Measurement:
        return measure(MeasureRequest(problem=str(problem), candidate=str(candidate), device="cpu", run_dir=str(tmp_path / "run"),
                                      harness=QUICK, repeat=repeat), pool=pool)

    first, again, label, label_twice = request(), request(), request("confirm:5:0"), request("confirm:5:0")
    assert first.charged and not again.charged  # the same kernel twice: the second is the stored measurement
    assert label.charged and label.measurement_id != first.measurement_id  # a label is a fresh measurement
    assert not label_twice.charged and label_twice.measurement_id == label.measurement_id  # and only once
    assert Budget(RunDir(tmp_path / "run")).status().used == 2


def test_the_report_keeps_re_measurements_out_of_the_best_so_far_curve():
    from kernelscout.agent.report import best_so_far

    speedups = [0.9, 1.7, None, 1.8, 1.6]  # the last is the re-measurement of the 1.8x kernel
    assert best_so_far(speedups, [False, False, False, False, True]) == [1.0, 1.7, 1.7, 1.8, 1.8]
