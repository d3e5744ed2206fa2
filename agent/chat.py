"""The chat agent: a LangGraph tool-calling loop over kernelscout's tools, checkpointed in the run directory.

One user turn runs ``agent -> [confirm] -> tools -> agent -> ...`` until the model answers without
calling a tool. The graph is compiled with a SqliteSaver on ``checkpoints.db`` (thread ``chat``), so
the conversation, the tool results and a question waiting for the user survive the process: opening
the same run directory again continues where it stopped.

Confirmation is a LangGraph interrupt in its own node, one measurement per node run. A node is
re-executed from its start when resumed, so nothing with a side effect may come before
``interrupt()``; keeping the question apart from the tools node guarantees that nothing is measured,
and no budget spent, until the user says yes. A measurement that would spend nothing (already
recorded, or refused before it runs) is not asked about.

The model sees ``messages`` (provider-neutral :class:`Message` dumps); the user sees ``events``
(assistant texts and :class:`ToolResult` records), so the terminal can show every tool called, each
forecast and each measurement, exactly as they came back.
"""

from __future__ import annotations

import math
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pydantic import BaseModel, Field

from kernelscout.agent.checkpoint_trim import keep_latest_checkpoint
from kernelscout.agent.chat_tools import ChatToolbox, ToolResult
from kernelscout.agent.llm import LLM_ERRORS, BudgetExceeded, ChatModel, Message
from kernelscout.prompts import load as load_prompt
from kernelscout.tools.budget import Budget
from kernelscout.tools.schema import BudgetStatus

THREAD = "chat"
CHECKPOINTS = "checkpoints.db"


class ChatSettings(BaseModel):
    confirm: bool = Field(True, description="ask the user before each measurement that would spend budget")
    max_tool_rounds: int = Field(8, ge=1, description="tool rounds one user turn may take before the agent must answer")
    history_window: int = Field(80, ge=4, description="most recent messages sent to the model (cut at a user turn)")
    max_tokens: int = Field(4096, ge=256, description="output tokens per model call")


class Confirmation(BaseModel):
    """The question an interrupt puts to the user: measure this file and spend one unit of budget?"""

    call_id: str
    candidate: str
    path: str
    again: bool = False
    budget: BudgetStatus


class TurnOutcome(BaseModel):
    """What one send/answer/continue call did, for the terminal to show."""

    status: Literal["done", "confirm", "error", "limit"]
    events: list[dict[str, Any]] = Field(default_factory=list, description="assistant texts and tool results, in order")
    question: Optional[Confirmation] = None
    error: Optional[str] = None


def _merge(a: Optional[dict], b: Optional[dict]) -> dict:
    return {**(a or {}), **(b or {})}


class ChatState(TypedDict, total=False):
    messages: Annotated[list[dict], operator.add]  # what the model sees
    events: Annotated[list[dict], operator.add]  # what the user sees
    approvals: Annotated[dict[str, bool], _merge]  # "<message index>:<call id>" -> the user's answer
    rounds: int  # tool rounds in the current turn
    error: Optional[str]  # the provider failed this turn (its message says what to do)


def raise_cap_hint(exc: BudgetExceeded, run_dir: Path) -> str:
    """The command that continues this chat under a cap that lets the refused call through (twice the one reached, or
    more where one call needs more): a chat's caps are set when it starts and its spend is kept, so leaving and coming
    back with the flag is the way on."""
    reached = (exc.state.max_usd if exc.cap == "usd" else exc.state.max_tokens_total) or 0
    offer = _round_up(max(2 * reached, exc.needed or 0))
    flag = f"--max-usd {offer:g}" if exc.cap == "usd" else f"--max-tokens {int(offer)}"
    return f"The chat is saved: leave (/quit) and continue it with a higher cap, `kscout chat --run-dir {run_dir} {flag}`."


def _round_up(x: float) -> float:
    """Up to two significant figures, so an offered cap reads as one a person would type."""
    if x <= 0:
        return x
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return round(math.ceil(round(x / step, 6)) * step, 12)


def system_prompt(problem: Path, device: str, run_dir: Path, confirm: bool) -> str:
    note = ("The user confirms every measurement that would spend budget. If they decline, nothing was spent: accept it "
            "and do not measure that file again unless they ask." if confirm else
            "Measurements are not confirmed one by one: every measure call on a new file spends budget at once.")
    return load_prompt("chat").format(problem_path=problem, problem_source=problem.read_text(), device=device,
                                      run_dir=run_dir, confirm_note=note)


