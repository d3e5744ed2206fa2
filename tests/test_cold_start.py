"""Before a code problem has a forecast, the search builds on the kernel that won instead of trying every variant
of a rewrite that lost (agent/cold_start.py)."""

import json
from pathlib import Path

from conftest import EXAMPLES

from kernelscout.agent.policies.rewrites import LINEAGE_MARK
from kernelscout.agent.runner import start_search
from kernelscout.tools.archive import Archive
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement
from fake_llm_server import reply_text

CONV = EXAMPLES / "conv2d_relu" / "problem.py"


def lineage(source: str) -> list[str]:
    line = next(line for line in source.splitlines() if line.startswith(LINEAGE_MARK))
    return json.loads(line[len(LINEAGE_MARK):])


def as_on_this_vm(pool, problem, candidate, config):
    """conv2d_relu as the 2-core VM measured it: torch.compile alone slower than eager, channels_last faster, and
    faster again with anything on top of it. No sandbox runs: only the order of the measurements is under test."""
    chain = lineage(candidate.source)
    speedup = 0.82 if chain[0] == "torch_compile" else 1.26 if chain == ["channels_last"] else \
        1.45 if chain[0] == "channels_last" else 1.0
    return Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=speedup,
                       runtime_ms=100.0 / speedup, ref_runtime_ms=100.0)


def test_before_any_forecast_the_children_of_a_winning_kernel_come_before_more_variants_of_a_losing_rewrite(tmp_path, monkeypatch):
    import kernelscout.tools.measure as measure_tool

    monkeypatch.setattr(measure_tool, "run_measurement", as_on_this_vm)
    run = tmp_path / "run"
    result = start_search(problem=str(CONV), space=None, budget=6, device="cpu", run_dir=str(run), quiet=True,
                          report=False, confirm=0)
    assert result.measurements_used == 6
    archive = Archive(RunDir(run))
    measured = sorted((r for r in archive.all() if r.state == "measured"), key=lambda r: r.measurement_id)
    origins = [(r.parent_id, r.origin) for r in measured]
    assert origins[0] == (0, "rewrite:torch_compile")  # the policy's first proposal: 0.82x, a loss
    winner = next(r for r in measured if r.origin == "rewrite:channels_last" and r.speedup == 1.26)
    after = measured[measured.index(winner) + 1:]
    assert after and after[0].parent_id == winner.id  # built on at once
    assert all(lineage(Path(r.path).read_text())[0] == "channels_last" for r in after)  # and on what it led to
    assert (0, "rewrite:torch_compile") not in origins[1:]  # no second torch.compile of the reference
    assert result.best_speedup == 1.45
    predicts = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    orders = {e.get("order") for e in predicts if e.get("event") == "predict"}
    assert orders == {"this order: children of faster kernels first, variants of a rewrite that lost last"}  # the live log says it


PLAN_SOURCE = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self, scale):\n"
               "        super().__init__()\n        self.scale = scale\n\n    def forward(self, x, y):\n"
               "        return torch.relu(x * self.scale + y) + 0.5 * x  # experiment {tag}\n")
MEASURED = {"a": 1.05, "b": 1.2, "c": 1.4, "d": 1.1}  # what each experiment measures, whatever its plan claimed


def by_tag(pool, problem, candidate, config):
    tag = candidate.source.rsplit("experiment ", 1)[1].strip()
    return Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=MEASURED[tag],
                       runtime_ms=100.0 / MEASURED[tag], ref_runtime_ms=100.0)


def test_before_any_forecast_an_llm_plan_is_measured_fastest_expected_first(tmp_path, write, monkeypatch, local_llm):
    """The plan for the reference claims 1.1x, 3.0x and 1.5x for experiments a, b and c, in that order; the second
    plan claims 1.05x for d on whichever parent it was given. With the learned surrogate still cold, b (3.0x claimed)
    is measured first, then c (1.0 x 1.5), not d (at most 1.2 x 1.05) and not a (the oldest)."""
    import kernelscout.tools.measure as measure_tool
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app
    from conftest import SMALL_PROBLEM

    monkeypatch.setattr(measure_tool, "run_measurement", by_tag)

    def plan(*experiments):
        return reply_text(json.dumps({"experiments": [{"hypothesis": f"experiment {tag}", "expected_speedup": claim,
                                                       "source": PLAN_SOURCE.format(tag=tag)} for tag, claim in experiments]}))

    local_llm.script(plan(("a", 1.1), ("b", 3.0), ("c", 1.5)), *[plan(("d", 1.05))] * 10)
    run = tmp_path / "run"
    start_search(problem=str(write("problem.py", SMALL_PROBLEM)), space=None, budget=2, policy="llm", surrogate="learned",
                 device="cpu", run_dir=str(run), quiet=True, report=False, confirm=0)

    measured = sorted((r for r in Archive(RunDir(run)).all() if r.state == "measured"), key=lambda r: r.measurement_id)
    assert [r.hypothesis for r in measured] == ["experiment b", "experiment c"]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    orders = {e.get("order") for e in events if e.get("event") == "predict"}
    assert orders == {"this order: the fastest expected first (the parent's measured speedup times the plan's expected speedup)"}
    # the model is told how far its expectation was off when it plans the next experiments
    second_plan = json.dumps(local_llm.requests[1].body["messages"])
    assert "experiment b: 1.200x (1.20x its parent's speed, where 3.00x was expected)" in second_plan
    shown = CliRunner().invoke(app, ["show", str(run), "--report"], env={"COLUMNS": "200"}).output  # claims beside measurements
    assert "experiment b (expected 3.00x over parent)" in shown
    scored = "expected speedups: 4 made, 2 measured; direction right 100%, claimed / measured 1.79x"
    report = (run / "report.html").read_text()
    assert f"the plans' {scored}" in shown and scored in report and "experiment b (expected 3.00x over parent)" in report
