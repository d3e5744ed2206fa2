"""kernelscout.agent.llm: the real anthropic and openai SDKs against a scripted local server.

Each test reads as a usage example: build a model the way a run does
(make_chat_model with an LLMConfig), talk to it, and check what came back and
what actually went over the wire.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from kernelscout.agent.llm import (
    BudgetExceeded,
    ChatResponse,
    LLMConfig,
    LLMConfigError,
    LLMUnavailableError,
    Message,
    RetryPolicy,
    ScriptedChatModel,
    ScriptExhausted,
    ToolCall,
    ToolSpec,
    Usage,
    UsageMeter,
    UsageState,
    describe_how_to_enable,
    extract_json_candidates,
    make_chat_model,
    structured,
    structured_outcome,
)
from kernelscout.agent.llm_config import resolve_llm_config
from kernelscout.agent.llm_pricing import ModelPrice, PriceTable

try:  # tests/ is on sys.path under pytest's default rootdir-relative imports
    from fake_llm_server import (
        FakeLLMServer,
        Reply,
        Status,
        fake_llm_server,  # a pytest fixture
        hang,
        malformed,
        rate_limited,
        reply_text,
        reply_tool_call,
        server_error,
        unauthorized,
    )
except ImportError:  # pragma: no cover - if tests/ ever becomes a package
    from tests.fake_llm_server import (  # type: ignore[no-redef]
        FakeLLMServer,
        Reply,
        Status,
        fake_llm_server,  # noqa: F401 - a pytest fixture
        hang,
        malformed,
        rate_limited,
        reply_text,
        reply_tool_call,
        server_error,
        unauthorized,
    )

FAST_RETRIES = RetryPolicy(attempts=3, initial_wait_s=0.001, max_wait_s=0.02)
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5-mini", "openai-compatible": "qwen2.5-coder-32b"}
WIRE_FORMATS = pytest.mark.parametrize("provider", ["anthropic", "openai"])


def connect(server: FakeLLMServer, provider: str, *, api_key: str | None = "sk-test", **config):
    """A model configured the way a run configures one, pointed at the fake server."""
    base_url = server.anthropic_base_url if provider == "anthropic" else server.openai_base_url
    cfg = LLMConfig(provider=provider, model=config.pop("model", MODELS[provider]), base_url=base_url,
                    api_key=api_key, timeout_s=config.pop("timeout_s", 0.3), **config)
    model = make_chat_model(cfg, retry=FAST_RETRIES, env={}, config_files=[])
    assert model is not None
    return model


LLM_ENV = ["KSCOUT_PROVIDER", "KSCOUT_MODEL", "KSCOUT_BASE_URL", "KSCOUT_API_KEY", "KSCOUT_LLM_MAX_USD",
           "KSCOUT_LLM_MAX_TOKENS", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No LLM settings from the developer's shell; cwd and ~/.config are empty temp dirs."""
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


class MeasureArgs(BaseModel):
    candidate: str
    repeats: int = Field(3, ge=1)


class Forecast(BaseModel):
    speedup: float = Field(gt=0)
    confidence: float = Field(ge=0, le=1)


# --------------------------------------------------------------------------------------
# Plain replies, accounting, wire shape
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("provider", "expected_usd"),
    [("anthropic", (1000 * 3.0 + 500 * 15.0) / 1e6), ("openai", (1000 * 0.25 + 500 * 2.0) / 1e6)],
)
def test_text_reply_is_counted_per_call_and_per_run(fake_llm_server, provider, expected_usd):
    fake_llm_server.script(reply_text("hello", input_tokens=1000, output_tokens=500),
                           reply_text("again", input_tokens=1000, output_tokens=500))
    model = connect(fake_llm_server, provider)

    first = model.chat([Message.system("You write CUDA."), Message.user("hi")], max_tokens=64)
    model.chat("once more", max_tokens=64)

    assert first.text == "hello"
    assert first.stop_reason == "end_turn"
    assert first.usage == Usage(input_tokens=1000, output_tokens=500)
    assert first.cost_usd == pytest.approx(expected_usd)
    run = model.meter.state
    assert (run.calls, run.input_tokens, run.output_tokens) == (2, 2000, 1000)
    assert run.cost_usd == pytest.approx(2 * expected_usd)
    assert run.by_model[MODELS[provider]].calls == 2