class ChatAgent:
    """The conversation of one run directory. Use as a context manager (it holds the checkpoint connection)."""

    def __init__(self, toolbox: ChatToolbox, model: Optional[ChatModel], settings: Optional[ChatSettings] = None):
        self.toolbox = toolbox
        self.model = model
        self.settings = settings or ChatSettings()
        self.run = toolbox.run
        self.config = {"configurable": {"thread_id": THREAD}, "recursion_limit": 8 * self.settings.max_tool_rounds + 20}
        self._conn: Optional[sqlite3.Connection] = None
        self._graph: Any = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> ChatAgent:
        self._conn = sqlite3.connect(self.run.path / CHECKPOINTS, check_same_thread=False, timeout=60.0)
        self._graph = self._build(SqliteSaver(self._conn))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            if exc[0] is None:  # a session that ended cleanly keeps its latest state, all a chat goes on from
                keep_latest_checkpoint(self._conn, THREAD)
            self._conn.close()
        self._conn = self._graph = None

    @property
    def graph(self) -> Any:
        if self._graph is None:
            raise RuntimeError("use ChatAgent as a context manager: `with ChatAgent(...) as agent:`")
        return self._graph

    # -- what the terminal calls -------------------------------------------------------------------------------

    def state(self) -> ChatState:
        return self.graph.get_state(self.config).values or {}

    def pending_question(self) -> Optional[Confirmation]:
        """A confirmation left unanswered (possibly by an earlier process)."""
        snapshot = self.graph.get_state(self.config)
        for item in snapshot.interrupts:
            return Confirmation.model_validate(item.value)
        return None

    def unfinished_turn(self) -> bool:
        """A turn stopped in the middle (the process died during a tool call) with no question pending."""
        snapshot = self.graph.get_state(self.config)
        # A node that finished after the last checkpoint shows in `tasks`, not in `next`.
        return bool(snapshot.next or snapshot.tasks) and not snapshot.interrupts

    def send(self, text: str) -> TurnOutcome:
        """One user message: the agent works (calling tools) until it answers, or stops to ask."""
        if self.model is None:
            raise RuntimeError("no chat model: only slash commands work in this session")
        user = Message.user(text).model_dump()
        return self._invoke({"messages": [user], "rounds": 0, "error": None})

    def answer(self, yes: bool) -> TurnOutcome:
        """The user's answer to the pending confirmation; the turn then goes on."""
        if self.pending_question() is None:
            raise RuntimeError("there is no question waiting for an answer")
        return self._invoke(Command(resume=yes))

    def continue_turn(self) -> TurnOutcome:
        """Finish a turn that a killed process left in the middle (measurements are recorded, so none is repeated)."""
        return self._invoke(None)

    def _invoke(self, value: Any) -> TurnOutcome:
        before = len(self.state().get("events", []))
        result = self.graph.invoke(value, self.config, durability="sync")
        events = list(result.get("events", []))[before:]
        if result.get("__interrupt__"):
            question = Confirmation.model_validate(result["__interrupt__"][0].value)
            return TurnOutcome(status="confirm", events=events, question=question)
        if result.get("error"):
            return TurnOutcome(status="error", events=events, error=result["error"])
        if result.get("rounds", 0) > self.settings.max_tool_rounds:
            return TurnOutcome(status="limit", events=events,
                               error=f"the agent was still calling tools after {self.settings.max_tool_rounds} rounds; "
                                     "its last calls were not run. Say how to continue.")
        return TurnOutcome(status="done", events=events)

    # -- the graph ---------------------------------------------------------------------------------------------

    def _build(self, checkpointer: SqliteSaver) -> Any:
        g = StateGraph(ChatState)
        g.add_node("agent", self._agent)
        g.add_node("confirm", self._confirm)
        g.add_node("tools", self._tools)
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", self._after_agent, ["confirm", "tools", END])
        g.add_conditional_edges("confirm", self._after_confirm, ["confirm", "tools"])
        g.add_conditional_edges("tools", lambda s: END if s.get("rounds", 0) > self.settings.max_tool_rounds else "agent",
                                ["agent", END])
        return g.compile(checkpointer=checkpointer)

    def _agent(self, state: ChatState) -> dict:
        if self.model is None:
            return {"error": "no chat model is configured"}
        prompt = system_prompt(self.toolbox.problem, self.toolbox.device, self.run.path, self.settings.confirm)
        history = _answered(_window(state["messages"], self.settings.history_window))
        convo = [Message.system(prompt)] + [Message.model_validate(m) for m in history]
        try:
            response = self.model.chat(convo, tools=self.toolbox.specs(), max_tokens=self.settings.max_tokens)
        except BudgetExceeded as exc:  # the user's own limit, not a failure: say how to go on
            return {"error": f"{exc} {raise_cap_hint(exc, self.run.path)}"}
        except LLM_ERRORS as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        update: dict = {"messages": [response.to_message().model_dump()]}
        events = [{"type": "assistant", "text": response.text}] if response.text else []
        # what the reply alone would not tell the user: that it is incomplete, or that there is none
        if response.stop_reason == "max_tokens":
            events.append({"type": "note", "text": f"the model's reply was cut off at its output limit of {self.settings.max_tokens} "
                                                   "tokens; ask it to go on, or to answer more briefly"})
        elif response.stop_reason == "refusal":
            events.append({"type": "note", "text": "the model declined to answer (its provider reported a refusal)"})
        elif not response.text and not response.tool_calls:
            events.append({"type": "note", "text": "the model returned an empty reply; ask again, or rephrase"})
        if events:
            update["events"] = events
        return update

    def _after_agent(self, state: ChatState) -> str:
        if state.get("error") or not state["messages"][-1].get("tool_calls"):
            return END
        return "confirm" if self.settings.confirm else "tools"

    def _undecided(self, state: ChatState) -> list[tuple[str, dict]]:
        index = len(state["messages"]) - 1
        approvals = state.get("approvals") or {}
        calls = state["messages"][-1].get("tool_calls") or []
        return [(f"{index}:{c['id']}", c) for c in calls if c["name"] == "measure" and f"{index}:{c['id']}" not in approvals]

    def _confirm(self, state: ChatState) -> dict:
        """Ask about the first undecided measurement (one interrupt per node run, so answers never shift)."""
        undecided = self._undecided(state)
        if not undecided or state.get("rounds", 0) >= self.settings.max_tool_rounds:
            return {}
        key, call = undecided[0]
        candidate = str(call["arguments"].get("candidate", ""))
        again = bool(call["arguments"].get("again", False))
        if call.get("raw_arguments") is not None or not self.toolbox.would_spend(candidate, again):
            return {"approvals": {key: True}}  # nothing would be spent: the tool runs (or refuses) without asking
        question = Confirmation(call_id=call["id"], candidate=candidate, path=str(self.toolbox.resolve(candidate)),
                                again=again, budget=Budget(self.run).status())
        return {"approvals": {key: bool(interrupt(question.model_dump()))}}

    def _after_confirm(self, state: ChatState) -> str:
        if self._undecided(state) and state.get("rounds", 0) < self.settings.max_tool_rounds:
            return "confirm"
        return "tools"

    def _tools(self, state: ChatState) -> dict:
        index = len(state["messages"]) - 1
        rounds = state.get("rounds", 0)
        approvals = state.get("approvals") or {}
        replies, events = [], []
        for call in state["messages"][-1].get("tool_calls") or []:
            name, arguments = call["name"], call.get("arguments") or {}
            if rounds >= self.settings.max_tool_rounds:
                result = ToolResult(name=name, arguments=arguments, ok=False, error=(
                    f"not run: this turn already took {self.settings.max_tool_rounds} tool rounds. Answer the user with "
                    "what you have and ask how to continue."))
            elif call.get("raw_arguments") is not None:
                result = ToolResult(name=name, arguments=arguments, ok=False,
                                    error=f"the arguments were not a JSON object: {call['raw_arguments'][:200]!r}")
            elif name == "measure" and self.settings.confirm and approvals.get(f"{index}:{call['id']}") is False:
                result = ToolResult(name=name, arguments=arguments, ok=False, declined=True,
                                    error="the user declined this measurement; it did not run and nothing was spent")
            else:
                result = self.toolbox.call(name, arguments)
            replies.append(Message.tool_result(call["id"], result.for_model(), is_error=not result.ok).model_dump())
            events.append({"type": "tool", **result.model_dump(mode="json")})
        return {"messages": replies, "events": events, "rounds": rounds + 1}


def _window(messages: list[dict], limit: int) -> list[dict]:
    """The last ``limit`` messages, starting at a user turn so no tool result loses its call."""
    if len(messages) <= limit:
        return messages
    start = len(messages) - limit
    while start < len(messages) - 1 and messages[start]["role"] != "user":
        start += 1
    return messages[start:]


def _answered(messages: list[dict]) -> list[dict]:
    """Give every tool call a result: a turn interrupted mid-tools (Ctrl-C, a killed process) leaves calls
    without one, which both providers reject. The stored conversation is left as it was."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        out.append(m)
        calls = m.get("tool_calls") or []
        if m["role"] != "assistant" or not calls:
            continue
        answered = set()
        for later in messages[i + 1:]:
            if later["role"] != "tool":
                break
            answered.add(later.get("tool_call_id"))
        out.extend(Message.tool_result(c["id"], "not run: the turn was interrupted before this call finished",
                                       is_error=True).model_dump()
                   for c in calls if c["id"] not in answered)
    return out
