"""`kscout chat`: a terminal conversation with the chat agent, and slash commands that need no model.

The REPL takes an input function and a rich Console, so tests drive it without a TTY. Slash commands
call the same toolbox the agent uses (so /measure spends the same budget, under the same rules); what
they found is passed to the model with the next message, so it knows what the user did by hand.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.syntax import Syntax
from rich.table import Table

from kernelscout.agent.cli_errors import Terminated
from kernelscout.agent.search_config import help_default, search_config
from kernelscout.sandbox import harness_defaults
from kernelscout.sandbox.problem import InputFileError, problem_file, problem_name
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir

if TYPE_CHECKING:  # LangGraph takes seconds to import: only `kscout chat` itself pays for it
    from kernelscout.agent.chat import ChatAgent, ChatSettings, Confirmation, TurnOutcome
    from kernelscout.agent.chat_tools import ChatToolbox, ToolResult

AUTO = "auto"
PROBLEM_META = "chat_problem"
DEFAULT_CHAT_BUDGET = 10  # measurements granted to a run directory that has no cap yet

HELP = """\
Slash commands (no model needed):
  /measure FILE [--again]   check and time a candidate (spends one measurement unless already measured here)
  /predict FILE [PARENT]    forecast a candidate's speedup (no measurement)
  /budget                   measurements used and left
  /best                     the best verified candidate in this run
  /history                  every candidate measured in this run, oldest first
  /diff A B                 unified diff of two files ('reference' is the problem)
  /sol                      speed-of-light bound of the problem on this device
  /forecasts                how well the forecasts so far matched the measurements after them
  /help                     this list
  /quit                     leave (the session is saved in the run directory)
