"""Anthropic and OpenAI(-compatible) adapters: wire formats, retries, error messages, construction.

tenacity is the only retry layer (the SDKs' own are switched off) and retries only what can heal
by waiting (429, 408/409, 5xx, timeouts, dropped connections, malformed bodies); everything else
raises LLMConfigError at once with what to change.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
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
    resolve_llm_config,
)
from .llm_messages import ChatModel, ChatResponse, Message, MeteredChatModel, StopReason, ToolCall, ToolSpec
from .llm_pricing import PriceTable, Usage, UsageMeter

log = logging.getLogger("kernelscout.llm")


class LLMUnavailableError(RuntimeError):
    """The provider could not be reached or kept failing after every retry."""


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
class _SDKChatModel(MeteredChatModel):
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
        self._secret = getattr(client, "api_key", None) or ""

    def _redact(self, text: str) -> str:
        """Provider error text with the configured key taken out. Some gateways and local servers echo
        the key they were sent ("Invalid API key provided: sk-..."), and error text is printed, logged
        and kept in the run directory (found in a review). Any run of 12 or more of its characters goes."""
        key = self._secret
        if not key or key == "not-needed":  # no key, or the placeholder sent to a local server
            return text
        if len(key) < 12:
            return text.replace(key, "***")
        for size in range(len(key), 11, -1):
            for start in range(len(key) - size + 1):
                part = key[start:start + size]
                if part in text:
                    text = text.replace(part, "***")
        return text

    def _scrubbed(self, message: Message) -> Message:
        """`message` with the configured key taken out before it is sent. Measurement messages reach the model (a
        chat's tool results, the policy's repair request), and candidate code writes them: one that found the key
        (a red-team pass read it from ./kscout.toml, since kept out of the sandbox's reach) would hand it to the
        provider. A cheap look first: any leak of 24 or more characters holds one of the key's aligned 12-character
        pieces (of a shorter key, the whole key); only then the full search of `_redact`."""
        key = self._secret
        if not key or key == "not-needed" or not message.content:
            return message
        pieces = [key] if len(key) < 24 else [key[i:i + 12] for i in range(0, len(key) - 11, 12)]
        if not any(piece in message.content for piece in pieces):
            return message
        return message.model_copy(update={"content": self._redact(message.content)})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, endpoint={self.endpoint!r})"

    def _respond(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                      temperature: float | None) -> ChatResponse:
        retrying = Retrying(
            stop=stop_after_attempt(self.retry.attempts),
            wait=_wait_strategy(self.retry),
            retry=retry_if_exception_type(_Transient),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(self._attempt, [self._scrubbed(m) for m in msgs], tools, max_tokens, temperature)
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
            wait = getattr(self._client, "timeout", None)
            after = f" after {wait:g} s" if isinstance(wait, (int, float)) else ""
            raise _Transient(exc, f"timed out{after} (a large or busy model may need longer: raise timeout_s in the [llm] "
                                  "section of kscout.toml)") from exc
        except sdk.APIConnectionError as exc:
            raise _Transient(exc, self._redact(f"connection failed ({exc.__cause__ or exc})")) from exc
        except sdk.APIResponseValidationError as exc:
            raise _Transient(exc, self._redact(f"malformed response ({exc})")) from exc
        except sdk.APIStatusError as exc:
            code = exc.status_code
            if code in (408, 409, 425, 429) or code >= 500:
                raise _Transient(exc, f"HTTP {code}: {self._redact(_detail(exc))}") from exc
            raise self._config_error(exc) from exc
        except (json.JSONDecodeError, _MalformedResponse) as exc:
            raise _Transient(exc, self._redact(f"malformed response body ({exc})")) from exc

    def _config_error(self, exc: Any) -> LLMConfigError:
        code, detail = exc.status_code, self._redact(_detail(exc))
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
            raise LLMConfigError(f"provider anthropic needs an API key: set {KEY_ENV['anthropic']}, or api_key in the [llm] section of kscout.toml")
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


def require_chat_model(model: ChatModel | None, user: str) -> ChatModel:
    """`model`, or the configured one; a ValueError that says how to configure one when there is none.
    `user` names what needs it ("the llm surrogate")."""
    from .llm_config import describe_how_to_enable

    model = model or make_chat_model()
    if model is None:
        raise ValueError(f"{user} needs a model provider. " + describe_how_to_enable())
    return model
