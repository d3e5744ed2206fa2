"""The LLM surrogate: a self-reflective forecaster over code, recalibrated by what the run measures.

It reads parent and child code, the parent's measurement, the device and speed-of-light, and a few
measured examples; it answers with probabilities over ordinal speedup bins, then critiques its own
forecast and revises it. Malformed, truncated or refused answers end as an uninformative forecast,
which the decision rule treats as unsure (measure), never as a crash. Its P(faster) is recalibrated
with isotonic regression once the run has measured enough outcomes of both kinds.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from pydantic import BaseModel, Field, field_validator

from kernelscout.prompts import load as load_prompt
from kernelscout.tools.predict import Forecast, SurrogateCost, uninformative_forecast
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES, bin_labels


class BinAnswer(BaseModel):
    probs: list[float] = Field(description="probability of each speedup bin")
    rationale: str = ""

    @field_validator("probs")
    @classmethod
    def _valid(cls, v: list[float]) -> list[float]:
        if any((not math.isfinite(p)) or p < 0 for p in v):
            raise ValueError("probabilities must be finite and non-negative")
        if not 0.9 <= sum(v) <= 1.1:
            raise ValueError(f"probabilities sum to {sum(v):.3f}, not 1")
        return v


def _bin_bounds(edges: Sequence[float]) -> list[tuple[float, float]]:
    lows = [edges[0] / 2] + list(edges)
    highs = list(edges) + [edges[-1] * 2]
    return list(zip(lows, highs))


def p_speedup_above(probs: Sequence[float], edges: Sequence[float], r: float) -> float:
    """P(speedup > r), interpolating log-uniformly inside the bin that contains r."""
    total = 0.0
    for p, (lo, hi) in zip(probs, _bin_bounds(edges)):
        if r <= lo:
            total += p
        elif r < hi:
            total += p * (math.log(hi) - math.log(r)) / (math.log(hi) - math.log(lo))
    return min(1.0, max(0.0, total))


def speedup_quantile(probs: Sequence[float], edges: Sequence[float], q: float) -> float:
    """The speedup below which the bins put probability q, log-uniform inside a bin (as `p_speedup_above`
    reads them); the open end bins reach half the lowest edge and twice the highest."""
    below = 0.0
    bounds = _bin_bounds(edges)
    for p, (lo, hi) in zip(probs, bounds):
        if p > 0 and below + p >= q:
            share = min(1.0, max(0.0, (q - below) / p))
            return float(math.exp(math.log(lo) + share * (math.log(hi) - math.log(lo))))
        below += p
    return float(bounds[-1][1])


class LLMSurrogate:
    name = "llm"

    def __init__(self, model: Any, edges: Sequence[float] = DEFAULT_EDGES, examples: int = 6, min_calibration: int = 10):
        self.model = model
        self.edges = list(edges)
        self.examples = examples
        self.min_calibration = min_calibration
        self._history: list[tuple[float, bool]] = []  # (raw P(faster), measured faster)
        self._measured: list[str] = []
        self._calibrator = None
        self._answers: dict[tuple, tuple[BinAnswer, str]] = {}  # (parent, child, parent time) -> usable answer, note

    def _tokens(self) -> tuple[int, int]:
        """Tokens the chat model's meter has counted so far (0, 0 for a model without one, such as a scripted one)."""
        meter = getattr(self.model, "meter", None)
        if meter is None:
            return 0, 0
        state = meter.state
        return state.input_tokens, state.output_tokens

    def _cost(self, start: float, tokens_before: tuple[int, int]) -> SurrogateCost:
        """What this forecast cost: its time and the tokens its calls used (a user paying per token reads them here)."""
        now = self._tokens()
        return SurrogateCost(latency_ms=(time.perf_counter() - start) * 1e3, tokens_in=now[0] - tokens_before[0],
                             tokens_out=now[1] - tokens_before[1])

    def _ask(self, messages) -> tuple[Optional[BinAnswer], str]:
        from kernelscout.agent.llm import structured_outcome

        outcome = structured_outcome(self.model, messages, BinAnswer)
        if outcome.value is not None and len(outcome.value.probs) != len(self.edges) + 1:
            return None, f"answer had {len(outcome.value.probs)} probabilities, expected {len(self.edges) + 1}"
        return outcome.value, (outcome.failure or "") + (f": {outcome.detail}" if outcome.detail else "")

    def forecast(self, child_source: str, parent_source: str, parent_ms: Optional[float], parent_speedup: float,
                 incumbent_ratio: Optional[float], device: str, sol: str, related: Sequence[str] = ()) -> Forecast:
        """incumbent_ratio: the speedup over the parent that a new best would need. related: the same
        child and parent as measured on other devices, one line each (`transfer_lines`)."""
        from kernelscout.agent.llm import Message

        start, tokens = time.perf_counter(), self._tokens()
        self.last_raw_p_faster = None
        key = (parent_source, child_source, parent_ms, device)
        if key in self._answers:  # a pending candidate forecast again: the answer stands, the calibration is today's
            answer, note = self._answers[key]
            return self._from_answer(answer, note + " (the earlier answer for this parent and child)", incumbent_ratio, start, tokens)
        n = len(self.edges) + 1
        prompt = load_prompt("forecast").format(
            device=device, parent_ms=f"{parent_ms:.4g} ms" if parent_ms else "not yet measured", parent_speedup=f"{parent_speedup:.3f}x",
            sol=sol, parent_source=parent_source, child_source=child_source, bins=", ".join(bin_labels(self.edges)), n_bins=n,
            examples="\n".join(self._measured[-self.examples:]) or "(none yet)",
            related=(RELATED_HEADER + "\n".join(related) + "\n") if related else "",
        )
        messages = [Message.system("You forecast GPU kernel performance. Answer only with the JSON asked for."), Message.user(prompt)]
        first, why = self._ask(messages)
        if first is None:
            return self._unsure(f"LLM forecast unusable ({why or 'no answer'}); deferring to a measurement", start, tokens)
        messages += [Message.assistant(first.model_dump_json()), Message.user(load_prompt("reflect").format(n_bins=n))]
        revised, why = self._ask(messages)
        answer = revised or first
        note = "" if revised else f" (revision unusable: {why}; first answer kept)"
        self._answers[key] = (answer, note)
        return self._from_answer(answer, note, incumbent_ratio, start, tokens)

    def _from_answer(self, answer: BinAnswer, note: str, incumbent_ratio: Optional[float], start: float,
                     tokens: tuple[int, int] = (0, 0)) -> Forecast:
        probs = np.asarray(answer.probs, dtype=float)
        probs = probs / probs.sum()
        raw_pf = p_speedup_above(probs, self.edges, 1.0)
        self.last_raw_p_faster = raw_pf
        pf = self._recalibrate(raw_pf)
        probs = self._reweight(probs, raw_pf, pf)
        bounds = _bin_bounds(self.edges)
        expected = float(sum(p * math.sqrt(lo * hi) for p, (lo, hi) in zip(probs, bounds)))
        pb = p_speedup_above(probs, self.edges, incumbent_ratio) if incumbent_ratio else None
        return Forecast(
            surrogate=self.name, informative=True, bin_edges=self.edges, bin_labels=bin_labels(self.edges), bin_probs=probs.tolist(),
            p_faster=pf, p_beats_incumbent=pb, expected_speedup=expected, confidence=abs(2 * pf - 1),
            speedup_interval_80=(speedup_quantile(probs, self.edges, 0.1), speedup_quantile(probs, self.edges, 0.9)),
            rationale=(answer.rationale or "LLM forecast") + note + (f" [P(faster) recalibrated {raw_pf:.2f}->{pf:.2f}]" if pf != raw_pf else ""),
            cost=self._cost(start, tokens),
        )

    def _unsure(self, reason: str, start: float, tokens: tuple[int, int] = (0, 0)) -> Forecast:
        return uninformative_forecast(self.name, reason, self.edges, self._cost(start, tokens))

    def _recalibrate(self, raw: float) -> float:
        outcomes = [o for _, o in self._history]
        if len(self._history) < self.min_calibration or all(outcomes) or not any(outcomes):
            return raw
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(y_min=0.01, y_max=0.99, out_of_bounds="clip")
        iso.fit([p for p, _ in self._history], [float(o) for o in outcomes])
        return float(iso.predict([raw])[0])

    def _reweight(self, probs: np.ndarray, raw: float, calibrated: float) -> np.ndarray:
        """Tilt the bins so that they give the recalibrated P(faster) back.

        Each bin's weight is multiplied by exp(t * s), where s is +1 for a bin wholly above 1x, -1 for
        one wholly below and in between for the bin that straddles 1x (by its share above, as
        `p_speedup_above` reads it); t is found by bisection, since P(faster) grows with t.
        """
        if abs(raw - calibrated) < 1e-9 or raw in (0.0, 1.0):
            return probs
        above = np.array([p_speedup_above(np.eye(len(probs))[k], self.edges, 1.0) for k in range(len(probs))])
        sign = 2.0 * above - 1.0

        def tilted(t: float) -> np.ndarray:
            w = probs * np.exp(t * sign - np.max(t * sign))
            return w / w.sum()

        lo, hi = -50.0, 50.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if float(tilted(mid) @ above) < calibrated:
                lo = mid
            else:
                hi = mid
        return tilted(0.5 * (lo + hi))

    def observe(self, raw_p_faster: Optional[float], measured_ratio: Optional[float], label: str = "") -> None:
        if measured_ratio is None:
            return
        if raw_p_faster is not None:
            self._history.append((raw_p_faster, measured_ratio > 1.0))
        self._measured.append(f"- {label}: measured {measured_ratio:.3f}x over its parent")