def test_anthropic_gets_system_as_a_top_level_parameter_and_no_temperature(fake_llm_server):
    fake_llm_server.script(reply_text("ok"))
    connect(fake_llm_server, "anthropic").chat(
        [Message.system("You write CUDA."), Message.user("hi")], max_tokens=64, temperature=0.2
    )

    sent = fake_llm_server.requests[0].body
    assert sent["system"] == "You write CUDA."
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert sent["max_tokens"] == 64
    assert "temperature" not in sent  # API 2026-10-21 rejects sampling parameters


def test_openai_keeps_system_in_messages_and_picks_the_right_token_limit(fake_llm_server):
    fake_llm_server.script(reply_text("ok"), reply_text("ok"))
    convo = [Message.system("You write CUDA."), Message.user("hi")]
    connect(fake_llm_server, "openai").chat(convo, max_tokens=64, temperature=0.2)
    connect(fake_llm_server, "openai-compatible").chat(convo, max_tokens=64)

    openai_body, local_body = (r.body for r in fake_llm_server.requests)
    assert openai_body["messages"][0] == {"role": "system", "content": "You write CUDA."}
    assert openai_body["max_completion_tokens"] == 64 and "max_tokens" not in openai_body
    assert openai_body["temperature"] == 0.2
    assert local_body["max_tokens"] == 64 and "max_completion_tokens" not in local_body
    assert "temperature" not in local_body


def test_local_server_needs_no_key_and_an_unpriced_model_is_flagged(fake_llm_server):
    fake_llm_server.script(reply_text("hi", input_tokens=100, output_tokens=100))
    model = connect(fake_llm_server, "openai-compatible", api_key=None)

    reply = model.chat("hi")

    assert reply.text == "hi"
    assert (reply.cost_usd, reply.priced) == (0.0, False)
    assert model.meter.state.unpriced_models == [MODELS["openai-compatible"]]


# --------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------
@WIRE_FORMATS
def test_tool_call_round_trip(fake_llm_server, provider):
    fake_llm_server.script(reply_tool_call("measure", {"candidate": "k1", "repeats": 5}, text="Measuring."),
                           reply_text("k1 is 1.4x faster"))
    model = connect(fake_llm_server, provider)
    tools = [ToolSpec.from_model("measure", "Time a candidate kernel on the GPU.", MeasureArgs)]
    convo = [Message.system("You optimise kernels."), Message.user("Is k1 faster?")]

    call = model.chat(convo, tools=tools)
    assert call.stop_reason == "tool_use"
    [tool_call] = call.tool_calls
    assert (tool_call.name, tool_call.arguments) == ("measure", {"candidate": "k1", "repeats": 5})
    assert MeasureArgs.model_validate(tool_call.arguments).repeats == 5

    convo += [call.to_message(), Message.tool_result(tool_call.id, "speedup 1.4x")]
    final = model.chat(convo, tools=tools)
    assert final.text == "k1 is 1.4x faster"

    first, second = (r.body for r in fake_llm_server.requests)
    if provider == "anthropic":
        assert first["tools"][0]["input_schema"]["properties"]["candidate"] == {"title": "Candidate", "type": "string"}
        assistant, result = second["messages"][1], second["messages"][2]
        assert assistant["content"][1] == {"type": "tool_use", "id": tool_call.id, "name": "measure",
                                           "input": {"candidate": "k1", "repeats": 5}}
        assert result == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_call.id, "content": "speedup 1.4x"}]}
    else:
        assert first["tools"][0]["type"] == "function"
        assert first["tools"][0]["function"]["parameters"]["required"] == ["candidate"]
        assistant, result = second["messages"][2], second["messages"][3]
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"candidate": "k1", "repeats": 5}
        assert result == {"role": "tool", "tool_call_id": tool_call.id, "content": "speedup 1.4x"}


