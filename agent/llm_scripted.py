"""A deterministic chat model for tests: scripted replies in order, every request recorded."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable

from .llm_messages import ChatRequest, ChatResponse, Message, MeteredChatModel, ToolSpec
from .llm_pricing import UsageMeter


class ScriptExhausted(AssertionError):
    """A ScriptedChatModel got more requests than it had replies: the test's script is short."""


ScriptItem = ChatResponse | str | BaseException | Callable[[ChatRequest], ChatResponse | str]


class ScriptedChatModel(MeteredChatModel):
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

    def _respond(self, msgs: list[Message], tools: list[ToolSpec] | None, max_tokens: int,
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
