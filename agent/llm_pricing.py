"""What LLM calls cost, and the per-run caps that stop a run before it overspends.

kernelscout runs unattended for hours, so spend must be bounded by something
firmer than "watch the dashboard". Every chat call goes through a
:class:`UsageMeter`: before the call it *reserves* the call's worst case
(estimated prompt tokens plus ``max_tokens`` of output) and refuses with
:class:`BudgetExceeded` if that worst case could cross a cap; after the call
it replaces the reservation with the tokens the provider actually reported.
Reserving (rather than only checking what was already spent) is what keeps the
cap honest when several agent threads share one meter.

Prices are a small hand-kept table, because providers publish no price API.
A model missing from it costs $0 and is listed in
:attr:`UsageState.unpriced_models`, so a USD cap is visibly not protecting that
model (the token cap still does). Override or extend the table through
``[llm.prices]`` in the config file or ``LLMConfig(prices=...)``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from kernelscout.tools.rundir import RunDir

PRICES_AS_OF = "2026-11"


class ModelPrice(BaseModel):
    """USD per million tokens."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


def _p(inp: float, out: float) -> ModelPrice:
    return ModelPrice(input_per_mtok=inp, output_per_mtok=out)


# Public list prices (standard tier, no caching or batch discount) as of PRICES_AS_OF.
# Keys are base model names; dated snapshots ("-20250929", "-2025-08-07") map onto them.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-opus-4-7": _p(5.0, 25.0),
    "claude-opus-4-6": _p(5.0, 25.0),
    "claude-opus-4-5": _p(5.0, 25.0),
    "claude-opus-4-1": _p(15.0, 75.0),
    "claude-sonnet-4-6": _p(3.0, 15.0),
    "claude-sonnet-4-5": _p(3.0, 15.0),
    "claude-sonnet-4": _p(3.0, 15.0),
    "claude-haiku-4-5": _p(1.0, 5.0),
    "gpt-5": _p(1.25, 10.0),
    "gpt-5-mini": _p(0.25, 2.0),
    "gpt-5-nano": _p(0.05, 0.40),
    "gpt-4.1": _p(2.0, 8.0),
    "gpt-4.1-mini": _p(0.40, 1.60),
    "gpt-4.1-nano": _p(0.10, 0.40),
    "gpt-4o": _p(2.50, 10.0),
    "gpt-4o-mini": _p(0.15, 0.60),
    "o3": _p(2.0, 8.0),
    "o4-mini": _p(1.10, 4.40),
}

_SNAPSHOT_SUFFIX = re.compile(r"(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")


def _normalise(model: str) -> str:
    """Map the spellings one model goes by onto its table key.

    Routers prefix the vendor ("anthropic/claude-sonnet-4-6") and providers
    pin snapshots with a date suffix; both cost the same as the base name.
    """
    name = model.strip().lower().rsplit("/", 1)[-1]
    return _SNAPSHOT_SUFFIX.sub("", name)


