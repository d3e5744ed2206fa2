"""Headless multi-problem runs: many searches, one after another, resumable as a whole.

A top run directory holds `manifest.json` (what to run and with which budgets, written once; only its
global caps can be changed later, by `kscout resume RUN --max-...`),
`headless.db` (one row per problem: pending, running, finished, failed or skipped) and one sub run
directory per problem under `problems/<name>/`. Each sub run directory is an ordinary search run
directory, so every guarantee of a single search (no measurement lost, no budget spent twice)
holds per problem; this module only decides which problem runs next, how much of the global caps
it may use, and what a problem's outcome was. A problem that cannot run (bad file, crash,
exception) is recorded with its reason and the run goes on.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import sqlite3
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from pydantic import BaseModel, Field

from kernelscout.agent.search_spec import SOLVED_CHANCE
from kernelscout.agent.stops import Stop, recorded_stop
from kernelscout.sandbox.objectives import Objective
from kernelscout.sandbox.problem import problem_name
from kernelscout.tools.atomic import write_text_atomic
from kernelscout.tools.rundir import MULTI_PROBLEM_MARK, read_events, reading
from kernelscout.tools.runlock import holder

MANIFEST = "manifest.json"
STATE_DB = MULTI_PROBLEM_MARK  # RunDir refuses a folder that holds one
FAST_P = (0.0, 1.0, 1.5, 2.0)
SPACE_SUFFIXES = (".json.gz", ".json")

GEOMEAN_NOTE = ("geometric mean over all problems; a problem without a verified kernel faster than its reference "
                "(no improvement, failed or skipped) counts as 1.0, because the reference is what you keep")
FAST_P_NOTE = ("fast_p: fraction of all problems (failed and skipped included) with a verified correct kernel "
               "more than p times faster than the reference; fast_0 is the fraction with any correct kernel; fast_1 counts "
               "any speedup over 1, as KernelBench does, also one within the 1 % a search needs to replace the reference")


class HeadlessError(Exception):
    """Unusable arguments for a whole run (nothing to run, unknown path); the message says what to do."""


class ProblemRef(BaseModel):
    name: str = Field(description="unique within the run; also the name of its sub run directory")
    kind: Literal["problem", "space"] = Field(description="a KernelBench file, or a recorded space replayed")
    path: str
    start: list[str] = Field(default_factory=list, description="the user's kernels, measured first and tuned from (--start)")


class RunCaps(BaseModel):
    """Caps over the whole run, shared by all problems; each problem gets at most what is left."""

    max_wall_s: Optional[float] = Field(None, gt=0, description="seconds of running, summed over sessions")
    max_measurements: Optional[int] = Field(None, ge=1, description="measurements over all problems")
    max_usd: Optional[float] = Field(None, gt=0, description="LLM spend over all problems")
    max_tokens: Optional[int] = Field(None, ge=1, description="LLM tokens over all problems")


class RunManifest(BaseModel):
    version: int = 1
    problems: list[ProblemRef]
    budget: int = Field(ge=1, description="measurement budget of each problem")
    policy: str = "auto"
    surrogate: str = "auto"
    device: str = "auto"
    seed: int = Field(0, ge=0)
    proposals: int = Field(6, ge=1)
    patience: int = Field(0, ge=0)
    solved_chance: float = Field(SOLVED_CHANCE, ge=0, lt=1, description="each recorded space's search stops once what is left "
                                 "has less than this chance, together, of a clear win (0: never)")
    confirm: Optional[int] = Field(None, ge=0, description="measurements kept to re-measure each problem's best (None: "
                                   "kscout optimize's default; at most the problem's budget less one)")
    problem_wall_s: Optional[float] = Field(None, gt=0, description="wall-clock limit of one problem's search")
    history: list[str] = Field(default_factory=list, description="folders of earlier runs for the learned surrogate's "
                               "prior on each code problem (resolved); the run's own folder lets each problem learn "
                               "from those searched before it")
    rewrites: Optional[list[str]] = Field(None, description="the generic rewrites the offline tuner may try on each code "
                                          "problem, as `kscout optimize --rewrites` takes them (None: all)")
    objective: Objective = Field("file", description="each recorded space's, as `kscout optimize --objective` takes it")
    caps: RunCaps = Field(default_factory=RunCaps)


ProblemStatus = Literal["pending", "running", "finished", "failed", "skipped"]


class ProblemOutcome(BaseModel):
    name: str
    kind: str
    path: str
    status: ProblemStatus = "pending"
    reason: Optional[str] = Field(None, description="why it failed or was skipped, or why a finished one has no verified kernel")
    stop_reason: Optional[str] = None
    stop: Optional[Stop] = Field(None, description="the search's stop as data (kind, and the limit that caused it)")
    best_speedup: Optional[float] = Field(None, description="measured speedup of the best verified kernel")
    best_path: Optional[str] = None
    measurements_used: int = 0
    candidates_considered: int = 0
    wall_s: Optional[float] = None
    device: Optional[str] = None
    policy: Optional[str] = None
    llm_usd: float = 0.0
    llm_tokens: int = 0
    run_dir: str
    report: Optional[str] = None


class RunSummary(BaseModel):
    status: Literal["complete", "incomplete"]
    run_dir: str
    problems: list[ProblemOutcome]
    counts: dict[str, int]
    fast_p: dict[str, float]
    geomean_speedup: float
    measurements_used: int
    candidates_considered: int
    wall_s: float
    llm_usd: float = 0.0
    llm_tokens: int = 0
    notes: list[str] = Field(default_factory=lambda: [FAST_P_NOTE, GEOMEAN_NOTE])


# -- discovery ----------------------------------------------------------------------------------

def _is_space(path: Path) -> bool:
    return path.name.endswith(SPACE_SUFFIXES)


def _name_of(path: Path) -> str:
    base = path.name[: -len(".json.gz")] if path.name.endswith(".json.gz") else problem_name(path)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("._") or "problem"


def _files_in(folder: Path) -> list[Path]:
    """A folder with problem.py is one problem; otherwise its problem folders, KernelBench files and recorded spaces,
    and the recorded spaces one folder down (the benchmark hub's own layout, `cachefiles/<kernel>/<GPU>.json.gz`)."""
    if (folder / "problem.py").is_file():
        return [folder / "problem.py"]
    from kernelscout.sandbox.replay import kernel_folder_spaces  # imported here, as discover imports replay

    found = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir() and (child / "problem.py").is_file():
            found.append(child / "problem.py")
        elif child.is_dir():
            found.extend(kernel_folder_spaces(child))
        elif child.is_file() and (child.suffix == ".py" or _is_space(child)):
            found.append(child)
    return found


def discover(paths: list[str]) -> list[ProblemRef]:
    """Turn command-line paths into problems, in the order given (a folder's problems sorted by name)."""
    if not paths:
        raise HeadlessError("give at least one problem: a KernelBench .py file, a folder with problem.py, "
                            "a folder of such folders, or a recorded space .json.gz")
    from kernelscout.sandbox.replay import resolve_space, space_hint

    refs: list[ProblemRef] = []
    seen_paths: set[str] = set()
    names: set[str] = set()
    for raw in paths:
        path = resolve_space(raw)
        if path.is_dir():
            files = _files_in(path)
            if not files:
                raise HeadlessError(f"{raw}: no problems found (expected problem.py, folders holding problem.py, "
                                    "KernelBench .py files or recorded spaces .json.gz)")
        elif path.is_file() and (path.suffix == ".py" or _is_space(path)):
            files = [path]
        elif path.is_file():
            raise HeadlessError(f"{raw}: not a problem; give a KernelBench .py file, a folder with problem.py, "
                                "a folder of such folders, or a recorded space .json.gz")
        else:
            raise HeadlessError(f"{raw}: no such file or folder, nor a recorded space's name{space_hint(raw)}")
        for f in files:
            resolved = str(f.resolve())
            if resolved in seen_paths:
                continue
            seen_paths.add(resolved)
            base = _name_of(f)
            if path.is_dir() and _is_space(f) and f.parent != path:
                base = _name_of(f.parent / f"{f.parent.name}_{f.name}")  # gemm/A100.json.gz: gemm_A100, as the hub's flat files
            name, n = base, 2
            while name in names:
                name, n = f"{base}-{n}", n + 1
            names.add(name)
            refs.append(ProblemRef(name=name, kind="space" if _is_space(f) else "problem", path=resolved))
    return refs


def run_history(folders: Optional[list[str]], run_path: str | Path) -> list[str]:
    """`--history` of a whole run, resolved. The run's own folder may not exist yet: naming it is how
    each problem's search learns from the problems searched before it in the same run (their
    sub-runs sit two levels down, where `find_runs` looks)."""
    from kernelscout.agent.runner import OptimizeError, _check_history

    if len(folders or []) > 1 and any(f.lower() == "none" for f in folders or []):
        raise HeadlessError("--history none turns the prior off; give it alone, not with folders")
    own = Path(run_path).expanduser().resolve()
    others = [f for f in folders or [] if Path(f).expanduser().resolve() != own]
    try:
        resolved = _check_history(others) if others else []
    except OptimizeError as exc:
        raise HeadlessError(str(exc)) from None
    return (resolved or []) + ([str(own)] if len(others) < len(folders or []) else [])


def attach_start(refs: list[ProblemRef], patterns: list[str]) -> list[ProblemRef]:
    """Give each problem the kernels that `--start PATTERN` names next to it, resolved now.

    A pattern is a glob relative to the problem's folder (the folder of problem.py, or of a
    KernelBench file), with `{name}` standing for the problem's file stem (its folder's name for a
    problem.py): `--start fast.py` over examples/ starts each example from its own fast.py, and
    `--start 'solutions/{name}.py'` pairs a KernelBench level with a folder of solutions. Resolved when
    the run is made and kept in its manifest, so a resume tunes from the same files. A problem
    with no match starts from its reference alone; a pattern that matches nowhere is refused, as it
    is most likely a typo and the night would otherwise be spent without the user's kernels.
    """
    if not patterns:
        return refs
    for pattern in patterns:
        if Path(pattern).is_absolute():
            raise HeadlessError(f"--start {pattern}: give a glob relative to each problem's folder (such as fast.py or "
                                "'solutions/{name}.py'); for one problem and one file use kscout optimize PROBLEM --start FILE")
    if all(r.kind == "space" for r in refs):
        raise HeadlessError("--start gives kernel files, and a recorded space has no code; leave --start out for spaces")
    out, matched = [], set()
    for ref in refs:
        if ref.kind == "space":
            out.append(ref)
            continue
        problem = Path(ref.path)
        files: list[str] = []
        for pattern in patterns:
            for f in sorted(problem.parent.glob(pattern.replace("{name}", problem_name(problem)))):
                resolved = str(f.resolve())
                if f.is_file() and resolved != ref.path and resolved not in files:
                    files.append(resolved)
                    matched.add(pattern)
        out.append(ref.model_copy(update={"start": files}))
    unmatched = [p for p in patterns if p not in matched]
    if unmatched:
        raise HeadlessError(f"--start {unmatched[0]}: matches no file next to any of the {sum(r.kind == 'problem' for r in refs)} "
                            "problems (a glob relative to each problem's folder; {name} stands for the problem's name)")
    return out


# -- maths of the summary ------------------------------------------------------------------------

def fast_p(speedups: list[Optional[float]], p: float) -> float:
    """KernelBench's fast_p: the share of problems whose verified kernel beats p times the reference.

    `None` means no verified correct kernel (failed, skipped, or nothing correct was measured).
    """
    if not speedups:
        return 0.0
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups)


