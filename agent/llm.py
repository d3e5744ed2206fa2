"""One small chat interface over Anthropic, OpenAI and OpenAI-compatible servers.

Everything in kernelscout that asks an LLM something (the surrogate's
forecasts, the LLM policy, the chat agent) talks to a :class:`ChatModel`, so it
can be driven by :class:`ScriptedChatModel` in tests and by any provider in a
run without knowing which. The adapters here own the parts every caller would
otherwise get subtly wrong:

* wire formats: system prompt placement, tool_use/tool_result blocks versus
  function calling and ``role="tool"`` messages;
* retries: tenacity is the only retry layer (the SDKs' own are switched off)
  and retries only what can heal by waiting (429, 408/409, 5xx, timeouts,
  dropped connections, malformed bodies); everything else raises
  :class:`LLMConfigError` at once with what to change;
* accounting: every call is reserved against and settled into a
  :class:`UsageMeter`, whose caps stop a run before it overspends.

:func:`structured` asks for a pydantic-validated answer and returns None,
never a half-parsed object, when the model refuses, runs out of tokens or
keeps answering off-schema: callers treat None as "unsure, defer".
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field, ValidationError, model_validator
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from .llm_config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TIMEOUT_S,
    ENV_BASE_URL,
    ENV_MODEL,
    ENV_PROVIDER,
    KEY_ENV,
    LLMConfig,
    LLMConfigError,
    ResolvedLLMConfig,
    describe_how_to_enable,
    resolve_llm_config,
)
from .llm_pricing import BudgetExceeded, PriceTable, Usage, UsageMeter, UsageState, estimate_tokens

__all__ = [
    "LLM_ERRORS",
    "AnthropicChatModel",
    "BudgetExceeded",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "LLMConfig",
    "LLMConfigError",
    "LLMUnavailableError",
    "Message",
    "OpenAIChatModel",
    "RetryPolicy",
    "ScriptExhausted",
    "ScriptedChatModel",
    "StructuredOutcome",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "UsageMeter",
    "UsageState",
    "build_chat_model",
    "describe_how_to_enable",
    "extract_json_candidates",
    "make_chat_model",
    "structured",
    "structured_outcome",
]

log = logging.getLogger("kernelscout.llm")

DEFAULT_MAX_TOKENS = 4096
StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "stop_sequence", "other"]


class LLMUnavailableError(RuntimeError):
    """The provider could not be reached or kept failing after every retry."""


LLM_ERRORS: tuple[type[Exception], ...] = (LLMConfigError, LLMUnavailableError, BudgetExceeded)
"""Everything a chat call raises on purpose; ``except LLM_ERRORS`` in callers that must not crash."""


# --------------------------------------------------------------------------------------
# Provider-neutral messages
# --------------------------------------------------------------------------------------
class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = Field(
        default=None, description="set only when the model's arguments were not a JSON object; arguments is then {}"
    )


class ToolSpec(BaseModel):
    """A tool the model may call; ``parameters`` is a JSON Schema for its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_model(cls, name: str, description: str, arguments: type[BaseModel]) -> ToolSpec:
        return cls(name=name, description=description, parameters=arguments.model_json_schema())


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list, description="assistant turns only")
    tool_call_id: str | None = Field(default=None, description="tool turns only: the call this result answers")
    is_error: bool = Field(default=False, description="tool turns only: the tool failed")

    @model_validator(mode="after")
    def _roles_fit(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool messages, and only they, need tool_call_id")
        return self

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Sequence[ToolCall] = ()) -> Message:
        return cls(role="assistant", content=content, tool_calls=list(tool_calls))

    @classmethod
    def tool_result(cls, tool_call_id: str, content: str, *, is_error: bool = False) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, is_error=is_error)


class ChatRequest(BaseModel):
    """One call as a ChatModel received it (what ScriptedChatModel records)."""

    messages: list[Message]
    tools: list[ToolSpec] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None


class ChatResponse(BaseModel):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    priced: bool = Field(default=True, description="False: model missing from the price table, cost counted as 0")
    model: str = ""
    stop_reason: StopReason = "end_turn"
    raw_stop_reason: str | None = Field(default=None, description="the provider's own word for it")

    def to_message(self) -> Message:
        """The assistant turn to append to the conversation before sending tool results."""
        return Message.assistant(self.text, self.tool_calls)


MessagesIn = Sequence[Message | dict] | str


