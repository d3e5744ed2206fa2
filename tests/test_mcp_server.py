"""The MCP server (`kscout serve`): in-process, over a real stdio subprocess, and over HTTP with a token.

Needs the optional `mcp` extra (the official MCP SDK, v2); skipped without it.
"""

from __future__ import annotations

import json
import os
import sys
import shutil
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the MCP server needs the mcp extra (mcp>=2.3)")

from mcp import Client, StdioServerParameters, stdio_client  # noqa: E402

from kernelscout.agent.llm import ScriptedChatModel  # noqa: E402
from kernelscout.tools.mcp_server import (  # noqa: E402
    ServeConfigError,
    build_server,
    check_bind,
    ensure_cap,
    http_app,
    is_loopback,
)
from kernelscout.tools.predict import Forecast  # noqa: E402
from kernelscout.tools.schema import BudgetStatus, Measurement  # noqa: E402

from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM  # noqa: E402

TOOLS = {"predict", "measure", "budget_status", "sol_bounds", "list_candidates", "best_candidate", "forecast_check"}

# Distinct files (distinct sha, so each costs a measurement), all correct.
OTHER_CANDIDATE = GOOD_CANDIDATE.replace("return torch.relu(x * self.scale + y) + 0.5 * x",
                                         "return torch.clamp_min(x * self.scale + y, 0.0) + 0.5 * x")
THIRD_CANDIDATE = GOOD_CANDIDATE.replace("return torch.relu(x * self.scale + y) + 0.5 * x",
                                         "return torch.relu(torch.addcmul(y, x, torch.full_like(x, self.scale))) + x * 0.5")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, text in (("problem", SMALL_PROBLEM), ("a", GOOD_CANDIDATE), ("b", OTHER_CANDIDATE), ("c", THIRD_CANDIDATE)):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(text))
        out[name] = str(path)
    return out


def test_in_process_client_measures_under_the_budget(tmp_path, files, pool):
    server = build_server(str(tmp_path / "run"), device="cpu", budget=1, harness=QUICK, pool=pool, chat_model=None)

    async def session():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert TOOLS <= set(tools)
            assert tools["measure"].output_schema["title"] == "Measurement"
            # what a client may approve without asking: everything but measure (budget) and predict (an LLM call)
            read_only = {name for name, t in tools.items() if t.annotations and t.annotations.read_only_hint}
            assert read_only == TOOLS - {"measure", "predict"}
            # nothing lets the agent move the ledger or weaken the harness
            assert set(tools["measure"].input_schema["properties"]) == {"problem", "candidate", "device", "again"}

            status = await client.call_tool("budget_status", {})
            assert not status.is_error
            assert BudgetStatus.model_validate(status.structured_content) == BudgetStatus(cap=1, used=0, reserved=0, remaining=1)

            first = await client.call_tool("measure", {"problem": files["problem"], "candidate": files["a"]})
            assert not first.is_error, first.content
            m = Measurement.model_validate(first.structured_content)
            assert m.status.value == "ok" and m.correct and m.charged and m.speedup and m.measurement_id

            again = await client.call_tool("measure", {"problem": files["problem"], "candidate": files["a"]})
            assert not again.is_error and again.structured_content["charged"] is False  # recorded: free

            spent = await client.call_tool("measure", {"problem": files["problem"], "candidate": files["b"]})
            assert spent.is_error and "budget" in spent.content[0].text

            missing = await client.call_tool("measure", {"problem": files["problem"], "candidate": str(tmp_path / "nope.py")})
            assert missing.is_error and "no such file" in missing.content[0].text

            listed = (await client.call_tool("list_candidates", {})).structured_content
            assert [(e["origin"], e["path"], e["state"]) for e in listed["candidates"]] == [("measure", files["a"], "measured")]
            mistyped = await client.call_tool("list_candidates", {"state": "mesured"})  # was an empty list, as if none were
            assert mistyped.is_error and "'measured'" in mistyped.content[0].text
            best = (await client.call_tool("best_candidate", {"problem": files["problem"]})).structured_content
            assert best["found"] and best["best"]["speedup"] == m.speedup

            forecast = await client.call_tool("predict", {"problem": files["problem"], "candidate": files["b"]})
            f = Forecast.model_validate(forecast.structured_content)
            assert not f.informative and "no LLM provider" in f.rationale  # honest, never made up
            orphan = await client.call_tool("predict", {"problem": files["problem"], "candidate": files["a"], "parent": files["b"]})
            assert orphan.is_error and "measure it first" in orphan.content[0].text  # as with a provider (docs/mcp.md)

            bad = await client.call_tool("sol_bounds", {"problem": str(tmp_path / "nope.py")})
            assert bad.is_error and "no such file" in bad.content[0].text

            final = BudgetStatus.model_validate((await client.call_tool("budget_status", {})).structured_content)
            assert (final.used, final.remaining) == (1, 0)

    anyio.run(session)