def geomean_speedup(speedups: list[Optional[float]]) -> float:
    """Geometric mean where anything not faster than the reference counts as 1.0 (the reference is kept)."""
    if not speedups:
        return 1.0
    kept = [s if (s is not None and s > 1.0) else 1.0 for s in speedups]
    return math.exp(sum(math.log(s) for s in kept) / len(kept))


def fast_p_key(p: float) -> str:
    return f"fast_{p:g}"


# -- persistence --------------------------------------------------------------------------------

def is_headless_run(run_dir: str | Path) -> bool:
    return (Path(run_dir) / MANIFEST).is_file()


class RunState:
    """headless.db: each problem's outcome and the running time of earlier sessions, in SQLite transactions."""

    def __init__(self, path: Path):
        self.path = path
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS problems (name TEXT PRIMARY KEY, position INTEGER, status TEXT, "
                       "outcome_json TEXT, updated REAL)")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path / STATE_DB, timeout=60.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            yield db
        finally:
            db.close()

    def ensure(self, refs: list[ProblemRef], run_path: Path) -> None:
        with self._db() as db:
            for i, ref in enumerate(refs):
                outcome = ProblemOutcome(name=ref.name, kind=ref.kind, path=ref.path, run_dir=str(run_path / "problems" / ref.name))
                db.execute("INSERT OR IGNORE INTO problems VALUES (?, ?, 'pending', ?, ?)", (ref.name, i, outcome.model_dump_json(), time.time()))

    def put(self, outcome: ProblemOutcome) -> None:
        with self._db() as db:
            db.execute("UPDATE problems SET status = ?, outcome_json = ?, updated = ? WHERE name = ?",
                       (outcome.status, outcome.model_dump_json(), time.time(), outcome.name))

    def get(self, name: str) -> ProblemOutcome:
        with self._db() as db:
            row = db.execute("SELECT outcome_json FROM problems WHERE name = ?", (name,)).fetchone()
        return ProblemOutcome.model_validate_json(row[0])

    def all(self) -> list[ProblemOutcome]:
        with self._db() as db:
            rows = db.execute("SELECT outcome_json FROM problems ORDER BY position").fetchall()
        return [ProblemOutcome.model_validate_json(r[0]) for r in rows]

    def elapsed(self) -> float:
        with self._db() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'elapsed_s'").fetchone()
        return float(row[0]) if row else 0.0

    def set_elapsed(self, seconds: float) -> None:
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('elapsed_s', ?)", (repr(seconds),))


