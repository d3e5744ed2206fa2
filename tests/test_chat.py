"""`kscout chat`: a scripted model through the real graph, confirmation, resuming, and slash commands without a model.

The REPL is driven with a list of input lines and a recording rich Console, so these read like
terminal sessions. Measurements are real (sandboxed, on the CPU, quick harness settings) and spend
a real ledger; only the model's replies are scripted.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

pytest.importorskip("mcp.server.mcpserver", reason="the chat tools reuse the MCP server's tools (mcp extra)")

from kernelscout.agent.chat import ChatSettings  # noqa: E402
from kernelscout.agent.cli_chat import ChatREPL, open_chat  # noqa: E402
from kernelscout.agent.llm import ChatResponse, LLMUnavailableError, ScriptedChatModel, ToolCall, Usage, UsageMeter  # noqa: E402
from kernelscout.tools.budget import Budget  # noqa: E402
from kernelscout.tools.rundir import RunDir  # noqa: E402
from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES  # noqa: E402

from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM  # noqa: E402
from fake_llm_server import fake_llm_server, reply_text, reply_tool_call  # noqa: E402,F401 - fake_llm_server is a fixture

FASTER_BINS = [0.0] * (len(DEFAULT_EDGES) + 1 - 4) + [0.1, 0.2, 0.4, 0.3]
FORECAST = json.dumps({"probs": FASTER_BINS, "rationale": "one fused pass instead of three"})
FUSED = textwrap.dedent(GOOD_CANDIDATE).replace("return torch.relu(x * self.scale + y) + 0.5 * x",
                                                "return torch.relu(torch.addcmul(y, x, torch.full_like(x, self.scale))) + x * 0.5")


@pytest.fixture
def problem(tmp_path: Path) -> Path:
    path = tmp_path / "problem.py"
    path.write_text(textwrap.dedent(SMALL_PROBLEM))
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD_CANDIDATE))
    return path


def call(tool: str, i: int, **arguments) -> ChatResponse:
    return ChatResponse(tool_calls=[ToolCall(id=f"call_{tool}_{i}", name=tool, arguments=arguments)],
                        stop_reason="tool_use", usage=Usage(input_tokens=100, output_tokens=20))


def say(text: str) -> ChatResponse:
    return ChatResponse(text=text, usage=Usage(input_tokens=120, output_tokens=30))


class Agent:
    """A scripted model: forecasts (asked without tools) get FORECAST; agent steps follow `steps` in order.

    A step may be a callable of the request, to answer from what the tools returned.
    """

    def __init__(self, *steps):
        self.steps = list(steps)
        self.agent_requests = []

    def __call__(self, request):
        if not request.tools:
            return ChatResponse(text=FORECAST, usage=Usage(input_tokens=50, output_tokens=10))
        self.agent_requests.append(request)
        step = self.steps.pop(0)
        return step(request) if callable(step) else step


def model_for(agent: Agent) -> ScriptedChatModel:
    return ScriptedChatModel([agent] * 50, model="claude-sonnet-4-6", meter=UsageMeter())


def last_tool_result(request) -> dict:
    return json.loads(next(m.content for m in reversed(request.messages) if m.role == "tool"))


class Terminal:
    """Scripted input lines and a recording console: what a user would type and see."""

    def __init__(self, *lines: str):
        self.lines = list(lines)
        self.prompts: list[str] = []
        self.console = Console(record=True, width=140, force_terminal=False, color_system=None)

    def input(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)

    @property
    def text(self) -> str:
        return self.console.export_text(clear=False)


def run_repl(session, *lines: str) -> Terminal:
    term = Terminal(*lines)
    ChatREPL(session, term.input, term.console).run()
    return term


def test_a_scripted_model_writes_predicts_and_measures_through_the_graph(tmp_path, problem, pool):
    def report(request):
        m = last_tool_result(request)
        return say(f"Measured: {m['speedup']:.2f}x, correct={m['correct']}.")

    agent = Agent(
        call("write_candidate", 1, name="fused", source=FUSED),
        call("predict", 2, candidate="fused"),
        call("measure", 3, candidate="fused"),
        report,
    )
    model = model_for(agent)
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=3, harness=QUICK, pool=pool, model=model,
                        settings=ChatSettings(confirm=True))
    try:
        term = run_repl(session, "try an addcmul variant", "y")
    finally:
        session.close()

    # the tools ran, in order, and the user saw each one
    out = term.text
    for shown in ("tool write_candidate(name=fused", "wrote ", "tool predict(candidate=fused)", "forecast (llm): P(faster)",
                  "tool measure(candidate=fused)", "speedup", "(measured)", "Measured: "):
        assert shown in out, shown
    assert any(p.startswith("measure ") and "spends 1 measurement (3 of 3 left)" in p for p in term.prompts)
    # the model got the real results back: the forecast, then the measurement it reported
    forecast = json.loads(agent.agent_requests[2].messages[-1].content)
    assert forecast["surrogate"] == "llm" and forecast["informative"] and forecast["p_faster"] > 0.5
    measured = last_tool_result(agent.agent_requests[3])
    assert measured["status"] == "ok" and measured["correct"] and measured["charged"]
    assert f"Measured: {measured['speedup']:.2f}x" in out
    # one measurement spent, and the footer says so, with the LLM's tokens
    run = RunDir(tmp_path / "run")
    assert Budget(run).status().used == 1
    assert "budget: 1 of 3 used, 2 left" in out and "LLM this turn:" in out
    assert (tmp_path / "run" / "candidates" / "fused.py").read_text() == FUSED
    # the system prompt told the model about the problem, the budget rule and the confirmation
    system = agent.agent_requests[0].messages[0].content
    assert str(problem) in system and "ONE unit" in system and "confirms every measurement" in system
    assert {t.name for t in agent.agent_requests[0].tools} >= {"predict", "measure", "budget_status", "sol_bounds",
                                                               "list_candidates", "best_candidate", "diff", "write_candidate"}


def test_declining_a_measurement_spends_nothing_and_yes_spends_one(tmp_path, problem, pool):
    agent = Agent(
        call("measure", 1, candidate=str(tmp_path / "good.py")),
        lambda req: say("Understood, not measured: " + last_tool_result_text(req)),
        call("measure", 2, candidate=str(tmp_path / "good.py")),
        lambda req: say(f"Done: {last_tool_result(req)['speedup']:.2f}x."),
    )
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=2, harness=QUICK, pool=pool,
                        model=model_for(agent))
    ledger = Budget(RunDir(tmp_path / "run"))
    try:
        term = run_repl(session, "measure good.py", "n")
        assert ledger.status().used == 0
        assert "not measured: you declined; nothing spent" in term.text
        assert "declined" in agent.agent_requests[1].messages[-1].content  # the model was told
        with RunDir(tmp_path / "run").connect() as db:
            assert db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 0

        term = run_repl(session, "ok, measure it now", "yes")
        assert ledger.status().used == 1
        assert "Done: " in term.text and "budget: 1 of 2 used, 1 left" in term.text
    finally:
        session.close()


def last_tool_result_text(request) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "tool")


def test_leaving_and_coming_back_continues_the_session(tmp_path, problem, pool):
    run_dir = str(tmp_path / "run")
    first = Agent(call("measure", 1, candidate=str(tmp_path / "good.py")))
    session = open_chat(str(problem), run_dir, device="cpu", budget=2, harness=QUICK, pool=pool, model=model_for(first))
    try:
        # the user leaves at the confirmation question (end of input): nothing is measured
        term = run_repl(session, "please measure good.py")
        assert Budget(RunDir(run_dir)).status().used == 0
    finally:
        session.close()
    assert any("spends 1 measurement" in p for p in term.prompts)
    with sqlite3.connect(tmp_path / "run" / "checkpoints.db") as db:  # the session's latest state is all it goes on from
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = 'chat'").fetchone()[0] == 1

    second = Agent(lambda req: say(f"Measured {last_tool_result(req)['speedup']:.2f}x."),
                   lambda req: say(f"You asked me {sum(m.role == 'user' for m in req.messages)} things."))
    session = open_chat(None, run_dir, device="cpu", harness=QUICK, pool=pool, model=model_for(second))  # problem remembered
    try:
        assert session.resumed
        term = run_repl(session, "y", "what did I ask?")
    finally:
        session.close()
    out = term.text
    assert "continuing the session" in out and "The last session stopped at a question" in out
    assert Budget(RunDir(run_dir)).status().used == 1 and "Measured " in out
    # the new process's model saw the whole conversation, both user messages included
    assert second.agent_requests[0].messages[1].content == "please measure good.py"
    assert "You asked me 2 things." in out

    with pytest.raises(ValueError, match="holds a chat about"):  # one conversation, one problem
        other = tmp_path / "other.py"
        other.write_text(textwrap.dedent(SMALL_PROBLEM).replace("[1.5]", "[2.5]"))
        open_chat(str(other), run_dir, device="cpu", model=None)


def test_slash_commands_work_without_a_model(tmp_path, problem, pool, monkeypatch):
    for name in ("KSCOUT_PROVIDER", "KSCOUT_MODEL", "KSCOUT_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)  # no ./kscout.toml here
    session = open_chat("problem.py", "run", device="cpu", budget=2, harness=QUICK, pool=pool)  # model: whatever is configured
    try:
        assert session.model is None
        term = run_repl(session, "/budget", "/predict good.py", "/measure good.py", "/measure good.py", "/history", "/best",
                        "/diff reference good.py", "/diff good.py", "/frobnicate", "/measure good.py --agian", "/forecasts",
                        "make it faster", "/quit", "/budget")
    finally:
        session.close()
    out = term.text
    # the uninformative forecast was kept beside the measurement, and there is nothing in it to score
    assert "1 forecast(s) so far, none followed by a usable measurement" in out
    assert "Slash-command mode" in out and "KSCOUT_PROVIDER" in out  # says how to enable the model
    assert "budget: 0 of 2 used, 2 left" in out
    assert "no forecast (none)" in out and "no LLM provider" in out  # honest: no number made up
    assert out.count("(measured)") == 2 and "already measured in this run" in out  # the second one was free
    assert Budget(RunDir(tmp_path / "run")).status().used == 1
    assert "good.py" in out and "measure  measured" in out  # /history
    assert "best: " in out and "over the reference" in out
    assert "-class Model(nn.Module):" in out and "+class ModelNew(nn.Module):" in out  # /diff
    assert "usage: /diff A B" in out and "unknown command /frobnicate" in out
    assert "usage: /measure FILE [--again]" in out  # a misspelt flag is not read as no flag
    assert "only slash commands work" in out
    assert term.prompts.count("you> ") == 13  # /quit ended the session before the last line


def test_tool_errors_and_provider_failures_are_shown_and_the_session_goes_on(tmp_path, problem):
    agent = Agent(
        call("measure", 1, candidate="missing.py"),
        call("write_candidate", 2, name="../escape", source="x = 1"),
        call("write_candidate", 3, name="nomodel", source="x = 1\n"),
        say("Those did not work."),
        LLMUnavailableError("anthropic at https://api.anthropic.com failed 5 time(s); last error: HTTP 529"),
    )
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=2, model=model_for(agent))
    try:
        term = run_repl(session, f"/predict {tmp_path / 'good.py'}", "go", "again", "/budget")
    finally:
        session.close()
    out = term.text
    # what the user did by hand reaches the model with the next message
    assert agent.agent_requests[0].messages[-1].content.startswith(
        f"[Since your last reply the user ran: /predict {tmp_path / 'good.py'} -> forecast P(faster)=")
    assert "no such file" in out and "not usable" in out and "ModelNew" in out
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "run" / "candidates" / "nomodel.py").exists()
    assert "LLMUnavailableError" in out and "HTTP 529" in out
    assert "budget: 0 of 2 used, 2 left" in out  # the slash command after the failure still ran
    errors = [m for m in agent.agent_requests[3].messages if m.role == "tool"]
    assert len(errors) == 3 and all(m.is_error for m in errors)


def test_a_turn_that_keeps_calling_tools_is_stopped(tmp_path, problem):
    agent = Agent(*[call("budget_status", i) for i in range(3)], say("Sorry."))
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=1, model=model_for(agent),
                        settings=ChatSettings(max_tool_rounds=2))
    try:
        term = run_repl(session, "loop", "are you done?")
    finally:
        session.close()
    assert "still calling tools after 2 rounds" in term.text
    # the unanswered calls got a 'not run' result, so the next turn's conversation is valid
    assert "not run: this turn already took 2 tool rounds" in agent.agent_requests[3].messages[-2].content
    assert "Sorry." in term.text


def _configure_local_server(server, tmp_path, monkeypatch) -> None:
    """What a user of a local OpenAI-compatible server sets: provider, address and model, no key."""
    monkeypatch.setenv("KSCOUT_PROVIDER", "openai-compatible")
    monkeypatch.setenv("KSCOUT_BASE_URL", server.openai_base_url)
    monkeypatch.setenv("KSCOUT_MODEL", "local-coder")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)


def test_the_real_openai_sdk_against_a_local_server(tmp_path, problem, fake_llm_server, monkeypatch):  # noqa: F811
    _configure_local_server(fake_llm_server, tmp_path, monkeypatch)
    fake_llm_server.script(reply_tool_call("budget_status", {}), reply_text("You have 2 measurements left."))
    session = open_chat("problem.py", "run", device="cpu", budget=2)
    try:
        term = run_repl(session, "how much budget is left?")
    finally:
        session.close()
    assert "tool budget_status()" in term.text and "You have 2 measurements left." in term.text
    second = fake_llm_server.requests[1].body
    assert second["model"] == "local-coder" and second["messages"][0]["role"] == "system"
    tool_reply = next(m for m in second["messages"] if m["role"] == "tool")
    assert json.loads(tool_reply["content"]) == {"cap": 2, "used": 0, "reserved": 0, "remaining": 2}
    assert {t["function"]["name"] for t in second["tools"]} >= {"measure", "predict", "write_candidate"}
    # tokens as the server reported them (11 in, 7 out per reply), shown and persisted in the run directory
    assert "LLM this turn: 36 tokens" in term.text
    usage = json.loads(RunDir(tmp_path / "run").get_meta("chat_llm_usage"))
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (2, 22, 14)


def test_a_retried_provider_error_is_one_dim_line_of_the_conversation(tmp_path, problem, fake_llm_server, monkeypatch):  # noqa: F811
    import logging

    from kernelscout.agent.cli_chat import log_to_console
    from fake_llm_server import server_error

    _configure_local_server(fake_llm_server, tmp_path, monkeypatch)
    fake_llm_server.script(server_error(503), reply_text("Back again."))
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    session = open_chat("problem.py", "run", device="cpu", budget=2)
    term = Terminal("hello")
    log_to_console(term.console)  # what `kscout chat` does once the session is open
    try:
        logging.getLogger("mcp.server").info("Processing request of type ListToolsRequest")  # the SDK's chatter
        ChatREPL(session, term.input, term.console).run()
    finally:
        session.close()
        root.handlers[:], root.level = saved
    lines = [line for line in term.text.splitlines() if "LLM call attempt 1 failed" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: LLM call attempt 1 failed") and "retrying" in lines[0]
    assert "Back again." in term.text and "ListToolsRequest" not in term.text


def test_kscout_chat_command_starts_in_slash_command_mode(tmp_path, problem, monkeypatch):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    for name in ("KSCOUT_PROVIDER", "KSCOUT_MODEL", "KSCOUT_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["chat", "problem.py", "--run-dir", "run", "--budget", "4", "--device", "cpu"],
                                input="/budget\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "Slash-command mode" in result.output and "budget: 0 of 4 used, 4 left" in result.output
    assert "kscout chat --run-dir run" in result.output

    missing = CliRunner().invoke(app, ["chat", "nope.py"])
    assert missing.exit_code == 2 and "no such problem file" in missing.output
    assert os.path.exists(tmp_path / "run" / "checkpoints.db")


def test_kscout_chat_with_unusable_llm_settings_says_so_and_not_that_none_are_configured(tmp_path, problem, monkeypatch):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    monkeypatch.setenv("KSCOUT_PROVIDER", "anthropic")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    result = CliRunner().invoke(app, ["chat", str(problem), "--run-dir", str(tmp_path / "run"), "--device", "cpu"], input="/quit\n")
    assert result.exit_code == 0, result.output
    assert "Slash-command mode: its LLM settings cannot be used" in result.output and "needs an API key" in result.output
    assert "no LLM is configured" not in result.output


@pytest.mark.parametrize("flags, said", [(["--timeout", "-5"], "--timeout: input should be greater than 0"),
                                          (["--max-usd", "-1"], "--max-usd: input should be greater than or equal to 0"),
                                          (["--provider", "bogus"], "--provider: input should be 'anthropic', 'openai'")])
def test_kscout_chat_with_a_bad_setting_names_the_flag_and_leaves_no_run_directory(tmp_path, problem, flags, said):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    result = CliRunner().invoke(app, ["chat", str(problem), "--run-dir", str(tmp_path / "run"), "--device", "cpu", *flags])
    assert result.exit_code == 2 and said in result.output, result.output
    assert "pydantic" not in result.output and not (tmp_path / "run").exists()


def test_a_turn_cut_off_in_the_middle_of_a_tool_is_finished_by_the_next_session(tmp_path, problem, pool, monkeypatch):
    run_dir = str(tmp_path / "run")
    first = Agent(call("measure", 1, candidate=str(tmp_path / "good.py")))
    session = open_chat(str(problem), run_dir, device="cpu", budget=2, harness=QUICK, pool=pool, model=model_for(first),
                        settings=ChatSettings(confirm=False))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process stopped while the measurement was being set up

    monkeypatch.setattr(session.toolbox, "measure", killed)
    try:
        term = run_repl(session, "measure good.py")
    finally:
        session.close()
    assert "interrupted: the turn stopped" in term.text
    assert Budget(RunDir(run_dir)).status().used == 0

    second = Agent(lambda req: say(f"Measured {last_tool_result(req)['speedup']:.2f}x."))
    session = open_chat(None, run_dir, device="cpu", harness=QUICK, pool=pool, model=model_for(second),
                        settings=ChatSettings(confirm=False))
    try:
        term = run_repl(session)
    finally:
        session.close()
    assert "Finishing the turn the last session left" in term.text and "Measured " in term.text
    assert Budget(RunDir(run_dir)).status().used == 1


def test_a_new_message_after_an_interrupted_turn_gives_the_model_a_valid_conversation(tmp_path, problem, monkeypatch):
    agent = Agent(call("measure", 1, candidate=str(tmp_path / "good.py")), say("Fine, leaving it."))
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=1, model=model_for(agent),
                        settings=ChatSettings(confirm=False))

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(session.toolbox, "measure", ctrl_c)
    try:
        term = run_repl(session, "measure good.py", "never mind")
    finally:
        session.close()
    assert "interrupted: the turn stopped" in term.text and "Fine, leaving it." in term.text
    # the call that never finished is answered before the new message, as both providers require
    convo = agent.agent_requests[1].messages
    assert [m.role for m in convo[-3:]] == ["assistant", "tool", "user"]
    assert convo[-2].tool_call_id == "call_measure_1" and "interrupted" in convo[-2].content
    assert Budget(RunDir(tmp_path / "run")).status().used == 0


def test_a_speedup_from_a_void_timing_is_not_shown_as_measured():
    from rich.console import Console

    from kernelscout.agent.cli_chat import _measurement

    def shown(**m) -> str:
        console = Console(record=True, width=200)
        console.print(_measurement({"status": "ok", "correct": True, "charged": True, "runtime_ms": 1.0, "ref_runtime_ms": 2.74, **m}))
        return console.export_text()

    valid = shown(speedup=2.74, timing_valid=True)
    assert "2.740x (measured)" in valid
    busy = shown(speedup=2.74, timing_valid=False, timing_invalid_reason="the machine was busy: ...")
    assert "(measured)" not in busy and "does not count" in busy and "the machine was busy" in busy


def test_ctrl_c_at_the_idle_prompt_leaves_as_quit_does_and_resume_points_back_at_chat(tmp_path, problem, pool):
    import subprocess
    import sys

    class CtrlC(Terminal):
        def input(self, prompt: str) -> str:
            if not self.lines:
                raise KeyboardInterrupt
            return super().input(prompt)

    run_dir = tmp_path / "run"
    session = open_chat(str(problem), str(run_dir), device="cpu", budget=2, harness=QUICK, pool=pool, model=None)
    term = CtrlC("/budget")
    try:
        ChatREPL(session, term.input, term.console).run()
    finally:
        session.close()
    assert f"continue it with `kscout chat --run-dir {run_dir}`" in " ".join(term.text.split())  # as rich wrapped it
    # a user who reaches for `kscout resume` is told which command continues this folder
    resumed = subprocess.run([sys.executable, "-m", "kernelscout", "resume", str(run_dir)], capture_output=True, text=True)
    assert resumed.returncode != 0
    assert f"kscout chat --run-dir {run_dir}" in " ".join(resumed.stderr.split()), resumed.stderr


def test_an_empty_or_cut_off_reply_is_said_to_be_one(tmp_path, problem, pool):
    cut = ChatResponse(text="The fused kernel should first load the row into", stop_reason="max_tokens",
                       usage=Usage(input_tokens=120, output_tokens=4096))
    agent = Agent(ChatResponse(text="", usage=Usage(input_tokens=120, output_tokens=0)), cut)
    session = open_chat(str(problem), str(tmp_path / "run"), device="cpu", budget=2, harness=QUICK, pool=pool, model=model_for(agent))
    try:
        out = " ".join(run_repl(session, "one", "two").text.split())
    finally:
        session.close()
    assert "(the model returned an empty reply; ask again, or rephrase)" in out
    assert "load the row into" in out and "cut off at its output limit" in out


def test_a_token_cap_covers_the_chat_across_restarts_and_its_refusal_says_how_to_go_on(tmp_path, problem, fake_llm_server, monkeypatch):  # noqa: F811
    from kernelscout.agent.llm_config import LLMConfig

    _configure_local_server(fake_llm_server, tmp_path, monkeypatch)
    fake_llm_server.script(reply_text("Hello."))

    def chat(line: str, **caps) -> str:
        session = open_chat("problem.py", "run", device="cpu", budget=2, llm_flags=LLMConfig(**caps) if caps else None)
        try:
            return " ".join(run_repl(session, line).text.split())
        finally:
            session.close()

    def stored_cap() -> int:
        return json.loads(RunDir(tmp_path / "run").get_meta("chat_llm_usage"))["max_tokens_total"]

    said = chat("hi", max_tokens_total=50)  # no room for one call
    assert "LLM token cap reached: 0 of 50 tokens used" in said and "BudgetExceeded" not in said
    # the command offered continues the chat under a cap with room for the call refused
    next_call = int(re.search(r"the next call to local-coder could use up to (\d+)", said).group(1))
    offered = int(re.search(r"`kscout chat --run-dir run --max-tokens (\d+)`", said).group(1))
    assert next_call <= offered < 2 * next_call
    assert "LLM token cap reached" in chat("hi")  # continued without the flag: the cap is still in force
    assert stored_cap() == 50 and not fake_llm_server.requests  # refused before anything was sent
    assert "Hello." in chat("hi", max_tokens_total=offered)
    assert stored_cap() == offered