def test_predict_uses_the_llm_surrogate_when_one_is_configured(tmp_path, files):
    from kernelscout.tools.surrogates.distribution import DEFAULT_EDGES

    k = len(DEFAULT_EDGES) + 1
    probs = [0.0] * (k - 4) + [0.1, 0.2, 0.4, 0.3]  # mass on the faster bins
    reply = json.dumps({"probs": probs, "rationale": "fuses the two elementwise passes"})
    model = ScriptedChatModel([reply] * 4)  # two forecasts, each with its self-critique
    server = build_server(str(tmp_path / "run"), device="cpu", chat_model=model)
    forecasts = []

    async def session():
        async with Client(server) as client:
            result = await client.call_tool("predict", {"problem": files["problem"], "candidate": files["a"]})
            f = Forecast.model_validate(result.structured_content)
            forecasts.append(f)
            assert f.informative and f.surrogate == "llm" and len(f.bin_probs) == k and f.p_faster > 0.5
            unmeasured = await client.call_tool("predict", {"problem": files["problem"], "candidate": files["b"], "parent": files["a"]})
            assert unmeasured.is_error and "measure it first" in unmeasured.content[0].text

    anyio.run(session)
    assert len(model.requests) == 2  # a forecast and its self-critique

    # once the forecast candidate is measured, its outcome becomes a measured example for later forecasts
    from kernelscout.sandbox.problem import load_candidate, load_problem
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    psha, csha = load_problem(files["problem"]).sha, load_candidate(files["a"]).sha
    rec = MeasurementRecord(key="k", problem_sha=psha, candidate_sha=csha, problem_path=files["problem"], candidate_path=files["a"], device="cpu")
    m = ledgered(server.run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=1.4,
                                                      runtime_ms=1 / 1.4, ref_runtime_ms=1.0))
    server._observe(m)
    assert len(server._surrogate._measured) == 1 and "1.400x" in server._surrogate._measured[0]

    # every predict call is kept beside the measurements: the measured one is now scored, the refused one never was
    check = server.tool_forecast_check()
    assert (check.forecasts, check.scored, check.from_tools) == (1, 1, 1)
    assert check.brier_p_faster == pytest.approx((forecasts[0].p_faster - 1.0) ** 2)  # 1.4x: it was faster

    # asked again about the measured file: the measured number comes beside the forecast, and why this one is not scored
    async def again():
        async with Client(server) as client:
            return (await client.call_tool("predict", {"problem": files["problem"], "candidate": files["a"]})).structured_content

    repeat = anyio.run(again)
    assert repeat["informative"] and repeat["measured_speedup"] == pytest.approx(1.4)
    assert "already measured in this run (1.400x)" in repeat["note"] and "measured again" in repeat["note"]


def _serve_command() -> list[str]:
    """`python -m kernelscout serve` once agent/cli.py registers the command; the module's own entry until then."""
    import typer.main

    from kernelscout.agent.cli import app

    if "serve" in typer.main.get_command(app).commands:
        return [sys.executable, "-m", "kernelscout", "serve"]
    return [sys.executable, "-m", "kernelscout.agent.cli_serve", "serve"]