Anything else is a message to the agent."""


class ChatSetupError(ValueError):
    """The chat cannot start as asked; the message says what to pass instead."""


@dataclass
class ChatSession:
    """Everything one `kscout chat` holds: tools, agent, model (None: slash commands only) and a note for the model."""

    toolbox: ChatToolbox
    agent: ChatAgent
    model: Any
    no_model_reason: str = ""
    notes: list[str] = field(default_factory=list)
    resumed: bool = False

    @property
    def run(self) -> RunDir:
        return self.toolbox.run

    def close(self) -> None:
        self.agent.__exit__(None, None, None)
        self.toolbox.close()


# -- opening a session ---------------------------------------------------------------------------------------------


def refuse_search_folder(run_path: Path) -> None:
    """A chat measures, and a search's folder takes only the search's measurements: refused, running or not, with the
    way on that works now (a running search cannot be resumed until it stops)."""
    from kernelscout.tools.measure import refuse_if_searched, search_in
    from kernelscout.tools.rundir import RunDirError

    try:
        refuse_if_searched(run_path)
    except RunDirError as exc:
        raise ChatSetupError(str(exc).replace("measure into another", "chat in another")) from None
    search = search_in(run_path)
    if search:
        raise ChatSetupError(f"{run_path} holds {search}, whose folder takes only the search's own measurements; chat in "
                             f"another folder (--run-dir), or go on with the search: `kscout budget {run_path} --set N && "
                             f"kscout resume {run_path}`")


def resolve_problem(problem: Optional[str], run_dir: Optional[str]) -> tuple[Path, Path]:
    """(problem file, run directory): a folder means its problem.py; a run directory remembers its problem. A folder
    that holds a search is refused here, before its memory is read (it has none)."""
    run_path = Path(run_dir) if run_dir else None
    if run_path is not None:
        refuse_search_folder(run_path)
    remembered = RunDir(run_path).get_meta(PROBLEM_META) if run_path and (run_path / "run.db").exists() else None
    if problem is None:
        if remembered is None and run_path is not None:
            raise ChatSetupError(f"{run_dir} holds no earlier chat to continue; give a problem too (a KernelBench .py file "
                                 "or a folder with problem.py) to start one there")
        if remembered is None:
            raise ChatSetupError("give a problem (a KernelBench .py file or a folder with problem.py), or --run-dir of an "
                                 "earlier chat to continue it")
        path = Path(remembered)
    else:
        try:
            path = problem_file(problem)
        except InputFileError as exc:  # a folder without problem.py
            raise ChatSetupError(str(exc)) from None
        if not path.is_file():
            raise ChatSetupError(f"{problem}: no such problem file (pass a KernelBench .py file or a folder with problem.py)")
    path = path.resolve()
    if run_path is None:
        name = problem_name(path)
        run_path = Path("runs") / f"chat-{name}"
        refuse_search_folder(run_path)
        remembered = RunDir(run_path).get_meta(PROBLEM_META) if (run_path / "run.db").exists() else None
    if remembered is not None and Path(remembered) != path:
        raise ChatSetupError(f"{run_path} holds a chat about {remembered}; pass another --run-dir for {path}, or omit the "
                             "problem to continue that chat")
    return path, run_path


UNUSABLE_LLM = "The LLM is configured but cannot be used"


def make_model(run: RunDir, flags: Any = None) -> tuple[Any, str]:
    """(chat model, "") or (None, why not and how to enable one). Token and USD use persist in the run directory."""
    from kernelscout.agent.llm import LLMConfigError, build_chat_model, describe_how_to_enable
    from kernelscout.agent.llm_config import resolve_llm_config
    from kernelscout.agent.llm_pricing import CHAT_USAGE_META, PriceTable, UsageMeter, UsageState, stored_usage

    try:
        resolved = resolve_llm_config(flags)
        if resolved is None:
            how = describe_how_to_enable()
            if how.startswith("No LLM is configured"):  # its first line is about the search's offline policies
                how = how.split("\n", 1)[-1]
            return None, "To talk to the agent, configure an LLM provider:\n" + how + "\nSee docs/llm.md."
        state = stored_usage(run, CHAT_USAGE_META) or UsageState()
        # a cap given now (flag, environment, kscout.toml) replaces the stored one; none given keeps it, as `kscout
        # resume` keeps a search's: the caps cover the whole chat across restarts, and what is stored is what is in force
        if resolved.max_usd is not None:
            state.max_usd = resolved.max_usd
        if resolved.max_tokens_total is not None:
            state.max_tokens_total = resolved.max_tokens_total
        run.set_meta(CHAT_USAGE_META, state.model_dump_json())
        meter = UsageMeter(prices=PriceTable(resolved.prices), state=state,
                           on_update=lambda s: run.set_meta(CHAT_USAGE_META, s.model_dump_json()))
        return build_chat_model(resolved, meter=meter), ""
    except LLMConfigError as exc:
        return None, f"{UNUSABLE_LLM}: {exc}\nSee docs/llm.md."


def open_chat(problem: Optional[str], run_dir: Optional[str] = None, *, device: str = "auto", budget: Optional[int] = None,
              settings: Optional[ChatSettings] = None, harness: Any = None, pool: Any = None, model: Any = AUTO,
              llm_flags: Any = None) -> ChatSession:
    """Open (or continue) the chat of a run directory. model=AUTO: the configured provider; None: slash commands only."""
    from kernelscout.agent.chat import ChatAgent
    from kernelscout.agent.chat_tools import ChatToolbox
    from kernelscout.tools.mcp_server import ensure_cap

    from kernelscout.sandbox.problem import InputFileError
    from kernelscout.tools.measure import resolve_device

    path, run_path = resolve_problem(problem, run_dir)
    try:
        device = resolve_device(device)  # the header and every tool name the device that measures, not "auto"
    except InputFileError as exc:
        raise ChatSetupError(f"--device {exc}") from None
    ensure_cap(str(run_path), budget, default_more=DEFAULT_CHAT_BUDGET)  # a bad --budget refused before the folder exists
    run = RunDir(run_path)
    reason = ""
    if isinstance(model, str) and model == AUTO:
        model, reason = make_model(run, llm_flags)
    elif model is None:
        reason = "no chat model was given"
    toolbox = ChatToolbox(path, run_path, device=device, harness=harness, pool=pool, predict_model=model)
    run.set_meta(PROBLEM_META, str(path))
    agent = ChatAgent(toolbox, model, settings).__enter__()
    resumed = bool(agent.state().get("messages"))
    return ChatSession(toolbox=toolbox, agent=agent, model=model, no_model_reason=reason, resumed=resumed)


# -- the REPL ------------------------------------------------------------------------------------------------------


class ChatREPL:
    """Reads lines, runs slash commands or agent turns, shows what happened. `run()` returns at /quit or end of input."""

    def __init__(self, session: ChatSession, input_fn: Optional[Callable[[str], str]] = None, console: Optional[Console] = None):
        self.session = session
        self.console = console or Console()
        self.input = input_fn or (lambda prompt: self.console.input(_escape(prompt)))  # "[y/N]" is not markup
        self._usage_at_turn_start = self._usage()

    def run(self) -> None:
        """Until /quit or end of input. Leaving at a confirmation question keeps it for the next session."""
        self._banner()
        try:
            self._finish_earlier_turn()
            while True:
                try:
                    line = self.input("you> ").strip()
                except KeyboardInterrupt:  # at the idle prompt nothing is under way: leave as /quit does
                    self.console.print()
                    break
                if not line:
                    continue
                if line.startswith("/"):
                    if not self.command(line):
                        break
                    continue
                self.talk(line)
        except EOFError:
            self.console.print()
        self.console.print(f"[dim]session saved in {self.session.run.path}; continue it with "
                           f"`kscout chat --run-dir {self.session.run.path}`[/dim]")

    # -- agent turns -------------------------------------------------------------------------------------------

    def talk(self, text: str) -> None:
        if self.session.model is None:
            self.console.print("[yellow]No model in this session, so only slash commands work (/help). To talk to the "
                               "agent, configure a provider (KSCOUT_PROVIDER=...; see docs/llm.md) and start it again: "
                               "the session continues.[/yellow]")
            return
        if self.session.notes:
            text = "[Since your last reply the user ran: " + "; ".join(self.session.notes) + "]\n\n" + text
            self.session.notes.clear()
        self._usage_at_turn_start = self._usage()
        self._drive(lambda: self.session.agent.send(text))

    def _drive(self, step: Callable[[], TurnOutcome]) -> None:
        try:
            outcome = step()
            self.show(outcome)
            while outcome.status == "confirm" and outcome.question is not None:
                outcome = self.session.agent.answer(self.ask(outcome.question))
                self.show(outcome)
        except KeyboardInterrupt as exc:
            if isinstance(exc, Terminated):  # a stop from outside ends the session, not only the turn
                raise
            self.console.print("[yellow]interrupted: the turn stopped. A measurement in flight is recorded or adopted "
                               "later, never paid for twice.[/yellow]")
        self.footer()

    def ask(self, question: Confirmation) -> bool:
        b = question.budget
        left = "uncapped" if b.remaining is None else f"{b.remaining} of {b.cap} left"
        again = " again" if question.again else ""
        reply = self.input(f"measure{again} {question.path}? This spends 1 measurement ({left}) [y/N] ")
        yes = reply.strip().lower() in ("y", "yes")
        if not yes:
            self.console.print("[dim]not measured; nothing spent[/dim]")
        return yes

    def _finish_earlier_turn(self) -> None:
        agent = self.session.agent
        if self.session.model is None:
            if agent.pending_question() is not None or agent.unfinished_turn():
                self.console.print("[dim]the last session left a turn unfinished; it goes on once a model is configured[/dim]")
            return
        question = agent.pending_question()
        if question is not None:
            self.console.print("[bold]The last session stopped at a question:[/bold]")
            self._drive(lambda: agent.answer(self.ask(question)))
        elif agent.unfinished_turn():
            self.console.print("[bold]Finishing the turn the last session left in the middle...[/bold]")
            self._drive(agent.continue_turn)

    # -- slash commands ----------------------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run one slash command; False means leave."""
        try:
            words = shlex.split(line)
        except ValueError as exc:
            self.console.print(f"[red]{exc}[/red]")
            return True
        name, args = words[0].lower(), words[1:]
        tb = self.session.toolbox
        if name in ("/quit", "/exit", "/q"):
            return False
        if name in ("/help", "/?"):
            self.console.print(HELP, markup=False, highlight=False)
            return True
        calls: dict[str, tuple[int, int, Callable[[list[str]], ToolResult]]] = {
            "/measure": (1, 2, lambda a: tb.call("measure", {"candidate": a[0], "again": "--again" in a[1:]})),
            "/predict": (1, 2, lambda a: tb.call("predict", {"candidate": a[0], "parent": a[1] if len(a) > 1 else None})),
            "/budget": (0, 0, lambda a: tb.call("budget_status", {})),
            "/best": (0, 0, lambda a: tb.call("best_candidate", {})),
            "/history": (0, 0, lambda a: tb.call("list_candidates", {})),
            "/diff": (2, 2, lambda a: tb.call("diff", {"a": a[0], "b": a[1]})),
            "/sol": (0, 0, lambda a: tb.call("sol_bounds", {})),
            "/forecasts": (0, 0, lambda a: tb.call("forecast_check", {})),
        }
        if name not in calls:
            self.console.print(f"[red]unknown command {name}[/red]; type /help for the list", highlight=False)
            return True
        low, high, fn = calls[name]
        # /measure's second word may only be its flag: a misspelt --again replayed the recorded result unannounced
        if not low <= len(args) <= high or (name == "/measure" and args[1:] not in ([], ["--again"])):
            usage = next((ln.strip() for ln in HELP.splitlines() if ln.strip().startswith(name + " ") or ln.strip() == name), name)
            self.console.print(f"[red]usage:[/red] {usage.split('  ')[0]}", highlight=False)
            return True
        if name == "/measure" and tb.resolve(args[0]).is_file():  # else the error line comes alone, as in `kscout measure`
            self.console.print(f"[dim]measuring {args[0]} ...[/dim]", highlight=False)
        result = fn(args)
        self.render_tool(result, show_call=False)
        if name in ("/measure", "/predict"):
            self.session.notes.append(f"{line} -> {_summary(result)}")
        return True

    # -- rendering ---------------------------------------------------------------------------------------------

    def show(self, outcome: TurnOutcome) -> None:
        from kernelscout.agent.chat_tools import ToolResult

        for event in outcome.events:
            if event["type"] == "assistant":
                self.console.print("[bold cyan]agent>[/bold cyan]")
                self.console.print(Markdown(event["text"]))
            elif event["type"] == "note":
                self.console.print(f"[yellow]({_escape(event['text'])})[/yellow]", highlight=False)
            else:
                self.render_tool(ToolResult.model_validate({k: v for k, v in event.items() if k != "type"}))
        if outcome.status in ("error", "limit"):
            self.console.print(f"[red]{outcome.error}[/red]", highlight=False)

    def render_tool(self, r: ToolResult, show_call: bool = True) -> None:
        c = self.console
        if show_call:
            c.print(f"[dim]tool {r.name}({_args(r.arguments)})[/dim]", highlight=False)
        if r.declined:
            c.print("  [yellow]not measured: you declined; nothing spent[/yellow]")
            return
        if not r.ok:
            c.print("  [red]error:[/red] " + _escape(r.error or ""), highlight=False)
            return
        v = r.result or {}
        render = {"Measurement": _measurement, "CandidateForecast": _forecast, "BudgetStatus": _budget, "SolBounds": _sol,
                  "CandidateList": _candidates, "BestCandidate": _best, "DiffResult": _diff, "ForecastCheck": _forecast_check,
                  "FileText": lambda v: f"  read {v['path']} ({v['lines']} lines)",
                  "WrittenCandidate": lambda v: f"  wrote {v['path']} ({v['lines']} lines)"}.get(r.kind)
        shown = render(v) if render else json.dumps(v)[:500]
        if isinstance(shown, str):
            c.print(shown, highlight=False, markup=False)
        else:
            c.print(shown)

    def footer(self, turn: bool = True) -> None:
        status = Budget(self.session.run).status()
        budget = (f"{status.used} used, uncapped" if status.cap is None
                  else f"{status.used} of {status.cap} used, {status.remaining} left")
        if status.reserved:
            budget += f", {status.reserved} in flight"
        line = f"budget: {budget}"
        now = self._usage()
        if now is not None:
            before = self._usage_at_turn_start or now
            turn_tokens = now.total_tokens - before.total_tokens
            turn_usd = now.cost_usd - before.cost_usd
            priced = "" if not now.unpriced_models else f" (unpriced: {', '.join(now.unpriced_models)})"
            if turn:
                line += f"  |  LLM this turn: {turn_tokens:,} tokens, ${turn_usd:.4f}"
            line += f"  |  LLM so far: {now.total_tokens:,} tokens, ${now.cost_usd:.4f}{priced}"
        self.console.print(f"[dim]{line}[/dim]", highlight=False)

    def _usage(self) -> Any:
        meter = getattr(self.session.model, "meter", None)
        return meter.state if meter is not None else None

    def _banner(self) -> None:
        s = self.session
        c = self.console
        c.print(f"[bold]kscout chat[/bold]  problem {s.toolbox.problem}  device {s.toolbox.device}  run {s.run.path}",
                highlight=False)
        if s.resumed:
            n = len([m for m in s.agent.state().get("messages", []) if m["role"] == "user"])
            c.print(f"[dim]continuing the session in {s.run.path} ({n} earlier message(s))[/dim]", highlight=False)
            last = next((e["text"] for e in reversed(s.agent.state().get("events", [])) if e["type"] == "assistant"), None)
            if last:
                c.print("[dim]last reply:[/dim]")
                c.print(Markdown(last))
        if s.model is None:
            why = "its LLM settings cannot be used" if s.no_model_reason.startswith(UNUSABLE_LLM) else "no LLM is configured"
            c.print(f"[yellow]Slash-command mode: {why} for the chat agent.[/yellow]")
            c.print(s.no_model_reason, markup=False, highlight=False, soft_wrap=not c.is_terminal)  # whole lines in a log
        else:
            confirm = "asks before each measurement" if s.agent.settings.confirm else "measures without asking"
            c.print(f"[dim]model {getattr(s.model, 'model', '?')}; the agent {confirm}. /help lists slash commands.[/dim]",
                    highlight=False)
        self.footer(turn=False)