# -- reading a sub run directory -----------------------------------------------------------------

def _sub_has_search(sub: Path) -> bool:
    if not (sub / "run.db").exists():
        return False
    try:
        with reading(sub / "run.db") as db:
            return db.execute("SELECT 1 FROM meta WHERE key = 'search_spec'").fetchone() is not None
    except sqlite3.Error:
        return False


def _sub_spent(sub: Path) -> dict[str, float]:
    """Only what the global caps weigh: measurements charged and LLM use (no archive queries)."""
    if not (sub / "run.db").exists():
        return {"measurements": 0, "usd": 0.0, "tokens": 0}
    from kernelscout.agent.llm_pricing import stored_usage
    from kernelscout.tools.budget import Budget
    from kernelscout.tools.rundir import RunDir

    run = RunDir(sub)
    usage = stored_usage(run)
    return {"measurements": Budget(run).status().used, "usd": usage.cost_usd if usage else 0.0,
            "tokens": usage.total_tokens if usage else 0}


def _sub_numbers(sub: Path) -> dict[str, Any]:
    """Measurements, candidates considered, best verified speedup and LLM use, read from the sub run's own run.db."""
    numbers: dict[str, Any] = {"measurements_used": 0, "candidates_considered": 0, "best_speedup": None, "llm_usd": 0.0, "llm_tokens": 0}
    if not (sub / "run.db").exists():
        return numbers
    from kernelscout.agent.graph import considered_count
    from kernelscout.agent.llm_pricing import stored_usage
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.budget import Budget
    from kernelscout.tools.rundir import RunDir

    run = RunDir(sub)
    numbers["measurements_used"] = Budget(run).status().used
    try:
        archive = Archive(run)
        numbers["candidates_considered"] = considered_count(archive)
        best = archive.reported_best()
        numbers["best_speedup"] = archive.reported_speedup(best) if best else None
    except sqlite3.OperationalError:
        pass  # the search never got as far as creating its archive
    usage = stored_usage(run)
    if usage is not None:
        numbers["llm_usd"] = usage.cost_usd
        numbers["llm_tokens"] = usage.total_tokens
    return numbers