RELATED_HEADER = ("\n## The same parent and child measured on other devices (parent/child speedups)\n"
                  "Devices differ, but which parameters matter often carries over.\n")


def transfer_lines(priors: Sequence[Any], parent: dict[str, Any], child: dict[str, Any]) -> list[str]:
    """What the child gained over the parent on each other device that timed both (warm start for
    the LLM: the recorded ratio, never an imputed one)."""
    lines = []
    for prior in priors:
        ratio = prior.measured_ratio(parent, child)
        if ratio is not None:
            lines.append(f"- {prior.name}: measured {ratio:.3f}x")
    return lines


SPACE_SOL = "unknown (a recorded space has no FLOP or byte counts)"


def describe_config(space: Any, config: dict[str, Any]) -> str:
    """A configuration of a recorded tuning space (a ReplaySpace) as the "code" the LLM reads: one
    assignment per tunable parameter, so the forecast prompt's parent and child blocks stay Python."""
    head = f"# Kernel Tuner configuration of {space.kernel_name or 'the kernel'}" + (
        f", problem size {space.problem_size}" if space.problem_size else "")
    return "\n".join([head] + [f"{name} = {value!r}" for name, value in dict(config).items()]) + "\n"


def read_source(path: Optional[str]) -> str:
    return Path(path).read_text() if path and Path(path).exists() else "(not available)"