def test_parallel_tool_results_share_one_anthropic_user_turn(fake_llm_server):
    fake_llm_server.script(reply_text("done"))
    model = connect(fake_llm_server, "anthropic")
    assistant = Message.assistant("Timing both.", [
        ToolCall(id="t1", name="measure", arguments={"candidate": "a"}),
        ToolCall(id="t2", name="measure", arguments={"candidate": "b"}),
    ])
    model.chat([Message.user("compare a and b"), assistant, Message.user("(2 measurements left)"),
                Message.tool_result("t1", "1.1 ms"), Message.tool_result("t2", "compile error", is_error=True)])

    turns = fake_llm_server.requests[0].body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    results, note = turns[2]["content"][:2], turns[2]["content"][2]  # the API wants tool results first
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [("t1", False), ("t2", True)]
    assert note == {"type": "text", "text": "(2 measurements left)"}


def test_unparseable_tool_arguments_are_kept_raw_for_the_agent_to_report(fake_llm_server):
    fake_llm_server.script(reply_tool_call("measure", {}, raw_arguments='{"candidate": "k1"'))
    reply = connect(fake_llm_server, "openai-compatible").chat("go", tools=[ToolSpec(name="measure")])

    [tool_call] = reply.tool_calls
    assert tool_call.arguments == {}
    assert tool_call.raw_arguments == '{"candidate": "k1"'


# --------------------------------------------------------------------------------------
# Retries and errors
# --------------------------------------------------------------------------------------
@WIRE_FORMATS
@pytest.mark.parametrize("failure", [rate_limited(), server_error(500), server_error(503), hang(1.0)],
                         ids=["429", "500", "503", "timeout"])
def test_transient_failure_is_retried_then_succeeds(fake_llm_server, provider, failure):
    fake_llm_server.script(failure, reply_text("recovered"))
    model = connect(fake_llm_server, provider, timeout_s=0.3)

    reply = model.chat("hi")

    assert reply.text == "recovered"
    assert fake_llm_server.request_count == 2
    assert model.meter.state.calls == 1  # the failed attempt billed nothing


@WIRE_FORMATS
def test_a_timeout_that_outlasts_the_retries_names_the_setting_to_raise(fake_llm_server, provider):
    fake_llm_server.script(hang(1.0), hang(1.0), hang(1.0))
    model = connect(fake_llm_server, provider, timeout_s=0.3)

    with pytest.raises(LLMUnavailableError, match=r"timed out after 0.3 s.*raise timeout_s in the \[llm\] section"):
        model.chat("hi")


@WIRE_FORMATS
def test_the_configured_key_never_leaves_in_a_message(fake_llm_server, provider):
    # Measurement messages reach the model, and candidate code writes them: a key it found must not be handed on.
    key = "sk-ant-api03-" + "Q7w" * 20
    fake_llm_server.script(reply_text("ok"), reply_text("ok"))
    model = connect(fake_llm_server, provider, api_key=key)

    model.chat([Message.system("You write kernels."), Message.user(f"importing the candidate failed: LEAK {key} and {key[5:40]}")])
    model.chat("nothing secret here")

    sent = [json.dumps(r.body) for r in fake_llm_server.requests]
    assert key[5:40] not in sent[0] and "LEAK ***" in sent[0]
    assert "nothing secret here" in sent[1]


def test_rate_limit_waits_at_least_the_servers_retry_after(fake_llm_server):
    fake_llm_server.script(rate_limited(retry_after_s=0.4), reply_text("ok"))
    config = LLMConfig(provider="anthropic", base_url=fake_llm_server.anthropic_base_url, api_key="sk-test")
    backoff_alone_waits_under_10ms = RetryPolicy(attempts=2, initial_wait_s=0.001, max_wait_s=1.0)
    model = make_chat_model(config, retry=backoff_alone_waits_under_10ms, env={}, config_files=[])

    started = time.monotonic()
    model.chat("hi")

    assert time.monotonic() - started >= 0.4


def test_a_keyless_local_server_that_wants_a_key_says_which_variable_to_set(fake_llm_server):
    fake_llm_server.script(unauthorized())
    with pytest.raises(LLMConfigError, match=r"KSCOUT_API_KEY is not set.*401"):
        connect(fake_llm_server, "openai-compatible", api_key=None).chat("hi")