def as_messages(messages: MessagesIn) -> list[Message]:
    """Accept a bare prompt or dicts too, since most callers build one-shot prompts."""
    if isinstance(messages, str):
        return [Message.user(messages)]
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]


@runtime_checkable
class ChatModel(Protocol):
    """What every caller needs from an LLM: one synchronous chat turn."""

    def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
    ) -> ChatResponse: ...


def estimate_prompt_tokens(messages: Sequence[Message], tools: Sequence[ToolSpec] | None) -> int:
    text = "".join(m.content + "".join(json.dumps(c.arguments) for c in m.tool_calls) for m in messages)
    text += "".join(t.model_dump_json() for t in tools or ())
    return estimate_tokens(text) + 4 * len(messages)


def metered(
    meter: UsageMeter,
    model: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] | None,
    max_tokens: int,
    call: Callable[[], ChatResponse],
) -> ChatResponse:
    """Reserve the worst case, make the call, settle the real usage (or release on failure)."""
    reservation = meter.reserve(model, estimate_prompt_tokens(messages, tools), max_tokens)
    try:
        response = call()
    except BaseException:
        reservation.release()
        raise
    cost, priced = reservation.settle(response.usage)
    return response.model_copy(update={"cost_usd": cost, "priced": priced, "model": response.model or model})


# --------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------
class RetryPolicy(BaseModel):
    """Exponential backoff with full jitter: wait ~ U(0, min(max_wait_s, initial_wait_s * 2**n)).

    A server's retry-after raises the wait to at least what it asked for, but
    max_wait_s still bounds every wait so one stubborn 429 cannot stall a run.
    """

    attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, description="tries per call, the first included")
    initial_wait_s: float = Field(default=1.0, ge=0)
    max_wait_s: float = Field(default=30.0, ge=0)
    respect_retry_after: bool = Field(default=True, description="wait at least the server's retry-after header")


class _Transient(Exception):
    """Internal: a failure worth retrying; carries the SDK exception and a short description."""

    def __init__(self, cause: BaseException, what: str):
        super().__init__(what)
        self.cause = cause
        self.what = what


class _MalformedResponse(Exception):
    """Internal: a 200 whose body did not have the shape of a completion."""


