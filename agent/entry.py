"""The `kscout` command's entry point, free of imports so that a stop while the CLI loads (torch, LangGraph:
a second or two) ends quietly, as a stop later does, instead of in a traceback from an import or a crash.

Ctrl-C or SIGTERM is held back while the heavy modules load and acted on once they have: an interrupt
that lands inside torch's import, where C++ code calls back into Python, aborted the process on Python 3.11
("terminate called after throwing an instance of 'pybind11::error_already_set'", exit -6) and on 3.12 made it
die by SIGINT (exit -2) after saying "interrupted", about one stop in twenty at 2.8 to 2.9 s after start on
the 2-core VM. Held back, the stop comes a second or two late, and always ends in "interrupted" with 130 or 143.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Iterable

# commands that never import torch: no reason to make them wait for it
_LIGHT_COMMANDS = {"show", "budget", "sol"}
_STOPS = {signal.SIGINT, signal.SIGTERM}


def _stopped_while_loading(signum: int, frame: object) -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(128 + signum)  # replaced by the CLI's own handler once it has loaded


def load_holding_stops(modules: Iterable[str]) -> None:
    """Import `modules` with SIGINT and SIGTERM only noted while they load; a stop that came meanwhile is acted on
    once they have, where raising is safe. (Noted by a handler, not blocked: a mask is per thread, and the kernel
    hands a process's signal to any thread that does not block it.)"""
    noted: list[int] = []
    held = [sig for sig in _STOPS if signal.getsignal(sig) != signal.SIG_IGN]  # an ignored stop stays ignored
    before = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum)) for sig in held}
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if noted:
        handler = before[noted[0]]
        if callable(handler):
            handler(noted[0], None)  # the usual handlers raise here
        raise KeyboardInterrupt if noted[0] == signal.SIGINT else SystemExit(128 + noted[0])


# what a command that searches or measures imports besides the CLI: loaded here, while a stop is held back, since a
# Ctrl-C inside one of these imports (C extensions calling back into Python) kills the process instead of ending it
# quietly. The CLI itself no longer imports them (so that `show`, `budget` and `--help` answer in half a second).
_HEAVY_MODULES = ["torch", "kernelscout.agent.graph", "kernelscout.tools.surrogates.learned"]


def _modules_for(argv: list[str]) -> list[str]:
    words = argv[1:]
    light = not words or words[0] in _LIGHT_COMMANDS or any(w in ("--help", "-h", "--version") for w in words)
    return ["kernelscout.agent.cli"] + ([] if light else _HEAVY_MODULES)


def main() -> None:
    signal.signal(signal.SIGTERM, _stopped_while_loading)
    try:
        load_holding_stops(_modules_for(sys.argv))
        from kernelscout.agent.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