# -- formatting helpers --------------------------------------------------------------------------------------------


class _ConsoleLogHandler(logging.Handler):
    """A log record as one dim line of the conversation ("warning: LLM call attempt 1 failed ...; retrying").

    The MCP SDK's server setup installs Rich's log handler on the root logger, whose time, level column and
    source file:line read like a crash report in the middle of a chat.
    """

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname.lower()}: {self.format(record)}"
            self.console.print(f"[dim]{_escape(text)}[/dim]", highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never end a conversation
            self.handleError(record)


def log_to_console(console: Console) -> None:
    """Warnings and errors of any logger go to the chat's console, in its style; INFO (the SDK's) is dropped."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ConsoleLogHandler(console))
    root.setLevel(logging.WARNING)



def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _args(arguments: dict) -> str:
    parts = []
    for k, v in arguments.items():
        text = v if isinstance(v, str) else json.dumps(v)
        if isinstance(v, str) and "\n" in v:
            text = f"<{v.count(chr(10)) + 1} lines>"
        parts.append(f"{k}={text[:80]}")
    return ", ".join(parts)


def _measurement(m: dict) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1))
    ok = m.get("status") == "ok"
    t.add_row("  status", f"[{'green' if ok else 'red'}]{m.get('status')}[/]")
    t.add_row("  correct", str(m.get("correct", False)))
    if m.get("runtime_ms") is not None:
        t.add_row("  time", f"{m['runtime_ms']:.4g} ms vs reference {m.get('ref_runtime_ms', 0):.4g} ms")
    if m.get("speedup") is not None and m.get("timing_valid"):
        t.add_row("  speedup", f"[bold]{m['speedup']:.3f}x[/bold] (measured)")
    elif m.get("speedup") is not None:  # a ratio of void timings: shown, never as a result (`/history` says failed)
        t.add_row("  speedup", f"{m['speedup']:.3f}x as timed, which does not count: the timing is not valid")
    t.add_row("  timing valid", "yes" if m.get("timing_valid") else f"no: {_escape(m.get('timing_invalid_reason') or 'not timed')}")
    t.add_row("  charged", "yes" if m.get("charged") else "no")
    for warning in m.get("warnings") or []:
        t.add_row("  warning", _escape(warning))
    if not ok or not m.get("charged"):
        t.add_row("  note", _escape((m.get("message") or "")[:300]))
    return t


def _forecast(f: dict) -> str:
    if not f.get("informative"):
        return f"  no forecast ({f.get('surrogate')}): {f.get('rationale', '')}"
    line = f"  forecast ({f.get('surrogate')}): P(faster) {f['p_faster']:.2f}"
    if f.get("expected_speedup") is not None:
        line += f", expected {f['expected_speedup']:.2f}x"
    if f.get("speedup_interval_80"):
        lo, hi = f["speedup_interval_80"]
        line += f" (80%: {lo:.2f}-{hi:.2f}x)"
    line += f", confidence {f['confidence']:.2f}"
    if f.get("rationale"):
        line += f"\n  why: {f['rationale'][:300]}"
    if f.get("note"):
        line += f"\n  note: {f['note']}"
    return line


def _budget(b: dict) -> str:
    if b.get("cap") is None:
        return f"  budget: {b.get('used', 0)} used, uncapped"
    return f"  budget: {b.get('used', 0)} of {b['cap']} used, {b.get('remaining')} left" + (
        f", {b['reserved']} in flight" if b.get("reserved") else "")


def _sol(s: dict) -> str:
    return (f"  speed of light on {s['device_key']}: {s['time_ms']:.4g} ms ({s['bound']}-bound; "
            f"{s['flops']:,} FLOPs, {s['min_bytes']:,} bytes at least)")


def _candidates(v: dict) -> Any:
    rows = v.get("candidates", [])
    if not rows:
        return "  nothing measured in this run yet"
    t = Table(box=None, pad_edge=False, padding=(0, 1))
    t.add_column("candidate", overflow="fold")  # a long path folds onto more lines: its file name is never cut off
    for col in ("origin", "state", "speedup", "charged"):
        t.add_column(col, no_wrap=True)
    for e in rows:
        m = e.get("measurement") or {}
        t.add_row(_escape(str(e.get("path"))), e.get("origin", ""), e.get("state", ""),
                  f"{e['speedup']:.3f}x" if e.get("speedup") is not None else "-", "yes" if m.get("charged") else "no")
    return t


def _forecast_check(v: dict) -> str:
    if not v.get("scored"):
        return f"  {v.get('forecasts', 0)} forecast(s) so far, none followed by a usable measurement: nothing to score yet"
    parts = [f"{v['scored']} forecast(s) scored against the measurements after them"]
    if v.get("brier_p_faster") is not None:
        parts.append(f"Brier {v['brier_p_faster']:.3f} (coin flip 0.25)")
    if v.get("direction_accuracy") is not None:
        parts.append(f"direction right {v['direction_accuracy']:.0%}")
    if v.get("spearman") is not None:
        parts.append(f"rank correlation {v['spearman']:.2f}")
    return "  " + "; ".join(parts)


def _best(v: dict) -> str:
    return f"  best: {v.get('message')}" if v.get("found") else f"  {v.get('message')}"


def _diff(v: dict) -> Any:
    if v.get("identical"):
        return f"  {v['a']} and {v['b']} are identical"
    return Syntax(v["diff"], "diff", theme="ansi_dark", word_wrap=True)


def _summary(r: ToolResult) -> str:
    """One line for the model: what a slash command found."""
    if not r.ok:
        return f"error: {r.error}"
    v = r.result or {}
    if r.kind == "Measurement":
        speed = f", {v['speedup']:.3f}x measured" if v.get("speedup") is not None else ""
        return f"{v.get('status')}, correct={v.get('correct')}{speed}, charged={v.get('charged')}"
    if r.kind == "CandidateForecast":
        if not v.get("informative"):
            return "no informative forecast"
        return f"forecast P(faster)={v['p_faster']:.2f}, expected {v.get('expected_speedup') or 0:.2f}x"
    return r.kind


# -- the command ---------------------------------------------------------------------------------------------------


_CHAT_FLAGS = {"provider": "--provider", "model": "--model", "base_url": "--base-url", "max_usd": "--max-usd",
               "max_tokens_total": "--max-tokens", "timeout_s": "--timeout", "timing_budget_s": "--timing-budget"}


def register(app: typer.Typer) -> None:
    """Add the `chat` command to a typer app."""

    @app.command("chat")
    def chat(
        problem: Optional[str] = typer.Argument(None, help="KernelBench problem file or a folder with problem.py "
                                                          "(omit to continue the chat in --run-dir)"),
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run directory of the session (default runs/chat-<problem name>); "
                                                                      "the same one continues the conversation"),
        device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda or cuda:N {help_default('device')}"),
        budget: Optional[int] = typer.Option(None, help=f"measurement cap (default: the run directory's own, or {DEFAULT_CHAT_BUDGET} more than it has used)"),
        confirm: bool = typer.Option(True, "--confirm/--no-confirm", help="ask before each measurement the agent wants to spend"),
        provider: Optional[str] = typer.Option(None, help="anthropic, openai or openai-compatible (see docs/llm.md)"),
        model: Optional[str] = typer.Option(None, help="model name"),
        base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1"),
        max_usd: Optional[float] = typer.Option(None, "--max-usd", help="stop calling the LLM when the run has cost this much"),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="stop calling the LLM at this many tokens in the run"),
        timeout: float = typer.Option(harness_defaults.TIMEOUT_S, help="seconds allowed for running a candidate (checks and timing)"),
        timing_budget: float = typer.Option(harness_defaults.TIMING_BUDGET_S, "--timing-budget", help="timed seconds to aim for, both sides together"),
    ) -> None:
        """Talk to a tool-calling agent about one problem; slash commands work without any LLM."""
        from kernelscout.agent.chat import ChatSettings
        from kernelscout.agent.chat_tools import ToolFailure
        from kernelscout.agent.llm_config import LLMConfig
        from kernelscout.sandbox.harness import HarnessConfig

        from pydantic import ValidationError

        from kernelscout.agent.cli_errors import validation_message

        console = Console()
        try:
            flags = LLMConfig(provider=provider, model=model, base_url=base_url, max_usd=max_usd, max_tokens_total=max_tokens)
            harness = HarnessConfig(timeout_s=timeout, timing_budget_s=timing_budget)
        except ValidationError as exc:  # as the flags typed, not pydantic's dump
            console.print(f"[red]error:[/red] {_escape(validation_message(exc, _CHAT_FLAGS))}")
            raise typer.Exit(2) from None
        except ValueError as exc:
            console.print(f"[red]error:[/red] {_escape(str(exc))}", soft_wrap=True)  # a command in it stays on one line
            raise typer.Exit(2) from None
        has_flags = any(v is not None for v in (provider, model, base_url, max_usd, max_tokens))
        device = search_config(False).pick("device", device)
        try:
            session = open_chat(problem, run_dir, device=device, budget=budget, settings=ChatSettings(confirm=confirm),
                                harness=harness,
                                llm_flags=flags if has_flags else None)
        except (ChatSetupError, ToolFailure, ValueError) as exc:
            console.print(f"[red]error:[/red] {_escape(str(exc))}", soft_wrap=True)  # a command in it stays on one line
            raise typer.Exit(2) from None
        log_to_console(console)
        try:
            ChatREPL(session, console=console).run()
        finally:
            session.close()
