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

The pieces live in llm_messages (types), llm_providers (SDK adapters and construction),
llm_scripted (the test model) and llm_structured (validated answers); this module is the
one import callers need.
"""

from __future__ import annotations

from .llm_config import LLMConfig, LLMConfigError, describe_how_to_enable
from .llm_messages import (
    DEFAULT_MAX_TOKENS,
    ChatModel,
    ChatRequest,
    ChatResponse,
    Message,
    MessagesIn,
    MeteredChatModel,
    StopReason,
    ToolCall,
    ToolSpec,
    as_messages,
    estimate_prompt_tokens,
    metered,
)
from .llm_pricing import BudgetExceeded, Usage, UsageMeter, UsageState
from .llm_providers import (
    AnthropicChatModel,
    LLMUnavailableError,
    OpenAIChatModel,
    RetryPolicy,
    build_chat_model,
    make_chat_model,
    require_chat_model,
    to_anthropic,
    to_openai,
)
from .llm_scripted import ScriptedChatModel, ScriptExhausted
from .llm_structured import StructuredOutcome, extract_json_candidates, parse_structured, structured, structured_outcome

LLM_ERRORS: tuple[type[Exception], ...] = (LLMConfigError, LLMUnavailableError, BudgetExceeded)
"""Everything a chat call raises on purpose; ``except LLM_ERRORS`` in callers that must not crash."""


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MessagesIn",
    "MeteredChatModel",
    "StopReason",
    "as_messages",
    "estimate_prompt_tokens",
    "metered",
    "parse_structured",
    "to_anthropic",
    "to_openai",
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
    "require_chat_model",
    "structured",
    "structured_outcome",
]