def _retry_after_s(exc: BaseException) -> float | None:
    response = getattr(getattr(exc, "cause", None), "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    if headers.get("retry-after-ms"):
        try:
            return float(headers["retry-after-ms"]) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        try:
            import datetime as _dt

            return max(0.0, (parsedate_to_datetime(value) - _dt.datetime.now(_dt.timezone.utc)).total_seconds())
        except (TypeError, ValueError):
            return None


def _wait_strategy(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    jittered = wait_random_exponential(multiplier=policy.initial_wait_s, max=policy.max_wait_s)

    def wait(state: RetryCallState) -> float:
        delay = jittered(state)
        exc = state.outcome.exception() if state.outcome else None
        hinted = _retry_after_s(exc) if (exc is not None and policy.respect_retry_after) else None
        return min(max(delay, hinted), policy.max_wait_s) if hinted is not None else delay

    return wait


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("LLM call attempt %d failed (%s); retrying in %.2fs", state.attempt_number, exc,
                state.next_action.sleep if state.next_action else 0.0)


# --------------------------------------------------------------------------------------
# SDK-backed models
# --------------------------------------------------------------------------------------
class _SDKChatModel:
    """Shared retry, error translation and metering; subclasses speak one wire format."""

    provider: str = ""

    def __init__(
        self,
        *,
        model: str,
        sdk: Any,
        client: Any,
        endpoint: str,
        key_source: str,
        meter: UsageMeter | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.model = model
        self.meter = meter or UsageMeter()
        self.retry = retry or RetryPolicy()
        self.endpoint = endpoint
        self.key_source = key_source
        self._sdk = sdk
        self._client = client

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, endpoint={self.endpoint!r})"

    def chat(
        self,
        messages: MessagesIn,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
    ) -> ChatResponse:
        msgs = as_messages(messages)
        specs = list(tools) if tools else None
        return metered(self.meter, self.model, msgs, specs, max_tokens,
                       lambda: self._with_retries(msgs, specs, max_tokens, temperature))

    def _with_retries(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                      temperature: float | None) -> ChatResponse:
        retrying = Retrying(
            stop=stop_after_attempt(self.retry.attempts),
            wait=_wait_strategy(self.retry),
            retry=retry_if_exception_type(_Transient),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(self._attempt, msgs, tools, max_tokens, temperature)
        except _Transient as exc:
            raise LLMUnavailableError(
                f"{self.provider} at {self.endpoint} failed {self.retry.attempts} time(s); last error: {exc.what}."
                " Check that the service is up (or wait out its rate limit) and try again."
            ) from exc.cause

    def _attempt(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                 temperature: float | None) -> ChatResponse:
        sdk = self._sdk
        try:
            return self._create(msgs, tools, max_tokens, temperature)
        except sdk.APITimeoutError as exc:
            raise _Transient(exc, "timed out") from exc
        except sdk.APIConnectionError as exc:
            raise _Transient(exc, f"connection failed ({exc.__cause__ or exc})") from exc
        except sdk.APIResponseValidationError as exc:
            raise _Transient(exc, f"malformed response ({exc})") from exc
        except sdk.APIStatusError as exc:
            code = exc.status_code
            if code in (408, 409, 425, 429) or code >= 500:
                raise _Transient(exc, f"HTTP {code}: {_detail(exc)}") from exc
            raise self._config_error(exc) from exc
        except (json.JSONDecodeError, _MalformedResponse) as exc:
            raise _Transient(exc, f"malformed response body ({exc})") from exc

    def _config_error(self, exc: Any) -> LLMConfigError:
        code, detail = exc.status_code, _detail(exc)
        where = f"{self.provider} at {self.endpoint}"
        if code == 401:
            return LLMConfigError(
                f"{self.key_source} was rejected by {where} (401: {detail}): set a valid key,"
                f" or choose another provider with --provider / {ENV_PROVIDER}."
            )
        if code == 403:
            return LLMConfigError(
                f"{self.key_source} may not use model {self.model!r} at {where} (403: {detail}):"
                f" use a key with access, or another model with --model / {ENV_MODEL}."
            )
        if code == 404:
            hint = f" and that {ENV_BASE_URL} ends in /v1" if self.provider == "openai-compatible" else ""
            return LLMConfigError(
                f"model {self.model!r} or its endpoint was not found at {where} (404: {detail}):"
                f" check --model / {ENV_MODEL}{hint}."
            )
        return LLMConfigError(
            f"{where} rejected the request ({code}: {detail}): check the model name (--model / {ENV_MODEL})"
            " and that this server supports the request (tools, max_tokens, prompt length)."
        )

    def _create(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                temperature: float | None) -> ChatResponse:
        raise NotImplementedError


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))


# ---- Anthropic -------------------------------------------------------------------------
_ANTHROPIC_STOP: dict[str | None, StopReason] = {
    "end_turn": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens", "stop_sequence": "stop_sequence",
    "refusal": "refusal", "model_context_window_exceeded": "max_tokens",
}


def to_anthropic(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system, messages): system is a top-level parameter; tool results ride in user turns.

    Consecutive turns of one role are merged (parallel tool results must share
    one user turn) and tool_result blocks go first in their turn, as the API requires.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content) or None
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        blocks: list[dict[str, Any]] = []
        if m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if m.is_error:
                block["is_error"] = True
            blocks.append(block)
        else:
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
        if not blocks:
            continue  # the API rejects empty turns
        role = "assistant" if m.role == "assistant" else "user"
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for turn in out:
        turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    return system, out


def _anthropic_tool(tool: ToolSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters}
    if tool.description:
        spec["description"] = tool.description
    return spec


class AnthropicChatModel(_SDKChatModel):
    """Anthropic Messages API.

    ``temperature`` is not sent: the API version the anthropic 2.x SDK speaks
    (2026-10-21) rejects sampling parameters outright.
    """

    provider = "anthropic"

    def __init__(self, model: str, *, api_key: str, base_url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 key_source: str = KEY_ENV["anthropic"], meter: UsageMeter | None = None,
                 retry: RetryPolicy | None = None):
        import anthropic

        client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)
        super().__init__(model=model, sdk=anthropic, client=client, endpoint=str(client.base_url).rstrip("/"),
                         key_source=key_source, meter=meter, retry=retry)

    def _create(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                temperature: float | None) -> ChatResponse:
        system, wire = to_anthropic(msgs)
        kwargs: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": wire}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = [_anthropic_tool(t) for t in tools]
        message = self._client.messages.create(**kwargs)
        if not isinstance(getattr(message, "content", None), list):
            raise _MalformedResponse(f"no content list in {type(message).__name__}")
        text = "".join(b.text for b in message.content if getattr(b, "type", None) == "text")
        calls = [ToolCall(id=b.id, name=b.name, arguments=dict(b.input or {}))
                 for b in message.content if getattr(b, "type", None) == "tool_use"]
        u = message.usage
        # Cache writes and reads are billed below the input price; counting them as plain
        # input over-states cost a little, which is the safe side for a cap.
        cached = (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)
        usage = Usage(input_tokens=(u.input_tokens or 0) + cached, output_tokens=u.output_tokens or 0)
        return ChatResponse(text=text, tool_calls=calls, usage=usage, model=message.model or self.model,
                            stop_reason=_ANTHROPIC_STOP.get(message.stop_reason, "other"),
                            raw_stop_reason=message.stop_reason)


