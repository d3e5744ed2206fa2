"""How a command fails: under `--json` a script reading stdout gets `{"status": "failed", "message": ...}`
whatever went wrong; otherwise the person gets a red error on stderr. Exit code 2 either way, as for a
usage error. `optimize`, `resume`, `run`, `eval-surrogate` and `bench search` all fail this way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console


def fail(message: str, as_json: bool, code: int = 2) -> None:
    if as_json:
        typer.echo(json.dumps({"status": "failed", "message": message}))
    else:
        Console(stderr=True).print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
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
