"""The LLM policy: plan several experiments per parent, write their code, repair what fails.

It sees the problem, the parent's code and measurement, a contrasting kernel from the archive
(GPU Kernel Scientist), speed-of-light headroom and a digest of what was tried. A proposal whose
code does not even parse is repaired before it can reach the budget; a measured compile or
correctness failure is repaired from its error text within a small allowance.
"""

from __future__ import annotations

import ast
import hashlib
import random
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from kernelscout.agent.policies.tuner import ParentInfo, Proposal
from kernelscout.prompts import load as load_prompt
from kernelscout.tools.claim_check import CLAIM_KEY


class Experiment(BaseModel):
    hypothesis: str
    expected_speedup: float = Field(1.0, gt=0)
    source: str


class ExperimentPlan(BaseModel):
    experiments: list[Experiment] = Field(default_factory=list)


def static_problem(source: str) -> Optional[str]:
    """Why this source cannot be a candidate, judged without running it (None when it can)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"SyntaxError at line {exc.lineno}: {exc.msg}"
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return "the module defines no class ModelNew"
    return None


class LLMPolicy:
    name = "llm"
    grows_the_best_first = True  # with no forecast yet, the plans' expected speedups order what is measured (agent/cold_start.py)

    def __init__(self, model: Any, digest: Callable[[], str], contrast: Callable[[], Optional[tuple[str, str]]],
                 sol_text: str = "unknown", repair_allowance: int = 2, max_tokens: int = 8192):
        self.model = model
        self.digest = digest
        self.contrast = contrast
        self.sol_text = sol_text
        self.repair_allowance = repair_allowance
        self.repairs: dict[str, int] = {}  # lineage root sha -> repairs spent
        self.notes: list[str] = []  # why answers were dropped; the loop reports each (event "policy_note")
        self.barren: set[str] = set()  # digests of propose prompts whose answer held nothing new
        # room for the several complete modules a plan holds; a reply cut off is dropped whole
        self.max_tokens = max_tokens

    def _ask(self, prompt: str, schema):
        """The model's answer, or None with the reason kept in `notes` (a refusal, no JSON, a reply cut
        off). A provider that cannot be reached is not an answer: it raises, so the search stops
        unfinished and `kscout resume` goes on once the service is back, instead of ending the search
        as if the model had nothing more to offer (found in a review)."""
        from kernelscout.agent.llm import LLMUnavailableError, Message, structured_outcome

        messages = [Message.system("You write fast, correct PyTorch/Triton/C++ kernels. Answer only with the JSON asked for."),
                    Message.user(prompt)]
        outcome = structured_outcome(self.model, messages, schema, max_tokens=self.max_tokens)
        if outcome.failure == "unavailable":
            raise LLMUnavailableError(outcome.detail)
        if outcome.value is None:
            self.notes.append(f"the model's reply was not usable ({outcome.failure}): {outcome.detail[:300]}")
        return outcome.value

    def propose(self, parent: ParentInfo, k: int, rng: random.Random) -> list[Proposal]:
        problem_source = Path(parent.problem_path).read_text()
        parent_source = problem_source if parent.is_reference else Path(parent.path).read_text()
        contrast = self.contrast()
        contrast_text = f"\n## A contrasting kernel from the archive ({contrast[0]})\n```python\n{contrast[1]}\n```\n" if contrast else ""
        prompt = load_prompt("propose").format(
            k=k, device=parent.device, sol=self.sol_text, problem_path=parent.problem_path, problem_source=problem_source,
            parent_label="the reference itself" if parent.is_reference else f"candidate #{parent.id}",
            parent_measured=f"{parent.speedup:.3f}x over the reference" if parent.speedup else "not yet",
            parent_source=parent_source, contrast=contrast_text, digest=self.digest() or "(nothing yet)",
        )
        key = hashlib.sha256(prompt.encode()).hexdigest()
        if key in self.barren:  # the same question, word for word, as one that gave nothing new: not paid for again
            self.notes.append("the model offered nothing new for this parent and nothing has changed since; not asked again")
            return []
        plan = self._ask(prompt, ExperimentPlan)
        if plan is None:
            return []
        out = []
        for exp in plan.experiments[:k]:
            proposal = self._checked(exp, parent)
            if proposal is not None and proposal.sha not in parent.tried_shas:
                out.append(proposal)
        if not out:
            self.barren.add(key)
        return out

    def _proposal(self, exp: Experiment, parent: ParentInfo, origin: str = "llm") -> Proposal:
        return Proposal(source=exp.source, origin=origin, params={}, hypothesis=exp.hypothesis, parent_id=parent.id,
                        features={"origin": origin, CLAIM_KEY: float(exp.expected_speedup)})

    def _checked(self, exp: Experiment, parent: ParentInfo) -> Optional[Proposal]:
        """Repair code that cannot parse before it costs anything."""
        for attempt in range(self.repair_allowance + 1):
            problem = static_problem(exp.source)
            if problem is None:
                return self._proposal(exp, parent, "llm" if attempt == 0 else "llm:repaired")
            if attempt == self.repair_allowance:
                self.notes.append(f"dropped an experiment that still failed after {attempt} repairs: {problem}")
                return None
            fixed = self._ask(load_prompt("repair").format(status="compile_error", message=problem, source=exp.source), Experiment)
            if fixed is None:
                return None
            exp = fixed
        return None

    def repair(self, source: str, status: str, message: str, parent: ParentInfo, lineage: str) -> Optional[Proposal]:
        """Fix a measured failure from its error text, within the allowance for this lineage."""
        if self.repairs.get(lineage, 0) >= self.repair_allowance:
            return None
        self.repairs[lineage] = self.repairs.get(lineage, 0) + 1
        fixed = self._ask(load_prompt("repair").format(status=status, message=message[-3000:], source=source), Experiment)
        if fixed is None or static_problem(fixed.source) is not None:
            return None
        return self._proposal(fixed, parent, "llm:repaired")


def make_llm_policy(spec: Any, target: Any, model: Any = None) -> LLMPolicy:
    from kernelscout.agent.llm import require_chat_model
    from kernelscout.tools.archive import ROOT_ID, Archive
    from kernelscout.tools.claim_check import plan_claim

    model = require_chat_model(model, "the llm policy")
    archive = Archive(target.run)

    def digest() -> str:
        """The latest candidates and what they measured; where a plan said what it expected, the claim beside the
        outcome over the same parent, so the model sees how far its expectations were off (GPU Kernel Scientist's record)."""
        records = archive.all()
        speedups = {r.id: r.speedup for r in records}
        lines = []
        for rec in records[-20:]:
            result = f"{rec.speedup:.3f}x" if rec.speedup else rec.state
            claim = plan_claim(rec)
            parent = 1.0 if rec.parent_id in (None, ROOT_ID) else speedups.get(rec.parent_id)
            if claim is not None and rec.speedup and parent:
                result += f" ({rec.speedup / parent:.2f}x its parent's speed, where {claim:.2f}x was expected)"
            lines.append(f"- #{rec.id} ({rec.origin}) {rec.hypothesis[:100]}: {result}")
        return "\n".join(lines)

    def contrast() -> Optional[tuple[str, str]]:
        measured = [r for r in archive.all() if r.path and r.state in ("measured", "failed")]
        if len(measured) < 2:
            return None
        worst = min(measured, key=lambda r: r.speedup or 0.0)
        return (f"#{worst.id}, {'%.3fx' % worst.speedup if worst.speedup else worst.state}", Path(worst.path).read_text())

    bounds = getattr(target, "bounds", None)
    sol = f"{bounds.time_ms:.4g} ms ({bounds.bound}-bound)" if bounds else "unknown"
    return LLMPolicy(model, digest, contrast, sol_text=sol)