@pytest.mark.slow
def test_stdio_subprocess_spends_the_budget_then_refuses(tmp_path, files):
    run_dir = tmp_path / "run"
    args = _serve_command()
    params = StdioServerParameters(
        command=args[0],
        args=args[1:] + ["--run-dir", str(run_dir), "--budget", "2", "--device", "cpu", "--timing-budget", "0.2", "--timeout", "30"],
        env=dict(os.environ), cwd=str(tmp_path),
    )
    errlog = (tmp_path / "stderr.log").open("w")

    async def session():
        # the SDK's stdio transport, keeping the server's stderr (its logs) for the assertion below
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=300) as client:
            assert TOOLS <= {t.name for t in (await client.list_tools()).tools}
            for name in ("a", "b"):
                result = await client.call_tool("measure", {"problem": files["problem"], "candidate": files[name]})
                assert not result.is_error, result.content
                assert result.structured_content["status"] == "ok" and result.structured_content["charged"]
            refused = await client.call_tool("measure", {"problem": files["problem"], "candidate": files["c"]})
            assert refused.is_error
            assert "budget" in refused.content[0].text and "2 of 2 used" in refused.content[0].text
            status = (await client.call_tool("budget_status", {})).structured_content
            assert (status["used"], status["remaining"]) == (2, 0)

    try:
        anyio.run(session)
    finally:
        errlog.close()
    logs = (tmp_path / "stderr.log").read_text()
    assert "measure" in logs and "budget" in logs  # logs went to stderr (stdout carried only the protocol, or the client would have failed)


