"""The `kscout` command's entry point, free of imports so that a stop while the CLI loads (torch, LangGraph:
a second or two) ends quietly, as a stop later does, instead of in a traceback from an import."""

from __future__ import annotations

import signal
import sys


def _stopped_while_loading(signum: int, frame: object) -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(128 + signum)  # replaced by the CLI's own handler once it has loaded


def main() -> None:
    signal.signal(signal.SIGTERM, _stopped_while_loading)
    try:
        from kernelscout.agent.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
