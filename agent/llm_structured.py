"""Pydantic-validated answers from a chat model, or None with the reason: callers defer on None."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from .llm_messages import ChatModel, ChatResponse, Message, MessagesIn, as_messages
from .llm_providers import LLMUnavailableError

log = logging.getLogger("kernelscout.llm")

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
# A re-ask quotes the model's unusable reply back to it; a runaway reply (megabytes of repeated text) is
# quoted by its two ends, so each re-ask does not pay for it again in full.
REASK_QUOTE_CHARS = 16_000
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
        convo = [*convo, Message.assistant(_quoted(response.text)), Message.user(_REASK.format(error=error))]
    return StructuredOutcome(None, "invalid", error, retries + 1, cost)


def _quoted(text: str, limit: int = REASK_QUOTE_CHARS) -> str:
    """The reply as the re-ask quotes it back: whole, or its beginning and end when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters of this reply left out ...]\n{text[-half:]}"


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
