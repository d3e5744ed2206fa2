"""Project and user defaults for searches, from the `[search]` section of the same files as `[llm]`.

A lab sets its device, surrogate, policy and budget once per project (`./kscout.toml`) or per user
(`~/.config/kscout/config.toml`) instead of on every command. Precedence, setting by setting: flags >
`./kscout.toml` > the user's file > built-in defaults. A resumed search keeps the settings it was
started with; the files only shape new searches.

    [search]
    device = "cuda:1"
    surrogate = "learned"
    policy = "tuner"
    budget = 40
    confirm = 2
    workers = 2
    history = ["runs"]   # earlier runs for the learned surrogate's prior, relative to this file

Unknown keys and bad values are errors that name the file, as in `[llm]`: a typo must not be ignored. So is an
unknown section (`[serch]`), whichever of the two readers meets it first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, ValidationError, field_validator

from kernelscout.agent.llm_config import default_config_files, read_config_file
from kernelscout.agent.search_spec import SOLVED_CHANCE
from kernelscout.tools.schema import DEVICE_PATTERN


BUILT_IN_POLICIES = ("tuner", "llm")
BUILT_IN_SURROGATES = ("learned", "llm", "none")  # what a search takes besides `auto` and installed plugins


def policy_choices() -> tuple[str, ...]:
    """What `--policy` and `policy =` take: auto, the built-in policies and those installed packages declare."""
    from kernelscout.tools import plugins

    return ("auto", *BUILT_IN_POLICIES, *plugins.names(plugins.POLICIES, built_in=BUILT_IN_POLICIES))


def surrogate_choices() -> tuple[str, ...]:
    """What `--surrogate` and `surrogate =` take: auto, the built-in surrogates and those installed packages declare."""
    from kernelscout.tools import plugins

    taken = (*BUILT_IN_SURROGATES, "plain-rf")  # plain-rf is eval-surrogate's baseline, not a search's choice
    return ("auto", *BUILT_IN_SURROGATES, *plugins.names(plugins.SURROGATES, built_in=taken))


BUILT_IN: dict[str, Any] = {"device": "auto", "policy": "auto", "surrogate": "auto", "budget": 10, "confirm": None,
                            "workers": None, "proposals": 6, "patience": 0, "history": None,
                            "solved_chance": SOLVED_CHANCE}
"""The defaults when neither a flag nor a file sets a setting (confirm None: `default_confirm` decides)."""


class SearchConfigError(ValueError):
    """A `[search]` section that cannot be used; the message names the file and the setting."""


class SearchDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: Optional[str] = Field(None, description="auto, cpu, cuda, cuda:N or an installed device plugin's name")
    policy: Optional[str] = Field(None, description="auto, tuner, llm or an installed plugin's name")
    surrogate: Optional[str] = Field(None, description="auto, learned, llm, none or an installed plugin's name")
    budget: Optional[StrictInt] = Field(None, ge=1)  # strict: `budget = true` is not a budget of 1
    confirm: Optional[StrictInt] = Field(None, ge=0)
    workers: Optional[StrictInt] = Field(None, ge=1)
    proposals: Optional[StrictInt] = Field(None, ge=1)
    patience: Optional[StrictInt] = Field(None, ge=0)
    solved_chance: Optional[float] = Field(None, ge=0, lt=1, description="on a recorded space, stop once the configurations "
                                           "left have less than this chance, together, of a clear win (0: never)")
    history: Optional[list[str]] = Field(None, description="folders of earlier runs for the learned surrogate's prior "
                                         "(relative to the file that names them), or [\"none\"]")
    sources: dict[str, str] = Field(default_factory=dict, exclude=True, description="setting -> the file it came from")
    _taken: set[str] = PrivateAttr(default_factory=set)  # settings `pick` took from a file, which `note` names

    @field_validator("solved_chance", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1):
            raise ValueError(f"must be a chance from 0 (never stop for it) to under 1, not {value!r}")
        return value

    def pick(self, name: str, flag: Any) -> Any:
        """The flag if given, else this file's setting, else the built-in default."""
        if flag is not None:
            return flag
        value = getattr(self, name)
        if value is None:
            return BUILT_IN[name]
        self._taken.add(name)
        return value

    def note(self) -> str:
        """Which of the settings `pick` took came from a file, for the user to see before a search starts (one a flag
        overrode, or that does not apply, such as a recorded space's setting on a code problem, is not named)."""
        by_file: dict[str, list[str]] = {}
        for name, path in self.sources.items():
            if name not in self._taken:
                continue
            by_file.setdefault(path, []).append(f"{name}={getattr(self, name)}")
        return "; ".join(f"from {path}: {', '.join(items)}" for path, items in by_file.items())


def _section(path: Path) -> dict[str, Any]:
    section = read_config_file(path, SearchConfigError).get("search", {})
    if not isinstance(section, dict):
        raise SearchConfigError(f"{path}: [search] must be a table of settings")
    try:
        SearchDefaults.model_validate(section)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise SearchConfigError(f"invalid [search] section in {path}: {problems}") from None
    return section


def search_defaults(cwd: Optional[Path] = None, env: Optional[Mapping[str, str]] = None) -> SearchDefaults:
    """The `[search]` settings of the project file over those of the user's file."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path in reversed(default_config_files(cwd, env)):  # the user's first, so the project's override it
        for name, value in _section(path).items():
            merged[name] = value
            sources[name] = str(path)
    defaults = SearchDefaults.model_validate(merged)
    for setting, choices in (("policy", policy_choices), ("surrogate", surrogate_choices)):
        value = getattr(defaults, setting)
        if value is not None and value not in choices():
            raise SearchConfigError(f"{setting} {value!r} in {sources[setting]} is not one of {', '.join(choices())} "
                                    "(a plugin's name needs the package that declares it installed)")
    from kernelscout.tools import plugins

    if defaults.device is not None and not re.match(DEVICE_PATTERN, defaults.device):
        installed = plugins.device_names()
        if defaults.device not in installed:
            raise SearchConfigError(f"device {defaults.device!r} in {sources['device']} is not auto, cpu, cuda or cuda:N"
                                    + (f", nor an installed package's ({', '.join(installed)})" if installed else "")
                                    + " (a plugin's name needs the package that declares it installed)")
    if defaults.history:
        # a path in a file means the same thing whichever folder the command runs from
        base = Path(sources["history"]).parent
        defaults.history = [h if h.lower() == "none" else str(base / Path(h).expanduser()) for h in defaults.history]
    defaults.sources = sources
    return defaults


def help_default(name: str) -> str:
    """Help text's default for an option the files can set (brackets escaped for rich)."""
    return f"\\[default: {BUILT_IN[name]}, or \\[search] {name} in kscout.toml]"


def search_config(as_json: bool) -> SearchDefaults:
    """For a command: the defaults, or a failed command (exit 2, JSON under --json) naming the bad file."""
    from kernelscout.agent.cli_errors import fail

    try:
        return search_defaults()
    except SearchConfigError as exc:
        fail(str(exc), as_json)
        raise  # not reached: fail() exits


def announce_defaults(defaults: SearchDefaults, as_json: bool) -> None:
    """Say on stderr which settings a search took from a file, once it has picked them and before it starts."""
    note = defaults.note()
    if note and not as_json:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True).print(f"[dim]defaults {escape(note)}[/dim]", soft_wrap=True, highlight=False)
