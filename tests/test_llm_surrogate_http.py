"""The LLM surrogate over real HTTP: the anthropic and openai SDKs against a scripted local server.

Each test builds the model the way a run does (make_chat_model with a base URL), asks the surrogate
for a forecast and checks what the search would do with it. A usable answer becomes a forecast; a
malformed, truncated or refused one ends as "unsure", which the gate measures, never as a crash.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernelscout.agent.llm import LLMConfig, RetryPolicy, make_chat_model
from kernelscout.tools.surrogates.decision import RiskControlledGate
from kernelscout.tools.surrogates.llm import LLMSurrogate, p_speedup_above

try:  # tests/ is on sys.path under pytest's default rootdir-relative imports
    from fake_llm_server import FakeLLMServer, fake_llm_server, malformed, reply_text  # noqa: F401 - fixture
except ImportError:  # pragma: no cover - if tests/ ever becomes a package
    from tests.fake_llm_server import FakeLLMServer, fake_llm_server, malformed, reply_text  # type: ignore  # noqa: F401

FAST_RETRIES = RetryPolicy(attempts=3, initial_wait_s=0.001, max_wait_s=0.02)
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5-mini"}
WIRE_FORMATS = pytest.mark.parametrize("provider", ["anthropic", "openai"])

PARENT = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, -1)\n"
CHILD = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return fused_softmax_kernel(x)\n"
FASTER = [0.0, 0.02, 0.03, 0.05, 0.3, 0.3, 0.2, 0.1]  # mass mostly above 1.05x
SLOWER = [0.2, 0.4, 0.2, 0.1, 0.05, 0.05, 0.0, 0.0]


def answer(probs: list[float], rationale: str = "fused kernel avoids two passes") -> str:
    return json.dumps({"probs": probs, "rationale": rationale})


def surrogate_for(server: FakeLLMServer, provider: str, **kwargs) -> LLMSurrogate:
    base_url = server.anthropic_base_url if provider == "anthropic" else server.openai_base_url
    config = LLMConfig(provider=provider, model=MODELS[provider], base_url=base_url, api_key="sk-test", timeout_s=2.0)
    model = make_chat_model(config, retry=FAST_RETRIES, env={}, config_files=[])
    assert model is not None
    return LLMSurrogate(model, **kwargs)


def forecast(surrogate: LLMSurrogate, incumbent_ratio: float = 1.2):
    return surrogate.forecast(child_source=CHILD, parent_source=PARENT, parent_ms=2.0, parent_speedup=1.0,
                              incumbent_ratio=incumbent_ratio, device="NVIDIA A100", sol="0.4 ms (memory bound)")


def sent_text(server: FakeLLMServer, k: int) -> str:
    return json.dumps(server.requests[k].body)


@WIRE_FORMATS
def test_a_well_formed_answer_is_critiqued_revised_and_becomes_a_forecast(fake_llm_server, provider):
    fake_llm_server.script(reply_text(answer(SLOWER, "first guess")), reply_text(answer(FASTER, "revised: one pass")))
    f = forecast(surrogate_for(fake_llm_server, provider))

    assert f.informative and f.surrogate == "llm"
    assert f.bin_probs == pytest.approx(FASTER)  # the revision, not the first answer
    assert f.p_faster == pytest.approx(p_speedup_above(FASTER, f.bin_edges, 1.0))
    assert f.p_faster > 0.8 and f.p_beats_incumbent is not None and f.p_beats_incumbent < f.p_faster
    assert f.expected_speedup > 1.0 and "revised: one pass" in f.rationale
    # the 80 % interval is read off the same bins: 10 % of FASTER's mass lies below 1.05x, 10 % above 2x
    assert f.speedup_interval_80 == pytest.approx((1.05, 2.0))
    # Two round trips: the forecast (which carried the code, device and speed of light), then the critique.
    assert fake_llm_server.request_count == 2
    assert "fused_softmax_kernel" in sent_text(fake_llm_server, 0) and "NVIDIA A100" in sent_text(fake_llm_server, 0)
    assert "what would make it wrong" in sent_text(fake_llm_server, 1)
    assert RiskControlledGate().decide(f).action == "measure"  # cold gate: promising or not, it measures


@WIRE_FORMATS
def test_malformed_json_is_reasked_then_deferred_to_a_measurement(fake_llm_server, provider):
    fake_llm_server.script(*[reply_text('{"probs": [0.5, 0.5,, "rationale": ') for _ in range(3)])
    f = forecast(surrogate_for(fake_llm_server, provider))

    assert fake_llm_server.request_count == 3  # the first ask and two re-asks with the parse error
    assert "could not be used" in sent_text(fake_llm_server, 1)
    assert not f.informative and f.p_faster == 0.5 and f.confidence == 0.0
    assert "deferring to a measurement" in f.rationale
    decision = RiskControlledGate().decide(f)
    assert decision.action == "measure" and "no usable forecast" in decision.reason


@WIRE_FORMATS
def test_a_malformed_answer_fixed_on_the_reask_still_gives_a_forecast(fake_llm_server, provider):
    fake_llm_server.script(reply_text("probs: about 0.3 faster"), reply_text(answer(FASTER)), reply_text(answer(FASTER)))
    f = forecast(surrogate_for(fake_llm_server, provider))
    assert f.informative and f.bin_probs == pytest.approx(FASTER)
    assert fake_llm_server.request_count == 3


@WIRE_FORMATS
def test_probabilities_that_do_not_sum_to_one_are_rejected_then_deferred(fake_llm_server, provider):
    fake_llm_server.script(*[reply_text(answer([0.5] * 8)) for _ in range(3)])
    f = forecast(surrogate_for(fake_llm_server, provider))
    assert not f.informative and "sum" in f.rationale


@WIRE_FORMATS
def test_a_reply_truncated_at_max_tokens_defers(fake_llm_server, provider):
    fake_llm_server.script(reply_text('{"probs": [0.1, 0.2, 0.3', stop="max_tokens"), reply_text(answer(FASTER)))
    f = forecast(surrogate_for(fake_llm_server, provider))

    assert not f.informative and "truncated" in f.rationale
    # Not re-asked: the same limit would cut the same answer again.
    assert fake_llm_server.request_count == 1 and fake_llm_server.pending == 1
    assert RiskControlledGate().decide(f).action == "measure"


@WIRE_FORMATS
def test_a_refusal_defers(fake_llm_server, provider):
    fake_llm_server.script(reply_text("I can't help with that.", stop="refusal"))
    f = forecast(surrogate_for(fake_llm_server, provider))
    assert not f.informative and "refusal" in f.rationale
    assert RiskControlledGate().decide(f).action == "measure"


@WIRE_FORMATS
def test_a_broken_http_body_is_retried_by_the_client_then_deferred(fake_llm_server, provider):
    fake_llm_server.script(malformed(), malformed(), malformed())
    f = forecast(surrogate_for(fake_llm_server, provider))
    assert fake_llm_server.request_count == FAST_RETRIES.attempts
    assert not f.informative and "unavailable" in f.rationale


@WIRE_FORMATS
def test_an_unusable_revision_keeps_the_first_answer_and_says_so(fake_llm_server, provider):
    fake_llm_server.script(reply_text(answer(FASTER)), reply_text("Let me think again...", stop="max_tokens"))
    f = forecast(surrogate_for(fake_llm_server, provider))
    assert f.informative and f.bin_probs == pytest.approx(FASTER)
    assert "revision unusable" in f.rationale and "first answer kept" in f.rationale


@WIRE_FORMATS
def test_stated_probabilities_are_recalibrated_from_measured_outcomes(fake_llm_server, provider):
    """An overconfident model says 0.9 faster, but only a third of such children were faster: after
    enough measurements its P(faster) is mapped down to what was observed, and the bins follow."""
    surrogate = surrogate_for(fake_llm_server, provider, min_calibration=10)
    raw = p_speedup_above(FASTER, surrogate.edges, 1.0)
    rng = np.random.default_rng(0)
    for k in range(30):
        stated = raw if k % 2 == 0 else 0.2
        faster = bool(rng.random() < (1 / 3 if stated == raw else 0.1))
        surrogate.observe(stated, 1.3 if faster else 0.8, label=f"#{k}")
    share_faster = np.mean([o for p, o in surrogate._history if p == raw])

    fake_llm_server.script(reply_text(answer(FASTER)), reply_text(answer(FASTER)))
    f = forecast(surrogate)

    assert surrogate.last_raw_p_faster == pytest.approx(raw)
    assert f.p_faster == pytest.approx(share_faster, abs=0.02)  # isotonic fit at the stated 0.9
    assert "recalibrated" in f.rationale
    assert p_speedup_above(f.bin_probs, f.bin_edges, 1.0) == pytest.approx(f.p_faster, abs=0.02)
    assert "measured 1.300x" in sent_text(fake_llm_server, 0) or "measured 0.800x" in sent_text(fake_llm_server, 0)


def test_no_recalibration_before_enough_outcomes_of_both_kinds(fake_llm_server):
    surrogate = surrogate_for(fake_llm_server, "openai", min_calibration=10)
    for k in range(20):
        surrogate.observe(0.9, 0.8, label=f"#{k}")  # all slower: nothing to fit an isotonic map on
    fake_llm_server.script(reply_text(answer(FASTER)), reply_text(answer(FASTER)))
    f = forecast(surrogate)
    assert f.p_faster == pytest.approx(p_speedup_above(FASTER, f.bin_edges, 1.0))
    assert "recalibrated" not in f.rationale


def test_a_pending_candidate_forecast_again_costs_no_chat_call_but_gets_todays_calibration(fake_llm_server):
    """The search forecasts proposals it kept for later once per iteration; the LLM is asked once per
    parent and child, and its answer is recalibrated with what has been measured since."""
    surrogate = surrogate_for(fake_llm_server, "openai", min_calibration=10)
    fake_llm_server.script(reply_text(answer(FASTER)), reply_text(answer(FASTER)))
    first = forecast(surrogate)
    raw = p_speedup_above(FASTER, surrogate.edges, 1.0)
    for k in range(20):
        surrogate.observe(raw if k % 2 else 0.2, 0.8 if k % 4 else 1.3, label=f"#{k}")  # confident, mostly wrong

    again = forecast(surrogate, incumbent_ratio=1.5)

    assert fake_llm_server.request_count == 2  # the first forecast and its critique, nothing more
    assert again.p_faster < first.p_faster and "recalibrated" in again.rationale and "earlier answer" in again.rationale
    assert again.p_beats_incumbent < first.p_beats_incumbent
    fake_llm_server.script(reply_text(answer(SLOWER)), reply_text(answer(SLOWER)))
    other = surrogate.forecast(child_source=CHILD + "\n# unrolled", parent_source=PARENT, parent_ms=2.0, parent_speedup=1.0,
                               incumbent_ratio=1.2, device="NVIDIA A100", sol="0.4 ms (memory bound)")
    assert fake_llm_server.request_count == 4 and other.p_faster < 0.5  # a different child is asked about
