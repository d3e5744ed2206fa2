"""The LLM policy and the LLM surrogate driven through the real search loop by a scripted model.

The script covers a proposal that does not parse (repaired before it costs anything), a measured
failure repaired from its error text, a forecast confident enough to skip a candidate, and the
budget running out in the middle of an iteration.
"""

import json

from kernelscout.agent.factory import llm_forecaster
from kernelscout.agent.graph import SearchLoop, SearchSettings
from kernelscout.agent.llm import ScriptedChatModel
from kernelscout.agent.policies.llm_policy import make_llm_policy
from kernelscout.agent.targets import CodeTarget, reference_ms
from kernelscout.tools.archive import Archive
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.surrogates.decision import RiskControlledGate
from conftest import QUICK, SMALL_PROBLEM

# The reference takes a float64 detour, so an honest float32 candidate is clearly faster even on a
# busy machine: the test is about the loop's decisions, not about a marginal speedup.
SLOW_REFERENCE = SMALL_PROBLEM.replace(
    "return torch.relu(x * self.scale + y) + 0.5 * x",
    "return (torch.relu(x.double() * self.scale + y.double()) + 0.5 * x.double()).float()",
).replace("torch.randn(256, 512), torch.randn(256, 512)", "torch.randn(512, 1024), torch.randn(512, 1024)")

HEADER = "import torch\nimport torch.nn as nn\n\n"
GOOD = HEADER + "class ModelNew(nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n        self.scale = scale\n\n    def forward(self, x, y):\n        out = torch.relu(x * self.scale + y)\n        return out.add_(x, alpha=0.5)  # {tag}\n"
WRONG = GOOD.replace("alpha=0.5", "alpha=0.6")
BROKEN = HEADER + "class ModelNew(nn.Module)\n    pass  # first try\n"
SLOW = GOOD.replace("# {tag}", "# SLOW: a Python loop over rows {tag}").replace(
    "out = torch.relu(x * self.scale + y)", "out = torch.stack([torch.relu(r * self.scale + q) for r, q in zip(x, y)])")

FAST_BINS = [0.0, 0.0, 0.0, 0.05, 0.15, 0.5, 0.25, 0.05]
SLOW_BINS = [0.7, 0.25, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0]


def _exp(source, why="fuse the epilogue"):
    return {"hypothesis": why, "expected_speedup": 1.3, "source": source}


class Script:
    """Answers by what is asked, so the order of calls inside the loop does not matter."""

    def __init__(self):
        self.proposals = 0
        self.repairs = []

    def __call__(self, request):
        prompt = next(m.content for m in reversed(request.messages) if m.role == "user")
        if "Propose up to" in prompt:
            self.proposals += 1
            if self.proposals == 1:
                return json.dumps({"experiments": [_exp(BROKEN), _exp(GOOD.format(tag="b")), _exp(SLOW.format(tag="c"), "float64 accumulation")]})
            return json.dumps({"experiments": [_exp(WRONG.format(tag="d")), _exp(GOOD.format(tag="e"))]})
        if "failed with status" in prompt:
            self.repairs.append(prompt.split("`")[1])
            return json.dumps(_exp(GOOD.format(tag=f"fixed{len(self.repairs)}"), "fixed"))
        if "Forecast how much faster" in prompt or "Critique your forecast" in prompt:
            forecast_prompt = next(m.content for m in request.messages if m.role == "user")
            child = forecast_prompt.split("## Child")[1]
            bins = SLOW_BINS if "SLOW" in child else FAST_BINS
            return json.dumps({"probs": bins, "rationale": "a Python loop launches one op per row" if "SLOW" in child else "fewer passes"})
        raise AssertionError(f"unexpected prompt: {prompt[:200]}")


def test_llm_policy_through_the_loop(tmp_path, write, pool):
    problem = write("problem.py", SLOW_REFERENCE)
    run = RunDir(tmp_path / "run")
    Budget(run).set_cap(4)
    script = Script()
    model = ScriptedChatModel([script] * 200)
    target = CodeTarget(problem, "cpu", run, pool=pool, harness=QUICK)
    policy = make_llm_policy(None, target, model=model)
    gate = RiskControlledGate(target_risk=0.5, audit_rate=1e-9)
    predictor = llm_forecaster(target, lambda: reference_ms(run), model=model, gate=gate)
    settings = SearchSettings(budget=4, proposals_per_iteration=3, measure_per_iteration=2)
    state = SearchLoop(run, target, policy, predictor, settings).run_to_end()

    archive = Archive(run)
    records = archive.all()
    by_origin = {}
    for r in records:
        by_origin.setdefault(r.origin, []).append(r)
    # the proposal that did not parse was repaired before reaching the sandbox
    assert script.repairs[0] == "compile_error"
    assert "class ModelNew(nn.Module)\n    pass" not in "".join(open(r.path).read() for r in records)
    # a measured failure was repaired from its error text and the repair was measured
    assert "incorrect" in script.repairs
    repaired = [r for r in records if "repair_of" in r.params]
    assert repaired and all(r.state in ("measured", "proposed") for r in repaired)
    # the slow candidate was forecast as slower and skipped, never measured
    slow = [r for r in records if "SLOW" in open(r.path).read()]
    assert slow and slow[0].state == "skipped" and slow[0].measurement_id is None
    skip = [f for f in archive.forecasts() if f["candidate_id"] == slow[0].id and f["decision"] == "skip"]
    assert skip and "confidently worse" in skip[0]["reason"]
    # the budget ran out in the middle of an iteration, and was never exceeded
    assert state["stop_reason"] == "measurement budget spent"
    status = Budget(run).status()
    assert status.used == 4 and status.reserved == 0
    assert archive.best() is not None and archive.best().speedup > 0