def _failure_of_measurements(sub: Path) -> Optional[str]:
    """A problem is failed, not merely unimproved, when every measurement failed the same way for a problem-side reason."""
    if not (sub / "run.db").exists():
        return None
    with reading(sub / "run.db") as db:
        try:
            rows = db.execute("SELECT status, result_json FROM measurements ORDER BY id").fetchall()
        except sqlite3.OperationalError:
            return None
    statuses = {r[0] for r in rows}
    if len(statuses) != 1 or not statuses <= {"invalid_problem", "timeout", "crashed"}:
        return None
    status = rows[0][0]
    message = json.loads(rows[0][1]).get("message") or ""
    label = {"invalid_problem": "invalid problem", "timeout": "every measurement timed out",
             "crashed": "every measurement crashed"}.get(status, status)
    return f"{label}: {message}".strip().rstrip(":")


# -- progress -----------------------------------------------------------------------------------

def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class RunProgress:
    """One line per problem as it starts and ends: rich markup on a terminal, plain timestamped lines in a pipe."""

    def __init__(self, total: int, console: Any = None, enabled: bool = True):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.total, self.enabled = total, enabled
        self._t0 = time.monotonic()

    def _say(self, rich_text: str, plain: str) -> None:
        if not self.enabled:
            return
        if self.console.is_terminal:
            self.console.print(rich_text, highlight=False)
        else:
            # the run's clock, named: each problem's search prints its own lines on its own clock in between
            print(f"[run {time.monotonic() - self._t0:7.1f}s] {plain}", file=sys.stderr, flush=True)

    def start(self, index: int, ref: ProblemRef, budget: int, resumed: bool) -> None:
        verb = "resuming" if resumed else "starting"
        given = f", from {', '.join(Path(f).name for f in ref.start)}" if ref.start else ""
        self._say(f"[bold]\\[{index}/{self.total}] {escape(ref.name)}[/bold]: {verb} (budget {budget} measurements{escape(given)})",
                  f"[{index}/{self.total}] {ref.name}: {verb} (budget {budget} measurements{given})")

    def done(self, index: int, o: ProblemOutcome) -> None:
        sp = f"{o.best_speedup:.3f}x" if o.best_speedup is not None else "no verified kernel"
        detail = (f"{o.status}: best {sp}, {o.measurements_used} measurements, {o.candidates_considered} considered"
                  + (f", {o.wall_s:.0f} s" if o.wall_s is not None else ""))
        if (o.status != "finished" or o.best_speedup is None) and o.reason:
            detail += f" ({o.reason.splitlines()[0].replace(o.path, Path(o.path).name)})"
        colour = {"finished": "green", "failed": "red", "skipped": "yellow"}.get(o.status, "white")
        self._say(f"\\[{index}/{self.total}] {escape(o.name)}: [{colour}]{escape(detail)}[/{colour}]", f"[{index}/{self.total}] {o.name}: {detail}")

    def skip(self, index: int, name: str, reason: str) -> None:
        self._say(f"\\[{index}/{self.total}] {escape(name)}: [yellow]skipped[/yellow] ({escape(reason)})",
                  f"[{index}/{self.total}] {name}: skipped ({reason})")


# -- the run ------------------------------------------------------------------------------------

