"""Errors under `--json`: a script that reads stdout gets JSON whatever happened.

`kscout optimize --json` already answers a failure with `{"status": "failed", "message": ...}`; the
commands whose input errors are Typer usage errors use `json_errors` to answer the same way (exit 2,
as for a usage error, and the message on stderr as well, for the person watching).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console


def fail_json(message: str, as_json: bool, code: int = 2) -> None:
    """Say what went wrong (stdout JSON under --json, stderr always) and exit with `code`."""
    if as_json:
        typer.echo(json.dumps({"status": "failed", "message": message}))
    Console(stderr=True).print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False, markup=True)
    raise typer.Exit(code)


@contextmanager
def json_errors(as_json: bool) -> Iterator[None]:
    """Turn a usage error raised inside the block into the JSON answer when `as_json`; otherwise let
    Typer print its usual usage message."""
    try:
        yield
    except typer.BadParameter as exc:
        if not as_json:
            raise
        hint = exc.param_hint if isinstance(exc.param_hint, str) else None
        fail_json(f"{hint}: {exc.message}" if hint else exc.message, as_json)