# ---- OpenAI and compatible servers -----------------------------------------------------
_OPENAI_STOP: dict[str | None, StopReason] = {
    "stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use", "length": "max_tokens",
    "content_filter": "refusal",
}


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            text = m.content if not m.is_error or m.content.lower().startswith("error") else f"Error: {m.content}"
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": text})
        elif m.role == "assistant" and m.tool_calls:
            out.append({
                "role": "assistant",
                "content": m.content or None,
                "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments)}}
                    for c in m.tool_calls
                ],
            })
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _parse_arguments(raw: str | None) -> tuple[dict[str, Any], str | None]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)


class OpenAIChatModel(_SDKChatModel):
    """Chat Completions, for OpenAI itself and any server that imitates it.

    OpenAI's own models take ``max_completion_tokens`` (reasoning models reject
    ``max_tokens``); compatible servers (vLLM, Ollama, llama.cpp, LM Studio)
    reliably understand only ``max_tokens``.
    """

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, compatible: bool = False, key_source: str | None = None,
                 meter: UsageMeter | None = None, retry: RetryPolicy | None = None):
        import openai

        self.provider = "openai-compatible" if compatible else "openai"
        # Local servers often need no key, but the SDK insists on one: send a placeholder.
        client = openai.OpenAI(api_key=api_key or "not-needed", base_url=base_url, max_retries=0, timeout=timeout_s)
        super().__init__(model=model, sdk=openai, client=client, endpoint=str(client.base_url).rstrip("/"),
                         key_source=key_source or KEY_ENV[self.provider], meter=meter, retry=retry)

    def _create(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                temperature: float | None) -> ChatResponse:
        kwargs: dict[str, Any] = {"model": self.model, "messages": to_openai(msgs)}
        kwargs["max_tokens" if self.provider == "openai-compatible" else "max_completion_tokens"] = max_tokens
        if temperature is not None:
            kwargs["temperature"] = temperature
        if tools:
            kwargs["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in tools
            ]
        completion = self._client.chat.completions.create(**kwargs)
        choices = getattr(completion, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise _MalformedResponse("the completion has no choices")
        choice = choices[0]
        msg = choice.message
        calls = []
        for c in msg.tool_calls or []:
            fn = getattr(c, "function", None)
            if fn is None:
                continue  # custom (non-function) tools are not something we offer
            arguments, raw = _parse_arguments(fn.arguments)
            calls.append(ToolCall(id=c.id, name=fn.name, arguments=arguments, raw_arguments=raw))
        refusal = getattr(msg, "refusal", None)
        stop: StopReason = "refusal" if refusal else _OPENAI_STOP.get(choice.finish_reason, "other")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some local servers say "stop" even when they called a tool
        u = completion.usage
        # Some local servers omit usage; their calls then count as 0 tokens.
        usage = Usage(input_tokens=getattr(u, "prompt_tokens", 0) or 0,
                      output_tokens=getattr(u, "completion_tokens", 0) or 0)
        return ChatResponse(text=refusal or msg.content or "", tool_calls=calls, usage=usage,
                            model=completion.model or self.model, stop_reason=stop,
                            raw_stop_reason=choice.finish_reason)


# --------------------------------------------------------------------------------------
# Construction from configuration
# --------------------------------------------------------------------------------------
def build_chat_model(config: ResolvedLLMConfig, *, meter: UsageMeter | None = None,
                     retry: RetryPolicy | None = None) -> ChatModel:
    """The adapter for a resolved configuration, with a meter carrying its caps and prices."""
    if meter is None:
        meter = UsageMeter(max_tokens_total=config.max_tokens_total, max_usd=config.max_usd,
                           prices=PriceTable(config.prices))
    retry = retry or RetryPolicy(attempts=config.max_attempts)
    key = config.api_key.get_secret_value() if config.api_key else None
    key_source = config.sources.get("api_key", "")
    if not key_source:
        key_source = f"the placeholder key sent because {KEY_ENV[config.provider]} is not set"
    elif key_source == "flag":
        key_source = "the API key passed with --api-key"
    elif key_source not in KEY_ENV.values():
        key_source = f"the api_key in {key_source}"
    if config.provider == "anthropic":
        if key is None:
            raise LLMConfigError(f"provider anthropic needs an API key: set {KEY_ENV['anthropic']} or pass --api-key")
        return AnthropicChatModel(config.model, api_key=key, base_url=config.base_url, timeout_s=config.timeout_s,
                                  key_source=key_source, meter=meter, retry=retry)
    return OpenAIChatModel(config.model, api_key=key, base_url=config.base_url, timeout_s=config.timeout_s,
                           compatible=config.provider == "openai-compatible", key_source=key_source,
                           meter=meter, retry=retry)


def make_chat_model(
    config: LLMConfig | None = None,
    *,
    meter: UsageMeter | None = None,
    retry: RetryPolicy | None = None,
    env: Mapping[str, str] | None = None,
    config_files: Sequence[Path] | None = None,
) -> ChatModel | None:
    """The configured model, or None when no LLM was asked for (see describe_how_to_enable()).

    ``config`` carries the CLI's flags and wins over the environment, which
    wins over config files. ``env`` and ``config_files`` default to the real
    ones and exist so tests need not touch them. Raises LLMConfigError when an
    LLM was asked for but cannot work as configured (no key, no base URL).
    """
    resolved = resolve_llm_config(config, env=env, config_files=config_files)
    if resolved is None:
        return None
    return build_chat_model(resolved, meter=meter, retry=retry)


# --------------------------------------------------------------------------------------
# A deterministic model for tests
# --------------------------------------------------------------------------------------
class ScriptExhausted(AssertionError):
    """A ScriptedChatModel got more requests than it had replies: the test's script is short."""


ScriptItem = ChatResponse | str | BaseException | Callable[[ChatRequest], ChatResponse | str]


class ScriptedChatModel:
    """Answers with scripted replies in order and records every request.

    A reply may be a ChatResponse, a plain string (a text answer), an exception
    instance (raised, e.g. LLMUnavailableError, to test a caller's fallback) or
    a callable that receives the ChatRequest and returns either of the first two.
    With a ``meter``, calls are reserved and settled like real ones, so budget
    stops can be tested without HTTP.
    """

    def __init__(self, replies: Iterable[ScriptItem], *, model: str = "scripted", meter: UsageMeter | None = None):
        self.model = model
        self.meter = meter
        self.requests: list[ChatRequest] = []
        self._replies: deque[ScriptItem] = deque(replies)
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._replies)

    def chat(
        self,
        messages: MessagesIn,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
    ) -> ChatResponse:
        msgs = as_messages(messages)
        specs = list(tools) if tools else None
        if self.meter is not None:
            return metered(self.meter, self.model, msgs, specs, max_tokens,
                           lambda: self._next(msgs, specs, max_tokens, temperature))
        return self._next(msgs, specs, max_tokens, temperature)

    def _next(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
              temperature: float | None) -> ChatResponse:
        request = ChatRequest(messages=msgs, tools=tools, max_tokens=max_tokens, temperature=temperature)
        with self._lock:
            self.requests.append(request)
            if not self._replies:
                last = next((m.content for m in reversed(msgs) if m.role == "user"), "")
                raise ScriptExhausted(
                    f"ScriptedChatModel has no reply left for request #{len(self.requests)}"
                    f" (last user message: {last[:200]!r})"
                )
            item = self._replies.popleft()
        if callable(item) and not isinstance(item, (BaseException, ChatResponse)):
            item = item(request)
        if isinstance(item, BaseException):
            raise item
        response = ChatResponse(text=item) if isinstance(item, str) else item
        return response if response.model else response.model_copy(update={"model": self.model})