class HeadlessRun:
    """A multi-problem run in one top run directory."""

    def __init__(self, path: Path | str, manifest: RunManifest):
        self.path = Path(path)
        self.manifest = manifest
        self.state = RunState(self.path)
        self.state.ensure(manifest.problems, self.path)
        self._final_spent: dict[str, dict[str, float]] = {}  # see _spent

    # construction ----------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path | str, manifest: RunManifest) -> "HeadlessRun":
        """Start a run, or continue the one already in `path` if it was started with the same manifest."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise HeadlessError(f"{path} is a file, not a folder; give --run-dir a folder (new or earlier)")
        if (path / "run.db").exists() and not is_headless_run(path):
            raise HeadlessError(f"{path} holds a single search; use `kscout resume {path}` or a new --run-dir")
        if is_headless_run(path):
            existing = RunManifest.model_validate_json((path / MANIFEST).read_text())
            if existing.model_dump(exclude={"caps"}) == manifest.model_dump(exclude={"caps"}) and existing.caps != manifest.caps:
                raise HeadlessError(f"{path} holds this run with other global caps; change them with `kscout resume {path} "
                                    "--max-wall S --max-measurements N --max-usd D --max-tokens T` (those given)")
            if existing.model_dump() != manifest.model_dump():
                raise HeadlessError(f"{path} already holds a different run; use `kscout resume {path}` or a new --run-dir")
            return cls(path, existing)
        path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path / MANIFEST, manifest.model_dump_json(indent=2), durable=True)
        return cls(path, manifest)

    @classmethod
    def open(cls, path: Path | str) -> "HeadlessRun":
        path = Path(path)
        if not is_headless_run(path):
            raise HeadlessError(f"{path}: not a multi-problem run directory (no {MANIFEST})")
        return cls(path, RunManifest.model_validate_json((path / MANIFEST).read_text()))

    def change_caps(self, **caps: Any) -> None:
        """New global caps for the rest of the run (`kscout resume RUN --max-measurements N`, ...): a problem skipped
        because a cap was used up runs once the new cap leaves room; everything else in the manifest stays fixed.
        Without this, a run stopped by its cap could never finish in its folder (a QA pass found no way on)."""
        new = self.manifest.caps.model_copy(update={k: v for k, v in caps.items() if v is not None})
        RunCaps.model_validate(new.model_dump())  # the same checks as at the start (positive, ...)
        self.manifest = self.manifest.model_copy(update={"caps": new})
        write_text_atomic(self.path / MANIFEST, self.manifest.model_dump_json(indent=2), durable=True)
        self._event("caps_changed", **new.model_dump())

    # caps -----------------------------------------------------------------------------------------
    def _spent(self) -> dict[str, float]:
        """What every problem has used, read from its own ledger. A finished or failed problem's use cannot change
        while this run holds its lock, so it is read once: read afresh for every problem before each next one, the
        sums took about 1.4 ms a problem, three times per problem, so minutes over a few hundred problems."""
        totals = {"measurements": 0, "usd": 0.0, "tokens": 0}
        for outcome in self.state.all():
            n = self._final_spent.get(outcome.name) or _sub_spent(self.path / "problems" / outcome.name)
            if outcome.status in ("finished", "failed"):
                self._final_spent[outcome.name] = n
            for key in totals:
                totals[key] += n[key]
        return totals

    def _cap_reached(self, elapsed: float, killed: bool = False) -> Optional[str]:
        """The global cap that leaves no room for the next problem. The measurement cap does not hold back a problem
        whose search was `killed` mid-way: it goes on under its own ledger's cap, fitted to what the global cap leaves
        it (`_fitted_cap`), so that what it measured before the kill is taken up, not left out of its result."""
        caps, spent = self.manifest.caps, self._spent()
        if caps.max_wall_s is not None and elapsed >= caps.max_wall_s:
            return f"global wall-clock cap of {caps.max_wall_s:g} s reached"
        if caps.max_measurements is not None and spent["measurements"] >= caps.max_measurements and not killed:
            return f"global measurement cap of {caps.max_measurements} reached"
        if caps.max_usd is not None and spent["usd"] >= caps.max_usd:
            return f"global LLM cost cap of ${caps.max_usd:g} reached"
        if caps.max_tokens is not None and spent["tokens"] >= caps.max_tokens:
            return f"global LLM token cap of {caps.max_tokens} reached"
        return None

    def _fitted_cap(self, ledger: Any) -> Optional[int]:
        """A started problem's own cap as the global measurement cap now allows: its measurements so far plus what the
        global cap leaves, and no more than its budget (or a larger cap a user set on its folder). The global cap may
        have been lowered since the problem started (a cut), or raised after a cut (given back). None: unchanged."""
        cap = self.manifest.caps.max_measurements
        if cap is None or ledger.cap is None:
            return None
        fits = ledger.status().used + max(0, int(cap - self._spent()["measurements"]))
        fitted = min(fits, max(ledger.cap, self.manifest.budget))
        return fitted if fitted != ledger.cap else None

    def _allowance(self, elapsed: float) -> dict[str, Any]:
        """What the next problem may use: its own budget, cut down to what the global caps have left."""
        caps, spent, m = self.manifest.caps, self._spent(), self.manifest
        budget = m.budget if caps.max_measurements is None else min(m.budget, int(caps.max_measurements - spent["measurements"]))
        walls = [w for w in (m.problem_wall_s, None if caps.max_wall_s is None else caps.max_wall_s - elapsed) if w is not None]
        return {
            "budget": max(1, budget),
            "max_wall": max(0.1, round(min(walls), 1)) if walls else None,  # rounded for the stop message; never 0 (0 means no limit)
            "max_usd": None if caps.max_usd is None else caps.max_usd - spent["usd"],
            "max_llm_tokens": None if caps.max_tokens is None else int(caps.max_tokens - spent["tokens"]),
        }

    def _named_wall_cap(self, stop_reason: Optional[str], allow: dict[str, Any]) -> Optional[str]:
        """The search names the wall-clock limit it was given; when that was what the run's global cap had left,
        say so (a user who gave --max-wall 25 read "wall-clock limit of 3.3 s reached" and could not place it)."""
        cap, own = self.manifest.caps.max_wall_s, self.manifest.problem_wall_s
        if (stop_reason and stop_reason.startswith("wall-clock limit") and cap is not None and allow["max_wall"] is not None
                and (own is None or allow["max_wall"] < own)):
            return f"global wall-clock cap of {cap:g} s reached ({allow['max_wall']:g} s of it were left for this problem)"
        return stop_reason

    # running --------------------------------------------------------------------------------------
    def run(self, quiet: bool = False, progress: Optional[RunProgress] = None) -> RunSummary:
        """Run every problem not yet finished or failed; an interrupted one resumes where it stopped.
        HeadlessError while another process is running this run (tools/runlock.py)."""
        from kernelscout.tools.runlock import RunBusy, exclusive

        try:
            with exclusive(self.path, "kscout run"):
                return self._run_all(quiet, progress or RunProgress(len(self.manifest.problems)))
        except RunBusy as exc:
            raise HeadlessError(str(exc)) from None

    def _run_all(self, quiet: bool, progress: RunProgress) -> RunSummary:
        before, t0 = self.state.elapsed(), time.monotonic()
        self._event("session_start", problems=len(self.manifest.problems))
        try:
            for index, ref in enumerate(self.manifest.problems, 1):
                outcome = self.state.get(ref.name)
                if outcome.status in ("finished", "failed"):
                    continue
                elapsed = before + time.monotonic() - t0
                killed = outcome.status == "running" and _sub_has_search(self.path / "problems" / ref.name)
                reason = self._cap_reached(elapsed, killed=killed)
                if reason:
                    outcome = outcome.model_copy(update={"status": "skipped", "reason": reason, **self._numbers(ref)})
                    self.state.put(outcome)
                    self._event("problem_skipped", name=ref.name, reason=reason)
                    progress.skip(index, ref.name, reason)
                    continue
                outcome = self._run_problem(index, ref, self._allowance(elapsed), quiet, progress)
                self.state.set_elapsed(before + time.monotonic() - t0)
                progress.done(index, outcome)
        except KeyboardInterrupt:
            self._event("session_interrupted")
            raise
        finally:
            self.state.set_elapsed(before + time.monotonic() - t0)
        summary = self.summary()
        write_reports(self.path, summary)
        self._event("session_end", **{k: v for k, v in summary.model_dump().items() if k != "problems"})
        return summary

    def _numbers(self, ref: ProblemRef) -> dict[str, Any]:
        sub = self.path / "problems" / ref.name
        n = _sub_numbers(sub)
        report = sub / "report.html"
        return {**n, "report": str(report) if report.exists() else None}

    def _run_problem(self, index: int, ref: ProblemRef, allow: dict[str, Any], quiet: bool, progress: RunProgress) -> ProblemOutcome:
        from kernelscout.agent.stops import MACHINE_BUSY
        from kernelscout.agent.runner import OptimizeError, SearchPaused, resume_search, start_search

        from kernelscout.tools.budget import Budget
        from kernelscout.tools.rundir import RunDir

        sub = self.path / "problems" / ref.name
        resumed = _sub_has_search(sub)
        if resumed:  # its own cap, fitted to the global one, is what it goes on under (and what progress names)
            own = Budget(RunDir(sub))
            if (fitted := self._fitted_cap(own)) is not None:
                own.set_cap(fitted)
            if own.cap is not None:
                allow = {**allow, "budget": own.cap}
        outcome = self.state.get(ref.name).model_copy(update={"status": "running", "reason": None})
        self.state.put(outcome)
        self._event("problem_start", name=ref.name, resumed=resumed, **allow)
        progress.start(index, ref, allow["budget"], resumed)
        m = self.manifest
        started, earlier = time.monotonic(), outcome.wall_s or 0.0

        def wall() -> float:  # this problem's time over every session, this one's so far included
            return round(earlier + time.monotonic() - started, 3)

        update: dict[str, Any]
        try:
            # the cap goes into the problem's ledger before its search exists, so no kill leaves it uncapped
            ledger = Budget(RunDir(sub))
            if ledger.cap is None:
                ledger.set_cap(allow["budget"])
            if resumed:
                result = resume_search(str(sub), quiet=quiet)
            else:
                policy = "tuner" if (ref.kind == "space" and m.policy == "auto") else m.policy
                result = start_search(
                    problem=ref.path if ref.kind == "problem" else None, space=ref.path if ref.kind == "space" else None,
                    budget=allow["budget"], policy=policy, surrogate=m.surrogate, device=m.device, run_dir=str(sub), seed=m.seed,
                    proposals=m.proposals, patience=m.patience, solved_chance=m.solved_chance if ref.kind == "space" else None, max_wall=allow["max_wall"], quiet=quiet,
                    max_usd=allow["max_usd"], max_llm_tokens=allow["max_llm_tokens"], start=ref.start,
                    confirm=None if m.confirm is None else min(m.confirm, allow["budget"] - 1),
                    history=m.history if ref.kind == "problem" else None, rewrites=m.rewrites if ref.kind == "problem" else None,
                    objective=m.objective if ref.kind == "space" else "file",
                )
            failure = _failure_of_measurements(sub)
            # finished with nothing to report: the search's message says why
            reason = failure or (result.message if result.best_speedup is None else None)
            update = {"status": "failed" if failure else "finished", "reason": reason,
                      "stop_reason": self._named_wall_cap(result.stop_reason, allow), "stop": result.stop, "best_path": result.best_path,
                      "device": result.device, "policy": result.policy}
            if not failure and (result.stop_reason or "").startswith(MACHINE_BUSY):
                # not finished: the rest of its budget waits for an idle machine, and the run's resume goes on with it
                update.update(status="pending", reason=f"{MACHINE_BUSY} (its timings were void); `kscout resume {self.path}` "
                                                       "goes on with it once the machine is idle")
                self._event("problem_paused", name=ref.name, reason=result.stop_reason)
        except KeyboardInterrupt:  # the time searched so far still counts in this problem's wall
            self.state.put(outcome.model_copy(update={"wall_s": wall()}))
            raise
        except SearchPaused as exc:  # the LLM provider failed: this problem waits, and so does the rest of the run
            outcome = outcome.model_copy(update={"status": "pending", "reason": str(exc), **self._numbers(ref), "wall_s": wall()})
            self.state.put(outcome)
            self._event("problem_paused", name=ref.name, reason=str(exc))
            raise HeadlessError(f"{ref.name}: {exc}".replace(f"kscout resume {sub}", f"kscout resume {self.path}")) from None
        except OptimizeError as exc:
            update = {"status": "failed", "reason": str(exc)}
        except Exception as exc:  # a crash in one problem must not end the night
            update = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            self._event("problem_error", name=ref.name, traceback=traceback.format_exc())
        outcome = outcome.model_copy(update={**update, **self._numbers(ref), "wall_s": wall()})
        self.state.put(outcome)
        self._event("problem_end", **outcome.model_dump())
        return outcome

    # reporting ------------------------------------------------------------------------------------
    def summary(self) -> RunSummary:
        # the numbers are read again from each problem's own run.db, so the summary is what the ledgers hold
        stored = {o.name: o for o in self.state.all()}
        if holder(self.path) is None:  # "running" left by a session that was stopped: nothing runs it now
            stored = {n: o.model_copy(update={"status": "pending", "reason": f"interrupted; `kscout resume {self.path}` goes on"})
                      if o.status == "running" else o for n, o in stored.items()}
        log = list(read_events(self.path / "events.jsonl"))
        ended = {e["data"]["name"]: e["ts"] for e in log if e.get("event") == "problem_end"}  # when this run last ended each
        own = self._own_sessions(log)
        outcomes = [self._resumed_apart(stored[ref.name].model_copy(update=self._numbers(ref)), ended.get(ref.name), own.get(ref.name, 0.0))
                    for ref in self.manifest.problems]
        done = {"finished", "failed", "skipped"}
        # what fast_p and the mean count: a verified kernel's speedup, from the sub run's archive
        speedups = [o.best_speedup for o in outcomes]
        counts = {s: sum(1 for o in outcomes if o.status == s) for s in ("finished", "failed", "skipped", "pending", "running")}
        return RunSummary(
            status="complete" if all(o.status in done for o in outcomes) else "incomplete",
            run_dir=str(self.path),
            problems=outcomes,
            counts={k: v for k, v in counts.items() if v},
            fast_p={fast_p_key(p): round(fast_p(speedups, p), 4) for p in FAST_P},
            geomean_speedup=round(geomean_speedup(speedups), 4),
            measurements_used=sum(o.measurements_used for o in outcomes),
            candidates_considered=sum(o.candidates_considered for o in outcomes),
            wall_s=round(self.state.elapsed(), 1),
            llm_usd=round(sum(o.llm_usd for o in outcomes), 6),
            llm_tokens=sum(o.llm_tokens for o in outcomes),
        )

    def _own_sessions(self, log: list[dict]) -> dict[str, float]:
        """Seconds each problem's search ran in sessions of its own folder (`kscout resume RUN/problems/NAME`), which
        this run's clock never saw. Each `problem_start` in this run's `log` owns the first search session of that
        problem that its process began before this run started anything else; every other session was the folder's own."""
        starts = [e for e in log if e.get("event") == "problem_start"]
        unclaimed: dict[str, list[tuple[Any, float, float]]] = {}  # name -> (pid, from, until) of each start not yet matched
        for i, e in enumerate(starts):
            until = starts[i + 1]["ts"] if i + 1 < len(starts) else math.inf
            unclaimed.setdefault(e["data"]["name"], []).append((e.get("pid"), e["ts"], until))
        seconds: dict[str, float] = {}
        for ref in self.manifest.problems:
            windows = unclaimed.get(ref.name, [])
            total, begun, last = 0.0, None, 0.0
            for e in read_events(self.path / "problems" / ref.name / "events.jsonl"):
                if e.get("event") == "session_start":
                    total += last - begun if begun is not None else 0.0
                    ours = next((w for w in windows if w[0] == e.get("pid") and w[1] <= e["ts"] < w[2]), None)
                    if ours is not None:
                        windows.remove(ours)
                    begun = None if ours is not None else e["ts"]
                last = e.get("ts", last)
            total += last - begun if begun is not None else 0.0
            if total:
                seconds[ref.name] = total
        return seconds

    def _resumed_apart(self, o: ProblemOutcome, ended_at: Optional[float], own_s: float = 0.0) -> ProblemOutcome:
        """A problem whose own folder was resumed directly (`kscout resume RUN/problems/NAME`): its wall time counts
        those sessions too, and when one ran after this run last ended the problem, its stop is the one of that
        resume, and one left pending by a busy machine is finished now."""
        from kernelscout.agent.stops import MACHINE_BUSY
        from kernelscout.agent.run_view import finished_event

        if own_s:
            o = o.model_copy(update={"wall_s": round((o.wall_s or 0.0) + own_s, 3)})
        if o.status not in ("finished", "pending") or ended_at is None:
            return o
        done = finished_event(self.path / "problems" / o.name)
        if not done or done.get("ts", 0.0) <= ended_at:
            return o
        stop = done.get("stop_reason")
        update: dict[str, Any] = {"stop_reason": stop, "stop": recorded_stop(done)}
        if o.status == "pending" and (o.reason or "").startswith(MACHINE_BUSY) and not (stop or "").startswith(MACHINE_BUSY):
            update.update(status="finished", reason=None)
        return o.model_copy(update=update)

    def _event(self, kind: str, /, **data: Any) -> None:
        line = json.dumps({"ts": time.time(), "event": kind, "pid": os.getpid(), "data": data}, default=str)
        with open(self.path / "events.jsonl", "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


# -- reports ------------------------------------------------------------------------------------

def _fmt_speedup(s: Optional[float]) -> str:
    """The best verified candidate's measured speedup; one at or below 1x is said to leave the reference standing, and
    one under the 1 % a search needs to replace the reference is said to be within it (`kscout show` says the
    reference stands there; fast_1 still counts it, as KernelBench does)."""
    from kernelscout.tools.archive import CLEAR_GAIN

    if s is None:
        return "-"
    if s <= 1.0:
        return f"{s:.3f}x (none faster)"
    return f"{s:.3f}x" if s >= CLEAR_GAIN else f"{s:.3f}x (within {CLEAR_GAIN - 1:.0%}: the reference stands)"


def _why(o: ProblemOutcome) -> str:
    shown = o.status in ("failed", "skipped") or (o.status == "finished" and o.best_speedup is None)
    text = o.reason if shown and o.reason else (o.stop_reason or "")
    return text.splitlines()[0].replace(o.path, Path(o.path).name) if text else ""


def summary_rows(summary: RunSummary) -> list[list[str]]:
    return [[o.name, o.status, _fmt_speedup(o.best_speedup), str(o.measurements_used), str(o.candidates_considered),
             "-" if o.wall_s is None else f"{o.wall_s:.0f} s", _why(o)] for o in summary.problems]


HEADERS = ["problem", "status", "best speedup", "measurements", "considered", "wall", "stop / reason"]


def summary_markdown(summary: RunSummary) -> str:
    lines = [f"# kernelscout run: {Path(summary.run_dir).name}", "",
             f"Status: {summary.status}. {len(summary.problems)} problems; "
             + ", ".join(f"{v} {k}" for k, v in summary.counts.items())
             + f". {summary.measurements_used} measurements, {summary.candidates_considered} candidates considered, "
             f"{summary.wall_s:.0f} s of running.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in summary_rows(summary):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    lines += ["", "| " + " | ".join(summary.fast_p) + " | geomean speedup |", "|" + "---|" * (len(summary.fast_p) + 1),
              "| " + " | ".join(f"{v:.3f}" for v in summary.fast_p.values()) + f" | {summary.geomean_speedup:.3f}x |", ""]
    if summary.llm_tokens:
        lines += [f"LLM use: {summary.llm_tokens} tokens, ${summary.llm_usd:.4f}.", ""]
    lines += [f"- {n}" for n in summary.notes]
    return "\n".join(lines) + "\n"


def summary_html(summary: RunSummary) -> str:
    e = html.escape
    rows = []
    for o, row in zip(summary.problems, summary_rows(summary)):
        name = e(row[0])
        if o.report:
            rel = os.path.relpath(o.report, summary.run_dir)
            name = f'<a href="{e(rel)}">{name}</a>'
        rows.append("<tr><td>" + name + "</td>" + "".join(f"<td>{e(c)}</td>" for c in row[1:]) + "</tr>")
    fast = "".join(f"<th>{e(k)}</th>" for k in summary.fast_p)
    fast_vals = "".join(f"<td>{v:.3f}</td>" for v in summary.fast_p.values())
    notes = "".join(f"<li>{e(n)}</li>" for n in summary.notes)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kernelscout run {e(Path(summary.run_dir).name)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style>
</head><body>
<h1>kernelscout run: {e(Path(summary.run_dir).name)}</h1>
<p>Status: {e(summary.status)}. {len(summary.problems)} problems; {e(", ".join(f"{v} {k}" for k, v in summary.counts.items()))}.
{summary.measurements_used} measurements, {summary.candidates_considered} candidates considered, {summary.wall_s:.0f} s of running.
Each problem name links to its own report.</p>
<table><tr>{"".join(f"<th>{e(h)}</th>" for h in HEADERS)}</tr>
{chr(10).join(rows)}
</table>
<h2>Over all problems</h2>
<table><tr>{fast}<th>geomean speedup</th></tr><tr>{fast_vals}<td>{summary.geomean_speedup:.3f}x</td></tr></table>
<ul>{notes}</ul>
</body></html>
"""


def write_reports(path: Path, summary: RunSummary) -> None:
    """summary.json, summary.md and index.html in the top run directory; all three from the same RunSummary."""
    write_text_atomic(path / "summary.json", summary.model_dump_json(indent=2), durable=True)
    write_text_atomic(path / "summary.md", summary_markdown(summary), durable=True)
    write_text_atomic(path / "index.html", summary_html(summary), durable=True)
