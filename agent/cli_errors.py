"""How a command fails: under `--json` a script reading stdout gets `{"status": "failed", "message": ...}`
whatever went wrong; otherwise the person gets a red error on stderr. Exit code 2 either way, as for a
usage error. `optimize`, `resume`, `run`, `eval-surrogate` and `bench search` all fail this way.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from pydantic import ValidationError


def fail(message: str, as_json: bool, code: int = 2) -> None:
    if as_json:
        typer.echo(json.dumps({"status": "failed", "message": message}))
    else:
        Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False, emoji=False)  # "[search]" and "cuda:x:" are text
    raise typer.Exit(code)


@contextmanager
def json_errors(as_json: bool) -> Iterator[None]:
    """Under `as_json`, a usage error raised inside the block fails as above; otherwise Typer prints
    its usual usage message."""
    try:
        yield
    except typer.BadParameter as exc:
        if not as_json:
            raise
        hint = exc.param_hint if isinstance(exc.param_hint, str) else None
        fail(f"{hint}: {exc.message}" if hint else exc.message, as_json)


def validation_message(exc: "ValidationError", flags: dict[str, str]) -> str:
    """A pydantic error as the flags the person typed: `--timeout: input should be greater than 0`."""
    return "; ".join(f"{flags.get(str(e['loc'][-1]), e['loc'][-1])}: {e['msg'].lower()}" for e in exc.errors())


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `timeout`, systemd), unwound as Ctrl-C is, so that an overnight log says where the
    run stands and how to go on, as it does after Ctrl-C (a QA pass found it said nothing). A chat session ends on
    it where Ctrl-C only ends the turn."""


_SIGNAL_RECEIVED: Optional[int] = None


def stop_on_sigterm() -> None:
    """From the main thread, before any work. Sandbox pools kill their workers first, then call this handler."""
    def handler(signum: int, frame: Any) -> None:
        global _SIGNAL_RECEIVED
        _SIGNAL_RECEIVED = signum
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


_INTERRUPT_HANDLED = False  # a command said where it stands and how to go on, and exits with interrupted_code()


def interrupted_code() -> int:
    """The exit code of an interrupted command: 128 + 15 after SIGTERM, as the shell reports a process it killed;
    130 after Ctrl-C."""
    global _INTERRUPT_HANDLED
    _INTERRUPT_HANDLED = True
    return 128 + _SIGNAL_RECEIVED if _SIGNAL_RECEIVED else 130


def interrupt_unhandled(code: object) -> bool:
    """Whether an exit with `code` is Typer's for an interrupt no command caught: it ends every KeyboardInterrupt
    (SIGTERM's included) in a bare, silent exit 130."""
    return code == 130 and not _INTERRUPT_HANDLED


_AS_COMMAND = False  # set by the `kscout` entry point: signal handlers are the process's, not a test runner's


def running_as_command() -> None:
    global _AS_COMMAND
    _AS_COMMAND = True


def finish_without_interruption() -> None:
    """From the moment a command's result is complete and stored, through printing it, Click's unwinding and the
    interpreter's teardown (threads joined, modules freed: a few tenths of a second), Ctrl-C is ignored, so the process
    ends with the command's own code. It used not to be: a Ctrl-C then ended `kscout optimize --json` by SIGINT (exit
    -2, nothing said), in a traceback from an atexit hook, or in "interrupted" with 130, after its result was out.
    Ignored, not handled: the interpreter resets a Python handler to the default action early in its teardown, but
    leaves an ignored signal ignored. (SIGTERM and Ctrl-\\ still end it at once.) Only under the `kscout` command:
    a CLI test runner's process keeps its handlers."""
    if _AS_COMMAND:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