class PriceTable:
    """Default prices overlaid with the user's overrides (overrides win)."""

    def __init__(
        self, overrides: Mapping[str, ModelPrice] | None = None, *, base: Mapping[str, ModelPrice] | None = None
    ):
        merged = dict(DEFAULT_PRICES if base is None else base)
        merged.update(overrides or {})
        self._exact = {k.strip().lower(): v for k, v in merged.items()}
        self._base = {_normalise(k): v for k, v in merged.items()}

    def lookup(self, model: str) -> ModelPrice | None:
        key = model.strip().lower()
        return self._exact.get(key) or self._base.get(_normalise(model))

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> tuple[float, bool]:
        """(USD, priced); an unknown model costs 0 and comes back with priced=False."""
        price = self.lookup(model)
        if price is None:
            return 0.0, False
        usd = (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1_000_000
        return usd, True


class Usage(BaseModel):
    """Tokens of one call as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelTally(BaseModel):
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class UsageState(BaseModel):
    """Everything a run directory needs to persist and later resume the meter."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    max_tokens_total: int | None = None
    max_usd: float | None = None
    by_model: dict[str, ModelTally] = Field(default_factory=dict)
    unpriced_models: list[str] = Field(default_factory=list, description="models counted at $0: no price known")

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


RUN_USAGE_META = "llm_usage"  # run.db meta key of a search's meter (agent/factory.py)
CHAT_USAGE_META = "chat_llm_usage"  # and of `kscout chat`'s own calls in the same run directory (agent/cli_chat.py)


def stored_usage(run: RunDir, key: str = RUN_USAGE_META) -> Optional[UsageState]:
    """The search's LLM meter as last persisted in its run directory, or None where no LLM call was metered.

    The one reader of the record, so that `optimize`, `kscout run`, `show` and the report cannot add it up differently."""
    saved = run.get_meta(key)
    return UsageState.model_validate_json(saved) if saved else None


def usage_line(state: UsageState) -> str:
    """LLM use in one line, with the caps it ran under and the models counted at $0.

    A local or unlisted model costs $0 here, so the line names it: "$0.0000" alone would read as free
    (and as if a USD cap had guarded it)."""
    tokens = f"{state.total_tokens:,} tokens ({state.input_tokens:,} in, {state.output_tokens:,} out)"
    if state.max_tokens_total is not None:
        tokens += f" of {state.max_tokens_total:,} cap"
    usd = f"${state.cost_usd:.4f}" + (f" of ${state.max_usd:.2f} cap" if state.max_usd is not None else "")
    line = f"{state.calls:,} call{'s' if state.calls != 1 else ''}, {tokens}, {usd}"
    if state.unpriced_models:
        line += f"; no price known for {', '.join(state.unpriced_models)} (counted at $0)"
    return line


class BudgetExceeded(RuntimeError):
    """A per-run cap refused a call. Raised *before* the call, so nothing was sent or billed."""

    def __init__(self, message: str, *, cap: Literal["tokens", "usd"], state: UsageState, needed: Optional[float] = None):
        """`needed`: the smallest cap under which the refused call would have gone ahead (its worst case on top of the
        use so far and the calls in flight), for a message that offers a cap that works."""
        super().__init__(message)
        self.cap = cap
        self.state = state
        self.needed = needed


class Reservation:
    """A call's worst case held against the caps until the real usage is known."""

    def __init__(self, meter: UsageMeter, model: str, tokens: int, usd: float):
        self._meter = meter
        self.model = model
        self.tokens = tokens
        self.usd = usd
        self._open = True

    def settle(self, usage: Usage) -> tuple[float, bool]:
        """Swap the reservation for the real usage; returns (USD, priced)."""
        if not self._open:
            raise RuntimeError("reservation already settled or released")
        self._open = False
        return self._meter._settle(self, usage)

    def release(self) -> None:
        """The call failed before any tokens were billed: give the headroom back."""
        if self._open:
            self._open = False
            self._meter._release(self)


def estimate_tokens(text: str) -> int:
    """A deliberately high guess (3 characters a token) so caps err on the safe side."""
    return math.ceil(len(text) / 3)


class UsageMeter:
    """Thread-safe token and USD accounting for one run, with optional caps.

    Cap semantics: :meth:`reserve` raises :class:`BudgetExceeded` before a call
    whose worst case (spent + in-flight reservations + estimated prompt +
    ``max_tokens``) would exceed a cap, so a call that could cross it is never
    started. The prompt estimate is approximate, so actual spend can end a
    little above a cap; the call that did so still returns its answer, and the
    next call is refused.

    ``on_update`` receives a snapshot after every settled call, under the
    meter's lock so snapshots arrive in order; keep it quick (write a file).
    """

    def __init__(
        self,
        *,
        max_tokens_total: int | None = None,
        max_usd: float | None = None,
        prices: PriceTable | None = None,
        on_update: Callable[[UsageState], None] | None = None,
        state: UsageState | None = None,
    ):
        self._lock = threading.Lock()
        self._state = state.model_copy(deep=True) if state is not None else UsageState()
        if max_tokens_total is not None:
            self._state.max_tokens_total = max_tokens_total
        if max_usd is not None:
            self._state.max_usd = max_usd
        self.prices = prices or PriceTable()
        self.on_update = on_update
        self._reserved_tokens = 0
        self._reserved_usd = 0.0

    @property
    def state(self) -> UsageState:
        with self._lock:
            return self._state.model_copy(deep=True)

    def reserve(self, model: str, prompt_tokens: int, max_output_tokens: int) -> Reservation:
        tokens = prompt_tokens + max_output_tokens
        usd, _ = self.prices.cost(model, prompt_tokens, max_output_tokens)
        with self._lock:
            s = self._state
            if s.max_tokens_total is not None:
                worst = s.input_tokens + s.output_tokens + self._reserved_tokens + tokens
                if worst > s.max_tokens_total:
                    raise BudgetExceeded(
                        f"LLM token cap reached: {s.input_tokens + s.output_tokens} of {s.max_tokens_total} tokens used"
                        f" ({self._reserved_tokens} in flight) and the next call to {model} could use up to {tokens}"
                        f" (~{prompt_tokens} prompt + max_tokens {max_output_tokens})"
                        + (f": a cap under {tokens} leaves no room for a single call" if tokens > s.max_tokens_total else "")
                        + "; raise the cap (--max-tokens, max_tokens_total in kscout.toml, or KSCOUT_LLM_MAX_TOKENS) to continue.",
                        cap="tokens",
                        state=s.model_copy(deep=True),
                        needed=worst,
                    )
            if s.max_usd is not None:
                worst_usd = s.cost_usd + self._reserved_usd + usd
                if worst_usd > s.max_usd:
                    raise BudgetExceeded(
                        f"LLM spending cap reached: ${s.cost_usd:.4f} of ${s.max_usd:.2f} spent"
                        f" (${self._reserved_usd:.4f} in flight) and the next call to {model} could cost up to"
                        f" ${usd:.4f}; raise the cap (--max-usd, max_usd in kscout.toml, or KSCOUT_LLM_MAX_USD) to continue.",
                        cap="usd",
                        state=s.model_copy(deep=True),
                        needed=worst_usd,
                    )
            self._reserved_tokens += tokens
            self._reserved_usd += usd
        return Reservation(self, model, tokens, usd)

    def _release(self, r: Reservation) -> None:
        with self._lock:
            self._reserved_tokens -= r.tokens
            self._reserved_usd -= r.usd

    def _settle(self, r: Reservation, usage: Usage) -> tuple[float, bool]:
        usd, priced = self.prices.cost(r.model, usage.input_tokens, usage.output_tokens)
        with self._lock:
            self._reserved_tokens -= r.tokens
            self._reserved_usd -= r.usd
            s = self._state
            s.calls += 1
            s.input_tokens += usage.input_tokens
            s.output_tokens += usage.output_tokens
            s.cost_usd += usd
            tally = s.by_model.setdefault(r.model, ModelTally())
            tally.calls += 1
            tally.input_tokens += usage.input_tokens
            tally.output_tokens += usage.output_tokens
            tally.cost_usd += usd
            if not priced and r.model not in s.unpriced_models:
                s.unpriced_models.append(r.model)
            if self.on_update is not None:
                self.on_update(s.model_copy(deep=True))
        return usd, priced