@WIRE_FORMATS
def test_malformed_bodies_exhaust_the_retries_then_raise_unavailable(fake_llm_server, provider):
    fake_llm_server.script(malformed(), malformed(), malformed())
    model = connect(fake_llm_server, provider)

    with pytest.raises(LLMUnavailableError, match="failed 3 time"):
        model.chat("hi")

    assert fake_llm_server.request_count == FAST_RETRIES.attempts
    assert model.meter.state.calls == 0


@pytest.mark.parametrize(("provider", "key_var"), [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")])
def test_rejected_key_is_not_retried_and_says_what_to_set(fake_llm_server, clean_env, monkeypatch, provider, key_var):
    monkeypatch.setenv(key_var, "sk-revoked")
    fake_llm_server.script(unauthorized(), reply_text("never reached"))
    base_url = fake_llm_server.anthropic_base_url if provider == "anthropic" else fake_llm_server.openai_base_url
    model = make_chat_model(LLMConfig(provider=provider, base_url=base_url), retry=FAST_RETRIES)

    with pytest.raises(LLMConfigError) as err:
        model.chat("hi")

    assert fake_llm_server.request_count == 1
    assert key_var in str(err.value) and "401" in str(err.value) and "--provider" in str(err.value)


def test_unknown_model_on_a_local_server_points_at_the_model_and_base_url(fake_llm_server):
    fake_llm_server.script(Status(404, "model 'qwen-typo' not found"))
    with pytest.raises(LLMConfigError, match=r"qwen-typo.*404.*KSCOUT_MODEL.*KSCOUT_BASE_URL ends in /v1"):
        connect(fake_llm_server, "openai-compatible", model="qwen-typo").chat("hi")
    assert fake_llm_server.request_count == 1


def test_unreachable_server_is_retried_then_unavailable():
    with FakeLLMServer() as server:
        url = server.openai_base_url
    model = make_chat_model(LLMConfig(provider="openai-compatible", base_url=url, model="m", timeout_s=0.3),
                            retry=FAST_RETRIES, env={}, config_files=[])
    with pytest.raises(LLMUnavailableError, match="connection failed"):
        model.chat("hi")


# --------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------
def test_usd_cap_refuses_the_call_that_could_cross_it_before_sending(fake_llm_server):
    fake_llm_server.script(reply_text("first", input_tokens=1000, output_tokens=1000), reply_text("never sent"))
    model = connect(fake_llm_server, "anthropic", max_usd=0.02)  # one call of up to 1000 output tokens fits

    model.chat("hi", max_tokens=1000)  # costs $0.018
    with pytest.raises(BudgetExceeded) as stop:
        model.chat("hi", max_tokens=1000)  # could cost another $0.015

    assert stop.value.cap == "usd"
    assert stop.value.state.cost_usd == pytest.approx(0.018)
    assert fake_llm_server.request_count == 1
    assert "KSCOUT_LLM_MAX_USD" in str(stop.value)


def test_token_cap_stops_a_scripted_run_without_http():
    model = ScriptedChatModel(["ok"], meter=UsageMeter(max_tokens_total=100))

    with pytest.raises(BudgetExceeded) as stop:
        model.chat("hi", max_tokens=200)

    assert stop.value.cap == "tokens"
    assert model.requests == []


def test_concurrent_calls_cannot_jointly_overshoot_the_token_cap():
    def slow_reply(request):
        time.sleep(0.005)
        return ChatResponse(text="ok", usage=Usage(input_tokens=1, output_tokens=request.max_tokens))

    meter = UsageMeter(max_tokens_total=1000)
    model = ScriptedChatModel([slow_reply] * 80, meter=meter)
    refused = []

    def worker():
        for _ in range(10):
            try:
                model.chat("go", max_tokens=100)
            except BudgetExceeded:
                refused.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert meter.state.total_tokens <= 1000
    assert meter.state.calls == 80 - len(refused) >= 8


def test_meter_state_persists_through_its_hook_and_resumes(tmp_path):
    ledger = tmp_path / "llm_usage.json"
    meter = UsageMeter(max_usd=1.0, on_update=lambda state: ledger.write_text(state.model_dump_json()))
    ScriptedChatModel([ChatResponse(text="a", usage=Usage(input_tokens=10_000, output_tokens=1_000))],
                      model="claude-haiku-4-5", meter=meter).chat("hi")

    resumed = UsageMeter(state=UsageState.model_validate_json(ledger.read_text()))

    assert resumed.state.max_usd == 1.0
    assert resumed.state.cost_usd == pytest.approx(0.015)
    assert resumed.state.by_model["claude-haiku-4-5"].calls == 1


def test_price_table_understands_snapshots_and_vendor_prefixes_and_takes_overrides():
    table = PriceTable({"my-finetune": ModelPrice(input_per_mtok=1, output_per_mtok=2),
                        "gpt-5-mini": ModelPrice(input_per_mtok=0, output_per_mtok=0)})

    assert table.cost("claude-sonnet-4-5-20250929", 1_000_000, 0) == (3.0, True)
    assert table.cost("anthropic/claude-sonnet-4-6", 0, 1_000_000) == (15.0, True)
    assert table.cost("my-finetune", 1_000_000, 1_000_000) == (3.0, True)
    assert table.cost("gpt-5-mini", 1_000_000, 1_000_000) == (0.0, True)
    assert table.cost("llama-3.1-8b", 1_000_000, 1_000_000) == (0.0, False)


# --------------------------------------------------------------------------------------
# Structured answers
# --------------------------------------------------------------------------------------
def test_structured_returns_the_validated_object_and_puts_the_schema_in_the_prompt():
    model = ScriptedChatModel(['{"speedup": 1.8, "confidence": 0.6}'])

    forecast = structured(model, [Message.system("You forecast speedups."), Message.user("k1?")], Forecast)

    assert forecast == Forecast(speedup=1.8, confidence=0.6)
    system = model.requests[0].messages[0]
    assert system.content.startswith("You forecast speedups.") and '"confidence"' in system.content


def test_structured_finds_json_in_a_fenced_block_surrounded_by_prose():
    reply = 'Sure! Here is my forecast:\n```json\n{"speedup": 2.5, "confidence": 0.9}\n```\nHope that helps.'
    assert structured(ScriptedChatModel([reply]), "k1?", Forecast) == Forecast(speedup=2.5, confidence=0.9)


def test_structured_re_asks_with_the_validation_error_then_accepts_the_fix():
    model = ScriptedChatModel(['{"speedup": -1, "confidence": 0.5}', 'Fixed: {"speedup": 1.2, "confidence": 0.5}'])

    outcome = structured_outcome(model, "k1?", Forecast)

    assert outcome.value == Forecast(speedup=1.2, confidence=0.5) and outcome.attempts == 2
    re_ask = model.requests[1].messages[-1]
    assert re_ask.role == "user" and "speedup" in re_ask.content and "greater than 0" in re_ask.content


def test_a_runaway_reply_is_quoted_by_its_ends_when_re_asking_not_resent_whole():
    runaway = "Let me think. " * 400_000 + '{"speedup": "fast"}'  # 5.6 MB of text, then an invalid answer
    model = ScriptedChatModel([runaway, '{"speedup": 1.2, "confidence": 0.5}'])

    outcome = structured_outcome(model, "k1?", Forecast)

    assert outcome.value == Forecast(speedup=1.2, confidence=0.5)
    quoted = model.requests[1].messages[-2]
    assert quoted.role == "assistant" and len(quoted.content) < 20_000
    assert quoted.content.startswith("Let me think.") and quoted.content.endswith('{"speedup": "fast"}')
    assert "characters of this reply left out" in quoted.content


def test_structured_gives_up_with_none_after_the_allowance():
    model = ScriptedChatModel(["I think about 2x.", "Roughly double.", "2x!"])

    outcome = structured_outcome(model, "k1?", Forecast, retries=2)

    assert outcome.value is None and outcome.failure == "invalid" and outcome.attempts == 3
    assert model.remaining == 0


@WIRE_FORMATS
def test_structured_returns_none_on_a_refusal_without_re_asking(fake_llm_server, provider):
    fake_llm_server.script(Reply(text="I can't help with that.", stop="refusal"))

    outcome = structured_outcome(connect(fake_llm_server, provider), "k1?", Forecast)

    assert outcome.value is None and outcome.failure == "refusal"
    assert "can't help" in outcome.detail
    assert fake_llm_server.request_count == 1


@WIRE_FORMATS
def test_structured_returns_none_on_a_truncated_answer(fake_llm_server, provider):
    fake_llm_server.script(Reply(text='{"speedup": 1.3, "confid', stop="max_tokens"))

    outcome = structured_outcome(connect(fake_llm_server, provider), "k1?", Forecast, max_tokens=16)

    assert outcome.value is None and outcome.failure == "truncated"
    assert "max_tokens=16" in outcome.detail
    assert fake_llm_server.request_count == 1


def test_structured_treats_an_unavailable_provider_as_unsure_but_lets_budget_stops_through(fake_llm_server):
    fake_llm_server.script(malformed(), malformed(), malformed())
    outcome = structured_outcome(connect(fake_llm_server, "anthropic"), "k1?", Forecast)
    assert outcome.value is None and outcome.failure == "unavailable"

    broke = ScriptedChatModel(["{}"], meter=UsageMeter(max_tokens_total=10))
    with pytest.raises(BudgetExceeded):
        structured(broke, "k1?", Forecast)


def test_structured_accepts_an_answer_given_as_a_tool_call():
    as_tool = ChatResponse(tool_calls=[{"id": "1", "name": "Forecast", "arguments": {"speedup": 3, "confidence": 1}}])
    assert structured(ScriptedChatModel([as_tool]), "k1?", Forecast) == Forecast(speedup=3, confidence=1)


def test_json_extraction_skips_reasoning_drafts():
    text = '<think>maybe {"speedup": 9}</think>Answer: {"speedup": 1.1, "confidence": 0.2} done'
    assert extract_json_candidates(text) == [{"speedup": 1.1, "confidence": 0.2}]


# --------------------------------------------------------------------------------------
# Scripted model
# --------------------------------------------------------------------------------------
def test_scripted_model_replays_in_order_and_records_what_it_was_asked():
    seen = []
    model = ScriptedChatModel([
        "first",
        lambda request: seen.append(request.max_tokens) or "second",
        LLMUnavailableError("provider down"),
    ])
    tools = [ToolSpec(name="measure")]

    assert model.chat("a").text == "first"
    assert model.chat([Message.user("b")], tools=tools, max_tokens=7).text == "second"
    with pytest.raises(LLMUnavailableError):
        model.chat("c")
    with pytest.raises(ScriptExhausted, match="'d'"):
        model.chat("d")

    assert seen == [7]
    assert [r.messages[-1].content for r in model.requests] == ["a", "b", "c", "d"]
    assert model.requests[1].tools == tools


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------
def write_toml(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_nothing_configured_means_no_model_even_with_a_key_exported(clean_env, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-for-something-else")

    assert make_chat_model() is None
    help_text = describe_how_to_enable()
    for name in ("KSCOUT_PROVIDER", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "KSCOUT_BASE_URL", "KSCOUT_MODEL"):
        assert name in help_text


def test_flags_beat_environment_beat_project_file_beat_user_file(clean_env, monkeypatch):
    write_toml(clean_env / "xdg" / "kscout" / "config.toml",
               '[llm]\nprovider = "openai-compatible"\nmodel = "user-model"\ntimeout_s = 30\nmax_attempts = 2\n')
    write_toml(clean_env / "project" / "kscout.toml",
               '[llm]\nmodel = "file-model"\nbase_url = "http://gpu-box:8000/v1"\nmax_usd = 2.5\n'
               '[llm.prices."file-model"]\ninput_per_mtok = 1.0\noutput_per_mtok = 4.0\n')
    monkeypatch.setenv("KSCOUT_MODEL", "env-model")

    with_flag = resolve_llm_config(LLMConfig(model="flag-model", max_attempts=4))
    from_env = resolve_llm_config()
    monkeypatch.delenv("KSCOUT_MODEL")
    from_files = resolve_llm_config()

    assert (with_flag.model, from_env.model, from_files.model) == ("flag-model", "env-model", "file-model")
    assert with_flag.provider == "openai-compatible" and with_flag.base_url == "http://gpu-box:8000/v1"
    assert (with_flag.max_attempts, from_env.max_attempts, with_flag.timeout_s) == (4, 2, 30)
    assert with_flag.max_usd == 2.5 and with_flag.prices["file-model"].output_per_mtok == 4.0
    assert with_flag.sources["model"] == "flag" and from_env.sources["model"] == "environment"
    assert from_files.sources["base_url"].endswith("kscout.toml")


def test_the_llm_settings_share_their_file_with_search_defaults_but_not_with_a_typo(clean_env):
    write_toml(clean_env / "project" / "kscout.toml",
               '[llm]\nprovider = "openai-compatible"\nmodel = "qwen"\nbase_url = "http://localhost:8000/v1"\n'
               '\n[search]\nbudget = 5\n')
    assert resolve_llm_config().model == "qwen"  # [search] is the search defaults' section, not an error

    write_toml(clean_env / "project" / "kscout.toml", '[lmm]\nprovider = "anthropic"\n')
    with pytest.raises(LLMConfigError, match=r"\[lmm\] in .*kscout\.toml \(did you mean \[llm\]\?\)"):
        resolve_llm_config()


def test_environment_key_beats_file_key_and_caps_come_from_env(clean_env, monkeypatch):
    write_toml(clean_env / "project" / "kscout.toml", '[llm]\nprovider = "anthropic"\napi_key = "sk-file"\n')
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    monkeypatch.setenv("KSCOUT_LLM_MAX_USD", "3")

    resolved = resolve_llm_config()

    assert resolved.api_key.get_secret_value() == "sk-env" and resolved.sources["api_key"] == "ANTHROPIC_API_KEY"
    assert resolved.max_usd == 3.0
    assert resolved.model == "claude-sonnet-4-6" and resolved.sources["model"] == "default"


def test_switching_provider_by_flag_drops_the_files_settings_for_the_other_provider(clean_env, monkeypatch):
    write_toml(clean_env / "project" / "kscout.toml",
               '[llm]\nprovider = "openai-compatible"\nmodel = "qwen"\nbase_url = "http://localhost:11434/v1"\n')
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")

    resolved = resolve_llm_config(LLMConfig(provider="anthropic"))

    assert resolved.base_url is None and resolved.model == "claude-sonnet-4-6"


def test_provider_is_inferred_from_a_base_url_or_a_well_known_model(clean_env, monkeypatch):
    monkeypatch.setenv("KSCOUT_BASE_URL", "http://localhost:8000/v1")
    monkeypatch.setenv("KSCOUT_MODEL", "deepseek-coder")
    assert resolve_llm_config().provider == "openai-compatible"

    monkeypatch.delenv("KSCOUT_BASE_URL")
    monkeypatch.setenv("KSCOUT_MODEL", "gpt-5-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert resolve_llm_config().provider == "openai"


@pytest.mark.parametrize(
    ("env", "file", "message"),
    [
        ({"KSCOUT_PROVIDER": "anthropic"}, None, "set ANTHROPIC_API_KEY"),
        ({"KSCOUT_PROVIDER": "openai-compatible", "KSCOUT_MODEL": "m"}, None, "set KSCOUT_BASE_URL"),
        ({"KSCOUT_PROVIDER": "openai-compatible", "KSCOUT_BASE_URL": "http://h/v1"}, None, "set KSCOUT_MODEL"),
        ({"KSCOUT_PROVIDER": "antropic"}, None, "KSCOUT_PROVIDER.*anthropic, openai, openai-compatible"),
        ({"KSCOUT_MODEL": "mistral-large"}, None, "set KSCOUT_PROVIDER"),
        ({}, '[llm]\nprovder = "openai"\n', r"kscout\.toml.*provder"),
    ],
    ids=["no-key", "no-base-url", "no-model", "typo-provider", "unknown-model", "typo-in-file"],
)
def test_incomplete_configuration_says_what_to_set(clean_env, monkeypatch, env, file, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if file:
        write_toml(clean_env / "project" / "kscout.toml", file)

    with pytest.raises(LLMConfigError, match=message):
        make_chat_model()