def test_http_requires_the_token(tmp_path):
    from starlette.testclient import TestClient

    token = "a-long-enough-test-token-1234"
    app = http_app(build_server(str(tmp_path / "run"), device="cpu", chat_model=None), host="0.0.0.0", token=token)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with TestClient(app) as http:
        refused = http.post("/mcp", json=init, headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        wrong = http.post("/mcp", json=init, headers={**headers, "Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        ok = http.post("/mcp", json=init, headers={**headers, "Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and "kernelscout" in ok.text


def test_http_over_a_real_socket_with_the_sdk_client(tmp_path):
    import httpx2
    import uvicorn

    token = "another-long-test-token-5678"
    app = http_app(build_server(str(tmp_path / "run"), device="cpu", budget=3, chat_model=None), host="127.0.0.1", token=token)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"

    async def session():
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient() as bare:
            assert (await bare.post(url, json={})).status_code == 401
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed:
            async with Client(streamable_http_client(url, http_client=authed)) as client:
                assert TOOLS <= {t.name for t in (await client.list_tools()).tools}
                status = (await client.call_tool("budget_status", {})).structured_content
                assert status["cap"] == 3 and status["remaining"] == 3

    try:
        anyio.run(session)
    finally:
        server.should_exit = True
        thread.join(10)


def test_binding_beyond_loopback_needs_a_flag_and_a_token(tmp_path):
    from typer.testing import CliRunner

    import typer

    from kernelscout.agent.cli_serve import register

    for host in ("127.0.0.1", "localhost", "::1"):
        assert is_loopback(host)
        check_bind(host, allow_remote=False, token=None)
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ServeConfigError, match="allow-remote"):
        check_bind("0.0.0.0", allow_remote=False, token="x" * 32)
    with pytest.raises(ServeConfigError, match="token"):
        check_bind("0.0.0.0", allow_remote=True, token=None)
    check_bind("0.0.0.0", allow_remote=True, token="x" * 32)

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    env = {k: v for k, v in os.environ.items() if k != "KSCOUT_MCP_TOKEN"}
    result = CliRunner().invoke(app, ["serve", "--http", "--host", "0.0.0.0", "--allow-remote", "--run-dir", str(tmp_path / "run")], env=env)
    assert result.exit_code == 2 and "token" in result.output
    assert not (tmp_path / "run").exists()  # refused before touching anything


def test_serve_caps_an_uncapped_run_directory(tmp_path):
    assert ensure_cap(str(tmp_path / "run"), None).cap == 20
    assert ensure_cap(str(tmp_path / "run"), 5).cap == 5
    assert ensure_cap(str(tmp_path / "run"), None).cap == 5  # an existing cap is kept


def test_serve_with_a_budget_below_what_the_folder_has_used_is_refused_and_says_what_would_do(tmp_path):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app
    from kernelscout.tools.budget import Budget
    from kernelscout.tools.rundir import RunDir

    ledger = Budget(RunDir(tmp_path / "run"))
    for key in ("a", "b", "c", "d"):
        ledger.reserve(key)
    result = CliRunner().invoke(app, ["serve", "--budget", "2", "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--budget 2 is below the 4 measurements" in result.output and "--budget 4 or more" in result.output
    assert ledger.cap is None  # was "4 used of 2" before


def test_serve_with_a_negative_budget_is_refused_before_the_run_directory_exists(tmp_path):
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    result = CliRunner().invoke(app, ["serve", "--budget", "-5", "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "cannot be negative" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, said", [(["--timeout", "-5", "--budget", "7"], "--timeout: input should be greater than 0"),
                                          (["--timing-budget", "0"], "--timing-budget: input should be greater than 0"),
                                          (["--log-level", "LOUD"], "--log-level LOUD: use one of DEBUG, INFO"),
                                          (["--http", "--port", "99999"], "99999 is not in the range")])
def test_serve_with_a_bad_setting_names_the_flag_and_leaves_no_run_directory(tmp_path, flags, said):
    # these were a traceback (--port, --log-level) or a pydantic dump after the folder's cap was already set
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    result = CliRunner().invoke(app, ["serve", "--device", "cpu", "--run-dir", str(tmp_path / "run"), *flags])
    assert result.exit_code == 2 and said in " ".join(result.output.replace("│", " ").split()), result.output
    assert "Traceback" not in result.output and "pydantic" not in result.output
    assert not (tmp_path / "run").exists()


def test_an_argument_a_tool_does_not_take_is_refused_and_spends_nothing(tmp_path, files):
    """An agent that believes it can raise the budget or loosen the harness hears that it cannot."""
    server = build_server(str(tmp_path / "run"), device="cpu", budget=3, chat_model=None)

    async def session():
        async with Client(server) as client:
            sent = {"problem": files["problem"], "candidate": files["a"], "budget": 100, "timeout_s": 600}
            refused = await client.call_tool("measure", sent)
            assert refused.is_error
            text = refused.content[0].text
            assert "'budget', 'timeout_s'" in text and "candidate, device, problem" in text and "Nothing was done" in text
            status = BudgetStatus.model_validate((await client.call_tool("budget_status", {})).structured_content)
            assert (status.cap, status.used) == (3, 0)
            assert (await client.call_tool("budget_status", {"cap": 100})).is_error

    anyio.run(session)


def test_candidates_join_the_search_archive_and_direct_measurements(tmp_path, files):
    """No sandbox here: measurements are recorded through the ledger with made-up results."""
    from mcp.server.mcpserver.exceptions import ToolError

    from kernelscout.sandbox.problem import load_problem
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    server = build_server(str(tmp_path / "run"), device="cpu", chat_model=None)
    run, archive = server.run, Archive(server.run)
    problem_sha = load_problem(files["problem"]).sha

    def record(sha: str, speedup: float, problem: str = files["problem"], psha: str = problem_sha) -> Measurement:
        rec = MeasurementRecord(key=f"{psha}-{sha}", problem_sha=psha, candidate_sha=sha, problem_path=problem,
                                candidate_path=f"/k/{sha}.py", device="cpu")
        return ledgered(run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True,
                                                      speedup=speedup, runtime_ms=1 / speedup, ref_runtime_ms=1.0))

    for sha, speedup, suspect in (("s1", 1.5, False), ("s2", 3.0, True)):  # a suspect result is never the best
        cand = archive.add(sha, "class ModelNew: pass\n", 0, "tuner", {}, "", {}, 1)
        archive.record_measurement(cand.id, record(sha, speedup), suspect=suspect)
    archive.add("s3", "class ModelNew: pass\n", 0, "tuner", {}, "", {}, 1)  # proposed, never measured
    record("direct", 1.2)

    listed = server.tool_list_candidates()  # the fastest verified first, then the rest as they came
    assert [(e.origin, e.state, e.speedup) for e in listed.candidates] == [
        ("search", "measured", 1.5), ("measure", "measured", 1.2), ("search", "suspect", None), ("search", "proposed", None)]
    assert listed.candidates[2].measurement.speedup == 3.0  # measured, but never a speedup to quote
    # a long archive stays within an IDE's output limit; the totals still cover everything
    top = server.tool_list_candidates(limit=1)
    assert [e.speedup for e in top.candidates] == [1.5] and top.total == 4 and top.counts["measured"] == 2
    assert [e.state for e in server.tool_list_candidates(state="proposed").candidates] == ["proposed"]
    best = server.tool_best_candidate()
    assert best.found and best.best.origin == "search" and best.best.speedup == 1.5 and "measured once" in best.message
    # served from a copy of the run directory, a search's candidate files are those in the copy
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    copied = build_server(str(tmp_path / "copy"), device="cpu", chat_model=None).tool_best_candidate()
    assert copied.best.path.startswith(str(tmp_path / "copy" / "kernels")) and Path(copied.best.path).is_file()

    # re-measured after the search, a candidate is reported at its re-measurements' median, and a faster-looking
    # candidate measured once no longer counts as the best (as `kscout show` reports it)
    lucky = archive.add("s4", "class ModelNew: pass\n", 0, "tuner", {}, "", {}, 1)
    archive.record_measurement(lucky.id, record("s4", 1.8))
    archive.record_confirmation("confirm-1", archive.by_sha("s1").id, record("s1-again", 1.4), ok=True)
    best = server.tool_best_candidate()
    assert best.best.record.sha == "s1" and best.best.speedup == 1.4 and best.best.confirmed_speedups == [1.4]
    assert "median of 1 re-measurement; the search measured 1.500x" in best.message
    assert best.best.measurement.speedup == 1.5  # the measurement that chose it, as its description says

    other = tmp_path / "other_problem.py"
    other.write_text(textwrap.dedent(SMALL_PROBLEM).replace("0.5 * x", "0.25 * x"))
    record("elsewhere", 9.0, problem=str(other), psha=load_problem(str(other)).sha)
    with pytest.raises(ToolError, match="2 problems"):
        server.tool_best_candidate()
    assert server.tool_best_candidate(problem=files["problem"]).best.speedup == 1.4
    assert server.tool_best_candidate(problem=str(other)).best.speedup == 9.0

    # a speedup on one device says nothing against one on another; and a best under 1 % faster does not stand
    elsewhere = tmp_path / "third_problem.py"
    elsewhere.write_text(textwrap.dedent(SMALL_PROBLEM).replace("0.5 * x", "0.75 * x"))
    third = load_problem(str(elsewhere)).sha
    for sha, speedup, device in (("gpu", 4.0, "cuda:0"), ("cpu", 1.004, "cpu")):
        rec = MeasurementRecord(key=f"{third}-{sha}", problem_sha=third, candidate_sha=sha, problem_path=str(elsewhere),
                                candidate_path=f"/k/{sha}.py", device=device)
        ledgered(run, rec, lambda s=speedup: Measurement(status="ok", correct=True, timing_valid=True, charged=True,
                                                         speedup=s, runtime_ms=1 / s, ref_runtime_ms=1.0))
    with pytest.raises(ToolError, match="on 2 devices .*pass device"):
        server.tool_best_candidate(problem=str(elsewhere))
    assert server.tool_best_candidate(problem=str(elsewhere), device="cuda:0").best.speedup == 4.0
    tie = server.tool_best_candidate(problem=str(elsewhere), device="cpu")
    assert tie.found and "under 1% faster than the reference" in tie.message and "the reference stands" in tie.message


def test_predict_counts_the_reference_as_the_best_so_far(tmp_path, files):
    """A forecast's P(beats best) is against the reference when every measured file was slower, as in the search."""
    from kernelscout.sandbox.problem import load_candidate, load_problem
    from kernelscout.tools.measure import MeasurementRecord, ledgered

    from kernelscout.tools.predict import SurrogateCost

    seen = {}

    class Recording:
        def forecast(self, **kw):
            seen.update(kw)
            return Forecast(surrogate="llm", informative=False, bin_edges=[1.0], bin_labels=["slower", "faster"], bin_probs=[0.5, 0.5],
                            p_faster=0.5, confidence=0.0, rationale="recorded", cost=SurrogateCost(latency_ms=0.0))

    server = build_server(str(tmp_path / "run"), device="cpu", chat_model=ScriptedChatModel([]))
    server._llm_surrogate = lambda model: Recording()
    psha, csha = load_problem(files["problem"]).sha, load_candidate(files["a"]).sha
    rec = MeasurementRecord(key="k", problem_sha=psha, candidate_sha=csha, problem_path=files["problem"], candidate_path=files["a"], device="cpu")
    ledgered(server.run, rec, lambda: Measurement(status="ok", correct=True, timing_valid=True, charged=True, speedup=0.8,
                                                  runtime_ms=1.25, ref_runtime_ms=1.0))
    server.tool_predict(problem=files["problem"], candidate=files["b"])
    assert seen["incumbent_ratio"] == 1.0 and seen["parent_speedup"] == 1.0  # not 0.8: the reference beats that file
