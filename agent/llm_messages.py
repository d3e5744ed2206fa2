"""Provider-neutral chat messages, the ChatModel protocol, and metering of one call.

Every adapter (Anthropic, OpenAI-compatible, the scripted test model) speaks these types, so a
caller never sees a wire format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, model_validator

from .llm_pricing import Usage, UsageMeter, estimate_tokens

DEFAULT_MAX_TOKENS = 4096
StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "stop_sequence", "other"]


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


class MeteredChatModel:
    """The shared ``chat`` of every adapter: normalise the arguments, meter the call, respond."""

    model: str = ""
    meter: UsageMeter | None = None

    def chat(
        self,
        messages: MessagesIn,
        tools: Sequence[ToolSpec] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
    ) -> ChatResponse:
        msgs = as_messages(messages)
        specs = list(tools) if tools else None
        respond = lambda: self._respond(msgs, specs, max_tokens, temperature)  # noqa: E731
        if self.meter is None:
            return respond()
        return metered(self.meter, self.model, msgs, specs, max_tokens, respond)

    def _respond(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
                 temperature: float | None) -> ChatResponse:
        raise NotImplementedError
