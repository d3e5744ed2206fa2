"""The prior across problems: earlier runs on the same device forecast a new problem's candidates."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_PROBLEM

from kernelscout.agent.forecaster import OpenSpaceSurrogate
from kernelscout.tools.archive import Archive
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus
from kernelscout.tools.surrogates.history import CrossProblemPrior, Outcome, find_runs, load_prior, read_outcomes

# How each rewrite family tends to do, as a fixture: compiling wins, CUDA graphs lose, the rest is a wash.
FAMILY_EFFECT = {"torch_compile": 1.8, "cuda_graphs": 0.8, "channels_last": 1.0, "tunable": 1.05}


def features(kind: str, parent_speedup: float = 1.0, variant: int = 0) -> dict:
    return {"kind": kind, "variant": f"v{variant}", "device": "cpu", "parent_speedup": parent_speedup,
            "parent_is_reference": parent_speedup == 1.0, **{f"is.{k}": float(k == kind) for k in FAMILY_EFFECT}}


def outcomes(problem: str, rng: random.Random, per_family: int = 3) -> list[Outcome]:
    out = []
    scale = rng.uniform(0.8, 1.25)  # problems differ in how much any rewrite can give
    for kind, effect in FAMILY_EFFECT.items():
        for v in range(per_family):
            speedup = effect * scale * math.exp(rng.gauss(0, 0.05))
            out.append(Outcome(run=f"run-{problem}", problem=problem, features=features(kind, variant=v), parent_speedup=1.0, speedup=speedup))
    return out


def test_the_prior_ranks_families_on_a_problem_it_never_saw_and_knows_its_own_error():
    rng = random.Random(0)
    prior = CrossProblemPrior([o for p in ("softmax", "gelu", "layernorm") for o in outcomes(p, rng)])
    compile_, graphs, wash = prior.log_speedup([features("torch_compile"), features("cuda_graphs"), features("channels_last")])
    assert compile_ > wash > graphs
    assert math.exp(compile_) == pytest.approx(1.8, rel=0.3)
    # the error is measured on held-out problems, so it covers the problem-to-problem scale (about 0.2
    # in log-speedup here), not just the 5 % noise within one problem
    assert prior.held_out_by == "problem"
    assert 0.08 < prior.scale < 0.5
    # a child of a parent that is already 2x: the forecast is over the reference, so the parent's speedup carries
    assert prior.log_speedup([features("tunable", parent_speedup=2.0)])[0] == pytest.approx(math.log(2.0 * 1.05), abs=0.25)


def test_too_little_history_is_no_prior_and_says_why():
    rng = random.Random(1)
    few = outcomes("softmax", rng, per_family=1)[:5]
    prior, why = load_prior([])
    assert prior is None and "no earlier runs" in why
    with pytest.raises(ValueError, match="needs 8"):
        CrossProblemPrior(few)
    with pytest.raises(ValueError, match="single run"):
        CrossProblemPrior(outcomes("softmax", rng))  # one run of one problem cannot measure its own error


def test_before_its_own_fit_a_code_search_forecasts_from_the_prior_and_says_so():
    rng = random.Random(2)
    prior = CrossProblemPrior([o for p in ("a", "b", "c") for o in outcomes(p, rng)])
    cold = OpenSpaceSurrogate("learned", prior=None, reference_ms=lambda: 10.0)
    warm = OpenSpaceSurrogate("learned", prior=prior, reference_ms=lambda: 10.0)
    configs = [features("torch_compile"), features("cuda_graphs")]
    assert cold.predictive(configs) is None and "cold start" in cold.status()
    dist = warm.predictive(configs)
    assert dist is not None
    assert dist.p_faster_than(math.log(10.0))[0] > 0.8 > 0.3 > dist.p_faster_than(math.log(10.0))[1]
    assert "prior from earlier runs" in warm.status() and "3 problem(s)" in warm.status()
    # no reference time yet: nothing to put the forecast on, so no forecast
    assert OpenSpaceSurrogate("learned", prior=prior, reference_ms=lambda: None).predictive(configs) is None
    # --surrogate none ignores the prior: it measures everything
    assert OpenSpaceSurrogate("none", prior=prior, reference_ms=lambda: 10.0).predictive(configs) is None


def _fake_run(path, problem_sha: str, device: str, rows: list[tuple[dict, float]], bounds: str | None = None) -> RunDir:
    """A run directory as a finished search leaves it: spec, candidates and the measurements they point to."""
    run = RunDir(path)
    run.set_meta("search_spec", json.dumps({"kind": "problem", "path": f"/p/{problem_sha}.py", "device": device}))
    if bounds:
        run.set_meta("sol_bounds", bounds)
    archive = Archive(run)
    for i, (feats, speedup) in enumerate(rows):
        rec = archive.add(f"{path.name}-{feats['kind']}-{feats['variant']}-{i}", "pass", 0, f"rewrite:{feats['kind']}", {}, "", feats, 1)
        with run.transaction() as db:
            mid = db.execute("INSERT INTO measurements (key, problem_sha, status, charged, speedup, result_json, created)"
                             " VALUES (?, ?, 'ok', 1, ?, '{}', ?)", (f"k{i}", problem_sha, speedup, time.time())).lastrowid
        archive.record_measurement(rec.id, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True,
                                                       speedup=speedup, measurement_id=mid))
    return run


def test_earlier_runs_are_found_by_device_and_read_without_writing(tmp_path):
    runs = tmp_path / "runs"
    rows = [(features("torch_compile"), 1.9), (features("cuda_graphs"), 0.7), (features("tunable", parent_speedup=1.9), 2.0)]
    made = [_fake_run(runs / "softmax-1", "sha-softmax", "cpu", rows),
            _fake_run(runs / "gelu-1", "sha-gelu", "cpu", rows),
            _fake_run(runs / "gelu-gpu", "sha-gelu", "cuda:0", rows, bounds=json.dumps({"device_key": "H100-SXM"})),
            _fake_run(runs / "batch" / "problems" / "ln", "sha-ln", "cpu", rows)]  # a `kscout run` folder is not searched that deep
    for run in made:
        run.close()  # as a finished search leaves them; closing later (at garbage collection) would write mid-test
    (runs / "notes").mkdir()
    current = runs / "this-run"
    current.mkdir()
    found = find_runs([runs], "cpu", exclude=current)
    assert sorted(p.rsplit("/", 1)[1] for p in found) == ["gelu-1", "softmax-1"]
    assert [p.rsplit("/", 1)[1] for p in find_runs([runs], "cuda:H100-SXM")] == ["gelu-gpu"]
    assert find_runs([runs], "cuda:A100") == []  # another GPU model's runs are not this device's

    def state():  # all but SQLite's shared-memory index, where every reader of a WAL database writes its read mark
        return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in runs.rglob("*") if p.is_file() and not p.name.endswith("-shm")}

    before = state()
    got = read_outcomes(found)
    assert state() == before
    if os.path.isdir("/proc/self/fd"):  # and nothing left open: a search reads hundreds of runs at its start
        held = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
        assert not [p for p in held if p.startswith(str(runs.resolve()))]
    assert len(got) == 6 and {o.problem for o in got} == {"sha-softmax", "sha-gelu"}
    tuned = next(o for o in got if o.features["kind"] == "tunable")
    assert tuned.log_ratio == pytest.approx(np.log(2.0 / 1.9))  # over its parent, not over the reference


@pytest.mark.slow
def test_a_search_given_earlier_runs_forecasts_before_its_own_fit_could_and_says_so(tmp_path, write):
    from kernelscout.agent.runner import OptimizeError, start_search

    runs = tmp_path / "runs"
    rows = [(features(kind, variant=v), FAMILY_EFFECT[kind] * (1 + 0.02 * v)) for kind in ("torch_compile", "cuda_graphs", "channels_last")
            for v in range(3)]
    _fake_run(runs / "a-1", "sha-a", "cpu", rows)
    _fake_run(runs / "b-1", "sha-b", "cpu", rows)
    problem = write("problem.py", SMALL_PROBLEM)
    result = start_search(problem=str(problem), space=None, budget=2, device="cpu", run_dir=str(runs / "new"), quiet=True,
                          history=[str(runs)])
    assert result.status == "finished"
    lines = [json.loads(x) for x in (runs / "new" / "events.jsonl").read_text().splitlines()]
    notes = [e["note"] for e in lines if e["event"] == "surrogate_note"]
    assert notes and notes[0].startswith("surrogate prior: 18 measured candidates of 2 problem(s)")
    # the runs it read are kept, so `kscout resume` forecasts from the same ones however the folder grows
    kept = json.loads(RunDir(runs / "new").get_meta("history_runs"))
    assert sorted(Path(k).name for k in kept) == ["a-1", "b-1"]
    forecasts = Archive(RunDir(runs / "new")).forecasts()
    informative = [f for f in forecasts if f["forecast"]["informative"]]
    # the problem itself never had the 8 timed candidates its own fit needs; the prior forecast anyway
    assert informative and all("prior from earlier runs" in f["forecast"]["rationale"] for f in informative)
    # a mistyped --history folder is an error before anything runs, not a search without its prior
    with pytest.raises(OptimizeError, match="no such folder"):
        start_search(problem=str(problem), space=None, budget=2, device="cpu", run_dir=str(tmp_path / "x"), quiet=True,
                     history=[str(tmp_path / "typo")])


def test_a_re_measured_candidate_counts_at_the_median_of_its_measurements(tmp_path):
    run = _fake_run(tmp_path / "r", "sha", "cpu", [(features("torch_compile"), 3.0)])
    cid = Archive(run).all()[0].id
    for label, sp in (("confirm:1", 1.9), ("confirm:2", 2.1)):
        Archive(run).record_confirmation(label, cid, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=sp), ok=True)
    (outcome,) = read_outcomes([tmp_path / "r"])
    assert outcome.speedup == pytest.approx(2.1)  # median of 3.0 (the lucky draw), 1.9 and 2.1


def test_what_this_problem_measured_moves_the_prior_from_the_first_measurement():
    rng = random.Random(3)
    prior = CrossProblemPrior([o for p in ("a", "b", "c") for o in outcomes(p, rng)])
    compile_next, graphs_next = features("torch_compile", variant=2), features("cuda_graphs", variant=2)
    before = prior.log_speedup([compile_next, graphs_next])
    # here compiling lost: two compiled variants measured 0.65x, where other problems gave about 1.8x
    seen = [(features("torch_compile", variant=0), math.log(0.65)), (features("torch_compile", variant=1), math.log(0.65))]
    after = prior.log_speedup([compile_next, graphs_next], seen)
    assert after[0] < before[0] - 0.5  # the next compiled variant is forecast much lower
    assert before[1] - 0.5 < after[1] < before[1]  # another family moves less: only the problem-wide part
    surrogate = OpenSpaceSurrogate("learned", prior=prior, reference_ms=lambda: 10.0)
    for f, r in seen:
        surrogate.update(f, Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, speedup=math.exp(r), runtime_ms=10 / math.exp(r)))
    p_faster = surrogate.predictive([compile_next]).p_faster_than(math.log(10.0))[0]
    assert p_faster < 0.5  # the search no longer expects the next compiled variant to beat the reference


def test_until_a_candidate_beats_the_reference_the_speedup_to_beat_is_the_references(tmp_path):
    """Forecasts rank candidates by their chance of beating the best so far. When every candidate measured so
    far ran slower than the reference (compiled variants at 0.66x), the best so far is the reference itself:
    ranking against 0.66x would call nearly everything a likely win and order candidates by their spread."""
    from kernelscout.agent.graph import SearchLoop, SearchSettings

    loop = SearchLoop(RunDir(tmp_path / "run"), target=None, policy=None, predictor=None, settings=SearchSettings(budget=4))
    assert loop._best_speedup() == 1.0
    _fake_run(tmp_path / "run", "sha", "cpu", [(features("torch_compile"), 0.66)])
    assert loop._best_speedup() == 1.0
    _fake_run(tmp_path / "run", "sha", "cpu", [(features("channels_last", variant=1), 1.4)])
    assert loop._best_speedup() == pytest.approx(1.4)
