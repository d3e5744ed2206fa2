"""`kscout serve`: kernelscout's tools as an MCP server, for an IDE agent.

Kept out of agent/cli.py; cli.py calls `register(app)`. Also runnable on its own as
`python -m kernelscout.agent.cli_serve serve ...`. Everything it logs goes to stderr: in stdio mode,
stdout carries the protocol and nothing else.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from kernelscout.agent.cli_errors import interrupted_code, validation_message
from kernelscout.agent.search_config import help_default, search_config
from kernelscout.sandbox import harness_defaults

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TOKEN_ENV = "KSCOUT_MCP_TOKEN"  # same as kernelscout.tools.mcp_server.TOKEN_ENV, without importing the SDK for --help


def register(app: typer.Typer) -> None:
    """Add the `serve` command to a typer app."""

    @app.command("serve")
    def serve(
        run_dir: Optional[str] = typer.Option(None, "--run-dir", help="run directory whose budget ledger the tools share (default runs/scratch)"),
        budget: Optional[int] = typer.Option(
            None, help="measurement cap to set on the run directory (default: keep its cap; an uncapped one gets 20 more than it has used)"
        ),
        device: Optional[str] = typer.Option(None, help="auto, cpu, cuda, cuda:N or an installed device plugin's name (tools may pick another device) "
                                             + help_default("device")),
        http: bool = typer.Option(False, "--http", help="serve streamable HTTP instead of stdio"),
        host: str = typer.Option("127.0.0.1", help="HTTP: interface to listen on; anything but loopback needs --allow-remote and a token"),
        port: int = typer.Option(8000, min=0, max=65535, help="HTTP: port"),
        path: str = typer.Option("/mcp", help="HTTP: endpoint path"),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="HTTP: allow listening beyond loopback (needs a token)"),
        token: Optional[str] = typer.Option(
            None, help=f"HTTP: bearer token every request must carry (prefer the {TOKEN_ENV} environment variable: a flag shows in ps)"
        ),
        timeout: float = typer.Option(harness_defaults.TIMEOUT_S, help="seconds allowed for running a candidate (checks and timing)"),
        timing_budget: float = typer.Option(harness_defaults.TIMING_BUDGET_S, "--timing-budget", help="timed seconds to aim for, both sides together"),
        log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR (logs go to stderr)"),
    ) -> None:
        """Serve measure, predict, budget_status, sol_bounds, list_candidates, best_candidate and forecast_check over MCP (stdio by default)."""
        device = search_config(False).pick("device", device)
        run(run_dir=run_dir, budget=budget, device=device, http=http, host=host, port=port, path=path, allow_remote=allow_remote,
            token=token, timeout=timeout, timing_budget=timing_budget, log_level=log_level)


def run(run_dir: Optional[str] = None, budget: Optional[int] = None, device: str = "auto", http: bool = False, host: str = "127.0.0.1",
        port: int = 8000, path: str = "/mcp", allow_remote: bool = False, token: Optional[str] = None,
        timeout: float = harness_defaults.TIMEOUT_S, timing_budget: float = harness_defaults.TIMING_BUDGET_S, log_level: str = "INFO") -> None:
    try:
        from kernelscout.tools import mcp_server
    except ImportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    from pydantic import ValidationError

    from kernelscout.sandbox.harness import HarnessConfig
    from kernelscout.sandbox.problem import InputFileError
    from kernelscout.tools.measure import DEFAULT_RUN_DIR, resolve_device, search_in

    if log_level.upper() not in LOG_LEVELS:
        typer.echo(f"error: --log-level {log_level}: use one of {', '.join(LOG_LEVELS)}", err=True)
        raise typer.Exit(2)
    try:  # before anything is written into the run directory
        harness = HarnessConfig(timeout_s=timeout, timing_budget_s=timing_budget)
    except ValidationError as exc:
        typer.echo(f"error: {validation_message(exc, {'timeout_s': '--timeout', 'timing_budget_s': '--timing-budget'})}", err=True)
        raise typer.Exit(2)
    mcp_server.configure_logging(log_level.upper())
    log = mcp_server.log
    token = mcp_server.resolve_token(token)
    if http:
        try:
            mcp_server.check_bind(host, allow_remote, token)
        except mcp_server.ServeConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
    directory = str(run_dir or DEFAULT_RUN_DIR)
    try:
        resolve_device(device)  # a device this machine lacks is said now, not at the client's first tool call
    except InputFileError as exc:
        typer.echo(f"error: --device {exc}", err=True)
        raise typer.Exit(2)
    try:
        status = mcp_server.ensure_cap(directory, budget)
        server = mcp_server.build_server(directory, device=device, harness=harness)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    log.info("budget of %s: %d used of %s, %s left", directory, status.used, status.cap, status.remaining)
    search = search_in(Path(directory))
    if search:  # its views work; its measure tool refuses, and says why
        log.warning("%s holds %s: this server reads it (budget_status, list_candidates, best_candidate, forecast_check) "
                    "but measures nothing there; serve another --run-dir to measure", directory, search)
    if not http:
        # An IDE stops a stdio server with SIGTERM, possibly with stdin still open, where unwinding would wait for the
        # thread blocked reading it: stop the idle workers and leave. The ledger is built for this (a reservation left
        # by a measurement in flight counts as spent; a busy worker exits when its pipe to this process closes).
        signal.signal(signal.SIGTERM, lambda signum, frame: _exit_now(server, signum))
    mcp_server.serve(server, http=http, host=host, port=port, token=token, allow_remote=allow_remote, path=path,
                     log_level=log_level.upper())


def _exit_now(server, signum: int) -> None:
    try:
        server.close_now()
    finally:
        os._exit(128 + signum)


def _standalone() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)

    @app.callback()
    def _root() -> None:
        """kernelscout's MCP server (the same as `kscout serve`)."""

    register(app)
    app()


if __name__ == "__main__":
    try:
        _standalone()
    except KeyboardInterrupt:
        sys.exit(interrupted_code())
