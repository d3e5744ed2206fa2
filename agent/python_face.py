"""`kernelscout.optimize`, `resume` and `check_forecasts`: the search and its scoring from Python, worded for Python.

The search's checks (agent/runner.py) word their errors for the command line, where a setting is a flag:
"--confirm 3 leaves nothing of --budget 3". A script gave `confirm=3, budget=3`, and a flag it never typed
would send its author looking for one; so these wrappers reword the same message with the keywords,
`confirm=3 leaves nothing of budget=3`. Commands to run in a shell, written in backticks, stay as written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from kernelscout.agent.runner import OptimizeError, resume_search, start_search
from kernelscout.agent.session import OptimizeResult
from kernelscout.tools.archive import Archive
from kernelscout.tools.forecast_check import ForecastCheck, check_forecasts as _check_forecasts
from kernelscout.tools.rundir import RunDir

# flags whose keyword is not the flag's name with dashes as underscores
_KEYWORD = {"max-device-seconds": "max_device_s", "max-tokens": "max_llm_tokens"}
_CHOICE_WORDS = {"none", "all", "auto", "tuner", "learned", "llm"}  # values that read like words
_FLAG = re.compile(r"--([a-z][a-z-]*)(?: ([^\s;,]+?)(?=[:;,.]?(?:\s|$)))?")


def _value(token: str) -> Optional[str]:
    """`token` as a Python literal when it is the flag's value (a number, a path, a placeholder such as FILE, a
    choice), else None: in "--start gives a kernel file" the word after the flag is the sentence's verb."""
    if re.fullmatch(r"-?\d+(\.\d+)?", token):
        return token
    if token in _CHOICE_WORDS or token.isupper() or any(c in token for c in "/.0123456789_"):
        return repr(token)
    return None


def python_words(message: str) -> str:
    """`message` with each `--flag [VALUE]` outside backticks written as the keyword a Python caller gives."""

    def keyword(match: re.Match) -> str:
        name = _KEYWORD.get(match.group(1), match.group(1).replace("-", "_"))
        value = _value(match.group(2)) if match.group(2) else None
        if value is None:
            return name + (f" {match.group(2)}" if match.group(2) else "")
        return f"{name}={value}"

    parts = message.split("`")
    return "`".join(part if i % 2 else _FLAG.sub(keyword, part) for i, part in enumerate(parts))


def _reworded(exc: OptimizeError) -> OptimizeError:
    exc.args = (python_words(str(exc)),) + exc.args[1:]
    return exc


def optimize(problem: Optional[str] = None, *, space: Optional[str] = None, budget: int = 10, **options: Any) -> OptimizeResult:
    """`kscout optimize` from Python: a problem file or folder, or `space=` a recorded space; the other options
    are start_search's keywords (agent/runner.py), named as the CLI names them (`run_dir`, `confirm`, ...).

    kscout.toml's `[search]` table is not read here: a script states its settings, so the same call gives
    the same search on any machine. `search_defaults().pick(name, None)` (kernelscout.agent.search_config) gives a
    file's value where a script wants it."""
    for name in ("start", "history", "warm_start", "rewrites"):  # one path (or name) given bare, as a script naturally writes it
        if isinstance(options.get(name), (str, Path)):
            options[name] = [str(options[name])]
    try:
        return start_search(problem=problem, space=space, budget=budget, **options)
    except OptimizeError as exc:
        raise _reworded(exc)


def resume(run_dir: str | Path, quiet: bool = False, **limits: Any) -> OptimizeResult:
    """`kscout resume` from Python; `limits` are resume_search's (`max_usd`, `max_wall`, `patience`, ...)."""
    try:
        return resume_search(str(run_dir), quiet=quiet, **limits)
    except OptimizeError as exc:
        raise _reworded(exc)


def check_forecasts(run: str | Path | RunDir | Archive, bins: int = 5) -> ForecastCheck:
    """How well a run's forecasts matched its measurements (`kscout show`'s calibration section), from a run
    directory's path as a notebook has it; the folder is read, never written."""
    if not isinstance(run, Archive):
        from kernelscout.agent.run_view import open_run

        run = Archive(run if isinstance(run, RunDir) else open_run(run))
    return _check_forecasts(run, bins=bins)