# --------------------------------------------------------------------------------------
# Structured answers
# --------------------------------------------------------------------------------------
T = TypeVar("T", bound=BaseModel)
Failure = Literal["refusal", "truncated", "invalid", "unavailable"]


@dataclass(frozen=True)
class StructuredOutcome(Generic[T]):
    """What structured_outcome() got: a value, or why there is none."""

    value: T | None
    failure: Failure | None = None
    detail: str = ""
    attempts: int = 0
    cost_usd: float = 0.0

    @property
    def ok(self) -> bool:
        return self.value is not None


_SCHEMA_INSTRUCTIONS = (
    "Answer with a single JSON object that conforms to the JSON Schema below. Reply with the JSON object only:"
    " no prose before or after it (a ```json fenced block around it is fine).\n\nJSON Schema:\n{schema}"
)
_REASK = "Your previous reply could not be used: {error}\nReply again with only the corrected JSON object."
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\n?(.*?)```", re.DOTALL)


def extract_json_candidates(text: str) -> list[Any]:
    """JSON values found in a reply, most deliberate first.

    Fenced blocks, then the whole reply, then every object or array that parses
    where one starts, so "Sure! Here it is: {...}" and trailing remarks work.
    Reasoning models' <think> sections are dropped first: they often hold drafts.
    """
    text = _THINK.sub("", text)
    found: list[Any] = []

    def add(value: Any) -> None:
        if value not in found:
            found.append(value)

    for chunk in [*_FENCE.findall(text), text]:
        with contextlib.suppress(json.JSONDecodeError):
            add(json.loads(chunk))
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            add(value)
            i = end
        else:
            i += 1
    return found


def _validation_summary(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:6])


def parse_structured(response: ChatResponse, schema: type[T]) -> tuple[T | None, str]:
    """(value, "") or (None, why not); tool-call arguments count as candidates too."""
    candidates = [c.arguments for c in response.tool_calls] + extract_json_candidates(response.text)
    if not candidates:
        return None, "no JSON object found in the reply"
    first_error = ""
    for candidate in candidates:
        try:
            return schema.model_validate(candidate), ""
        except ValidationError as exc:
            first_error = first_error or f"the JSON does not match the schema ({_validation_summary(exc)})"
    return None, first_error


def _with_instructions(messages: list[Message], schema: type[BaseModel]) -> list[Message]:
    instructions = _SCHEMA_INSTRUCTIONS.format(schema=json.dumps(schema.model_json_schema(), indent=1))
    if messages and messages[0].role == "system":
        return [Message.system(f"{messages[0].content}\n\n{instructions}"), *messages[1:]]
    return [Message.system(instructions), *messages]


def structured_outcome(
    model: ChatModel,
    messages: MessagesIn,
    schema: type[T],
    retries: int = 2,
    *,
    max_tokens: int = 2048,
    temperature: float | None = None,
) -> StructuredOutcome[T]:
    """Ask for an answer matching ``schema``; re-ask with the validation error up to ``retries`` times.

    Ends without a value on a refusal, on a reply cut off at ``max_tokens``, on
    ``retries`` re-asks that still do not validate, or when the provider is
    unavailable. BudgetExceeded and LLMConfigError propagate: they need the run
    (or the user) to stop, not a per-question shrug.
    """
    convo = _with_instructions(as_messages(messages), schema)
    error, cost = "", 0.0
    for attempt in range(1, retries + 2):
        try:
            response = model.chat(convo, max_tokens=max_tokens, temperature=temperature)
        except LLMUnavailableError as exc:
            return StructuredOutcome(None, "unavailable", str(exc), attempt, cost)
        cost += response.cost_usd
        if response.stop_reason == "refusal":
            return StructuredOutcome(None, "refusal", response.text or "the model refused", attempt, cost)
        value, error = parse_structured(response, schema)
        if value is not None:
            return StructuredOutcome(value, None, "", attempt, cost)
        if response.stop_reason == "max_tokens":
            detail = f"reply cut off at max_tokens={max_tokens}: {error}"
            return StructuredOutcome(None, "truncated", detail, attempt, cost)
        convo = [*convo, Message.assistant(response.text), Message.user(_REASK.format(error=error))]
    return StructuredOutcome(None, "invalid", error, retries + 1, cost)


def structured(
    model: ChatModel,
    messages: MessagesIn,
    schema: type[T],
    retries: int = 2,
    *,
    max_tokens: int = 2048,
    temperature: float | None = None,
) -> T | None:
    """The validated answer, or None ("unsure, defer"); structured_outcome() says why."""
    outcome = structured_outcome(model, messages, schema, retries, max_tokens=max_tokens, temperature=temperature)
    if outcome.value is None:
        log.info("structured %s answer unavailable (%s): %s", schema.__name__, outcome.failure, outcome.detail)
    return outcome.value
