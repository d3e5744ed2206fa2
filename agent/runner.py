"""Start or resume a search: resolve `auto` choices, prepare the run directory, run the loop, summarise."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.agent.graph import SearchSettings
from kernelscout.agent.search_spec import SOLVED_CHANCE
from kernelscout.agent.progress import SearchProgress
from kernelscout.agent.session import (OptimizeResult, SearchSpec, build_loop, change_limits, check_spec, load_spec, save_spec,
                                       summarise)
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir


class OptimizeError(Exception):
    """Bad arguments or an unusable problem; the message says what to do."""


class SearchPaused(OptimizeError):
    """The LLM provider failed mid-search (a key rejected, a service down): the run is left unfinished,
    so `kscout resume` goes on once that is fixed. `kscout run` stops there too, rather than failing
    every problem after it for the same reason."""


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a search. Every finished measurement is in the run directory already, and
    `kscout resume` adopts one that was in flight, so the message says where the run stands. Still a
    KeyboardInterrupt, so that callers that stop on one (a `kscout run` of many problems) still do."""

    def __init__(self, run_dir: Path, used: int, cap: Optional[int], in_flight: int = 0) -> None:
        of = f" of {cap}" if cap is not None else ""
        flight = f" ({in_flight} of them in flight, which the resume takes up without paying again)" if in_flight else ""
        super().__init__(f"interrupted after {used}{of} measurements; nothing measured is lost. "
                         f"Continue with: kscout resume {run_dir}{flight}")
        self.run_dir, self.used, self.cap = run_dir, used, cap


class Scaling(BaseModel):
    """Where measurements run. Stored in the run directory, so `kscout resume` uses the same workers."""

    workers: Optional[int] = Field(None, ge=1, description="local measurement workers, or Ray actors (default: one per GPU)")
    ray: Optional[str] = Field(None, description="Ray cluster address: auto, local, HOST:PORT or ray://HOST:PORT")
    replay_delay_s: float = Field(0.0, ge=0, description="simulated device seconds per replayed measurement (benchmarks)")

    @property
    def dispatched(self) -> bool:
        return self.workers is not None or self.ray is not None


SCALING_KEY = "scaling"


def _llm_configured() -> bool:
    try:
        from kernelscout.agent.llm import make_chat_model
    except ImportError:
        return False
    try:
        return make_chat_model() is not None
    except ValueError as exc:  # LLMConfigError: a provider was asked for (KSCOUT_PROVIDER, [llm]) but cannot work
        raise OptimizeError(f"{exc} (or --policy tuner to search offline)") from None


def _or(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def resolve_choices(policy: str, surrogate: str, space: bool = False) -> tuple[str, str, str]:
    """Pick the LLM when a provider is configured and the offline tuner otherwise, and say which.

    A recorded space has no code for an LLM to edit, so there `auto` is always the space search with
    the learned surrogate; `--surrogate llm` still asks the LLM to forecast from parameter values.
    """
    note = []
    if policy == "auto" and space:
        policy = "tuner"
        if _llm_configured():  # the user set up an LLM and may expect it here: say why it is not used
            note.append("policy: tuner (a recorded space has no code for an LLM to write; --surrogate llm has it forecast "
                        "the configurations)")
    elif policy == "auto":
        policy = "llm" if _llm_configured() else "tuner"
        note.append(f"policy: {policy} ({'an LLM provider is configured' if policy == 'llm' else 'no LLM provider configured'})")
    if surrogate == "auto":
        surrogate = "llm" if policy == "llm" else "learned"
        note.append(f"surrogate: {surrogate}")
    from kernelscout.agent.search_config import policy_choices, surrogate_choices

    if policy not in policy_choices():
        raise OptimizeError(f"unknown policy {policy!r}; use {_or(policy_choices())}")
    if surrogate not in surrogate_choices():
        raise OptimizeError(f"unknown surrogate {surrogate!r}; use {_or(surrogate_choices())}")
    from kernelscout.tools import plugins

    chosen = _plugin_choices(policy, surrogate)
    for kind, group, name in chosen:  # an installed package's: say whose
        ep = plugins.declared(group)[name]
        note.append(f"{kind}: {name} ({ep.value}, from {plugins.package_of(ep)})")
    for kind, group, name in (("policy", plugins.POLICIES, policy), ("surrogate", plugins.SURROGATES, surrogate)):
        ep = plugins.declared(group).get(name)
        if ep is not None and (kind, group, name) not in chosen:
            # built-in names win (tools/plugins.py); a lab that named its plugin `learned` must hear it is not used
            note.append(f"{kind}: {name} is the built-in one; {plugins.package_of(ep)} declares a {kind} of that name "
                        f"({ep.value}), not used: give it a name of its own in {group} to choose it")
    return policy, surrogate, "; ".join(note)


def _plugin_choices(policy: str, surrogate: str) -> list[tuple[str, str, str]]:
    """(kind, entry point group, name) of the choices that are not built in (nor `auto`): plugins by name."""
    from kernelscout.agent.search_config import BUILT_IN_POLICIES, BUILT_IN_SURROGATES
    from kernelscout.tools import plugins

    return [(kind, group, name) for kind, group, name, built_in in (
        ("policy", plugins.POLICIES, policy, BUILT_IN_POLICIES), ("surrogate", plugins.SURROGATES, surrogate, BUILT_IN_SURROGATES))
        if name != "auto" and name not in built_in]


def _problem_file(problem: str) -> Path:
    from kernelscout.sandbox.problem import InputFileError, problem_file

    try:
        path = problem_file(problem)
    except InputFileError as exc:  # a folder without problem.py
        raise OptimizeError(str(exc)) from None
    if not path.exists():
        raise OptimizeError(f"{problem}: no such problem file (pass a KernelBench .py file or a folder with problem.py)")
    return path.resolve()


def start_search(problem: Optional[str], space: Optional[str], budget: int, policy: str = "auto", surrogate: str = "auto",
                 device: str = "auto", run_dir: Optional[str] = None, seed: int = 0, proposals: int = 6, patience: int = 0,
                 max_wall: Optional[float] = None, warm_start: Optional[list[str]] = None, quiet: bool = False,
                 max_device_s: Optional[float] = None, max_usd: Optional[float] = None, max_llm_tokens: Optional[int] = None,
                 workers: Optional[int] = None, ray: Optional[str] = None, replay_delay_s: float = 0.0,
                 report: bool = True, start: Optional[list[str]] = None, confirm: Optional[int] = None,
                 history: Optional[list[str]] = None, rewrites: Optional[list[str]] = None,
                 solved_chance: Optional[float] = None, objective: str = "file") -> OptimizeResult:
    """`history`: folders of earlier runs for the learned surrogate's prior on a code problem (None, [] or
    ["none"]: no prior). `rewrites`: the generic rewrites the offline tuner may try, by name (None or ["all"]: every
    one that applies; ["none"]: none, so that only the TUNABLE knobs of the `start` kernels are tuned).
    `solved_chance`: a recorded space's stop (None: SOLVED_CHANCE); refused on a code problem, which has no such stop.
    `objective`: a recorded space's, "file" or "time" (`ReplaySpace.load`)."""
    if (problem is None) == (space is None):
        raise OptimizeError("give either a PROBLEM file or --space FILE.json.gz")
    from kernelscout.sandbox.objectives import OBJECTIVE_CHOICES

    if objective not in OBJECTIVE_CHOICES:
        raise OptimizeError(f"--objective {objective}: give file (the objective the cache names, where kscout can follow it) "
                            "or time (the recorded time per call)")
    if objective != "file" and space is None:
        raise OptimizeError("--objective chooses what a recorded space (--space) is searched for; a code problem's search "
                            "always minimises the measured time: leave the flag out")
    if solved_chance is not None and space is None:
        raise OptimizeError("--solved-chance stops a search of a recorded space (--space), whose every configuration the "
                            "surrogate can rank; a code problem's search has no such stop: leave the flag out")
    solved_chance = SOLVED_CHANCE if solved_chance is None else solved_chance
    if budget < 1:
        raise OptimizeError("--budget must be at least 1")
    if workers is not None and workers < 1:
        raise OptimizeError("--workers must be at least 1")
    if seed < 0:
        raise OptimizeError(f"--seed must be 0 or more, not {seed}")
    check_limits(proposals=proposals, patience=patience, max_wall=max_wall, max_device_s=max_device_s, max_usd=max_usd,
                 max_llm_tokens=max_llm_tokens, solved_chance=solved_chance)
    confirm = default_confirm(budget, space is not None) if confirm is None else confirm
    if confirm < 0:
        raise OptimizeError("--confirm must be 0 or more")
    if confirm >= budget:
        raise OptimizeError(f"--confirm {confirm} leaves nothing of --budget {budget} for the search; give "
                            + (f"0 to {budget - 1}" if budget > 1 else "--confirm 0, or a larger --budget"))
    scaling = Scaling(workers=workers, ray=ray, replay_delay_s=replay_delay_s)
    policy, surrogate, note = resolve_choices(policy, surrogate, space=space is not None)
    check_plugins(policy, surrogate)
    settings = SearchSettings(budget=budget, seed=seed, proposals_per_iteration=proposals, patience=patience, max_wall_s=max_wall, confirm=confirm,
                              max_device_s=max_device_s, max_usd=max_usd, max_llm_tokens=max_llm_tokens,
                              solved_chance=solved_chance)
    if space is not None:
        from kernelscout.sandbox.replay import resolve_space, space_hint

        space = str(resolve_space(space))
        warm_start = [str(resolve_space(w)) for w in warm_start or []]
        if not Path(space).exists():
            raise OptimizeError(f"{space}: no such recorded space{space_hint(space)}")
        if policy == "llm":
            raise OptimizeError("a recorded space has no code for an LLM to edit; use --policy tuner")
        if start:
            raise OptimizeError("--start gives a kernel file, and a recorded space has no code; leave --start out with --space")
        if _check_history(history):
            raise OptimizeError("--history reads earlier runs of code problems; for a recorded space give --warm-start")
        if rewrites:
            raise OptimizeError("--rewrites chooses rewrites of kernel code, and a recorded space has none; leave it out with --space")
        content = _check_space(space, warm_start or [], surrogate, objective)
        spec = SearchSpec(kind="space", path=str(Path(space).resolve()), device="replay", policy=policy, surrogate=surrogate,
                          settings=settings, warm_start=[str(Path(w).resolve()) for w in warm_start or []], objective=objective)
        name = Path(space).name.split(".json")[0]
    else:
        from kernelscout.tools.measure import resolve_device
        from kernelscout.sandbox.problem import InputFileError, load_problem, problem_name

        if warm_start:
            raise OptimizeError("--warm-start takes recorded spaces of the same kernel on other devices, for --space; for a "
                                "code problem, --history gives the surrogate earlier runs as a prior")
        path = _problem_file(problem)
        try:
            content = load_problem(path).sha
            device = _cluster_device(device, ray) if ray else resolve_device(device)
        except InputFileError as exc:
            raise OptimizeError(str(exc)) from None
        check_llm(policy, surrogate)
        from kernelscout.tools.plugins import device_kind

        kind = device_kind(device)[0]  # what it measures on, for the choices a CPU and a GPU differ in (rewrites, Triton)
        start = _check_start(start or [], budget, kind, quiet)
        spec = SearchSpec(kind="problem", path=str(path), device=device, policy=policy, surrogate=surrogate, settings=settings,
                          start=start, history=_check_history(history), rewrites=check_rewrites(rewrites, policy, start, kind))
        name = problem_name(path)
    run = _open_run(run_dir or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    _take_folder(run, spec)  # before the lock, so a refused folder is left as it was
    with _searching(run):
        _take_folder(run, spec, save=True)  # again under the lock: another search may have started here meanwhile
        _check_unchanged(run, spec, content)
        ledger = Budget(run)
        used = ledger.status().used
        notice = None
        if ledger.cap is None:
            ledger.set_cap(budget)
            if used:
                notice = f"{run.path} already holds {used} measurement(s), which count against --budget {budget}"
        elif ledger.cap != budget:
            notice = (f"{run.path} already has a budget of {ledger.cap} measurements ({used} used), which --budget {budget} "
                      f"does not change; `kscout budget {run.path} --set N` does")
        run.set_meta(SCALING_KEY, scaling.model_dump_json())
        _archive_start(run, spec)
        if not quiet:
            from rich.console import Console
            from rich.markup import escape

            console = Console(stderr=True)
            if notice:
                console.print(f"[yellow]note:[/yellow] {escape(notice)}", soft_wrap=True, highlight=False)
            if note:
                console.print(f"[dim]{note}[/dim]")
        return _run(run, spec, resume=False, quiet=quiet, report=report)


def _open_run(path: Path | str) -> RunDir:
    from kernelscout.tools.rundir import RunDirError

    try:
        return RunDir(path)
    except RunDirError as exc:
        raise OptimizeError(str(exc)) from None


def _take_folder(run: RunDir, spec: SearchSpec, save: bool = False) -> None:
    """Refuse a folder that holds another search, or measurements made outside one; `save`: store this search there."""
    try:
        (save_spec if save else check_spec)(run, spec)
    except ValueError as exc:
        raise OptimizeError(str(exc)) from None


@contextlib.contextmanager
def _searching(run: RunDir, resuming: bool = False):
    """One search at a time in a run directory (tools/runlock.py)."""
    from kernelscout.tools.budget import Budget
    from kernelscout.tools.runlock import MEASURING, RunBusy, exclusive, this_command

    try:
        with exclusive(run.path, this_command()):
            yield
    except RunBusy as exc:
        if exc.holder == MEASURING:  # name the measurements, from their reservations (none yet: not named)
            exc = RunBusy(exc.folder, exc.holder, Budget(run).in_flight(), resuming=resuming)
        raise OptimizeError(str(exc)) from None


_LIMIT_FLAGS = {"proposals": "--proposals", "patience": "--patience", "max_wall": "--max-wall",
                "max_device_s": "--max-device-seconds", "max_usd": "--max-usd", "max_llm_tokens": "--max-tokens",
                "solved_chance": "--solved-chance"}


def check_limits(**values: Any) -> None:
    """A cap of zero or less would stop a search at once (after spending what was in flight) and then
    blame the cap; say so before anything runs."""
    for name, value in values.items():
        if value is None:
            continue
        flag = _LIMIT_FLAGS[name]
        if name == "solved_chance":
            if not 0 <= value < 1:
                raise OptimizeError(f"{flag} is a chance, from 0 (never stop for it) to under 1, not {value}")
            continue
        if name == "patience" and value < 0:
            raise OptimizeError(f"{flag} must be 0 (never stop early) or more, not {value}")
        if name != "patience" and value <= 0:
            raise OptimizeError(f"{flag} must be more than 0, not {value}; leave it out for no limit" if name != "proposals"
                                else f"{flag} must be at least 1, not {value}")


def default_confirm(budget: int, space: bool) -> int:
    """One re-measurement of the best when the budget can spare it. A recorded space replays its own timings,
    whose search benchmark scores the configurations found, so it keeps the whole budget for the search."""
    return 0 if space or budget < 5 else 1


def _check_history(folders: Optional[list[str]]) -> Optional[list[str]]:
    """--history folders, resolved; "none" alone turns the prior off. A folder that is not there is an
    error: a mistyped path would otherwise silently give a search without its prior."""
    if folders is None:
        return None
    if [f.lower() for f in folders] == ["none"] or not folders:
        return []
    if any(f.lower() == "none" for f in folders):
        raise OptimizeError("--history none turns the prior off; give it alone, not with folders")
    missing = [f for f in folders if not Path(f).expanduser().is_dir()]
    if missing:
        raise OptimizeError(f"--history {missing[0]}: no such folder (give a folder of earlier run directories, or none)")
    return [str(Path(f).expanduser().resolve()) for f in folders]


def _check_start(paths: list[str], budget: int, device: str = "cpu", quiet: bool = True) -> list[str]:
    """The --start files, resolved, once each is a candidate module (defines ModelNew) and the budget can measure them all."""
    from kernelscout.sandbox.problem import InputFileError, load_candidate

    resolved: list[str] = []
    for p in paths:
        try:
            candidate = load_candidate(p)
        except InputFileError as exc:
            raise OptimizeError(f"--start {exc}") from None
        from kernelscout.agent.policies.tunables import TunableError, declares_space, parse_space

        if declares_space(candidate.source):  # its knobs are what the user wants tuned: a space that cannot be read
            try:                              # would cost a measurement and be found out only when it became a parent
                parse_space(candidate.source)
            except TunableError as exc:
                raise OptimizeError(f"--start {p}: its tunable space cannot be used: {exc}") from None
        if candidate.uses_triton and device.startswith("cpu") and not quiet:
            from rich.console import Console
            from rich.markup import escape

            Console(stderr=True).print(
                f"[yellow]note:[/yellow] {escape(p)} is a Triton kernel: on the CPU it runs in Triton's interpreter, so its "
                "correctness is checked but its timing is refused, and it still costs a measurement", soft_wrap=True, highlight=False)
        if str(Path(p).resolve()) not in resolved:
            resolved.append(str(Path(p).resolve()))
    if len(resolved) > budget:
        raise OptimizeError(f"--start gives {len(resolved)} kernels and each is measured, but --budget is {budget}; "
                            "raise the budget or give fewer")
    return resolved


def check_plugins(policy: str, surrogate: str, device: str = "auto") -> None:
    """Load a plugin policy, surrogate or device (tools/plugins.py) before a run directory is made or resumed, so that a
    package that is missing, or fails to import, is named at once rather than as a traceback from inside the loop."""
    from kernelscout.tools import plugins

    choices = _plugin_choices(policy, surrogate)
    if not plugins.BUILT_IN_DEVICE.match(device):
        choices.append(("device", plugins.DEVICES, device))
    for kind, group, name in choices:
        try:
            plugins.load(group, name)
            if group == plugins.DEVICES:
                plugins.device_kind(name)
        except KeyError:
            raise OptimizeError(f"--{kind} {name}: no installed package declares it (entry point group {group}); install the "
                                "package that provides it") from None
        except plugins.PluginError as exc:
            raise OptimizeError(str(exc)) from None


def check_rewrites(names: Optional[list[str]], policy: str, start: list[str], device: str) -> Optional[list[str]]:
    """--rewrites, read: None for every rewrite that applies, [] for none, else the names in the tuner's order.

    "none" is how a user says "tune only my kernel's knobs"; it is refused where it would leave nothing to
    tune (no --start kernel declares TUNABLE) or nothing that can be timed (Triton's knobs on the CPU)."""
    if not names:
        return None
    from kernelscout.agent.policies.rewrites import REWRITES

    given = [n.strip() for item in names for n in item.split(",") if n.strip()]
    words = [n.lower() for n in given]
    if words == ["all"]:
        return None
    if {"all", "none"} & set(words) and len(words) > 1:
        raise OptimizeError("--rewrites all or --rewrites none stands alone; to choose some rewrites, name them")
    if policy != "tuner":
        writes = "the llm policy writes its own candidates" if policy == "llm" else f"the {policy} policy makes its own"
        raise OptimizeError(f"--rewrites chooses what the offline tuner tries; {writes} (use --policy tuner, or leave --rewrites out)")
    if words == ["none"]:
        from kernelscout.agent.policies.tunables import declares_space
        from kernelscout.sandbox.problem import load_candidate

        knobs = [load_candidate(p) for p in start]
        knobs = [c for c in knobs if declares_space(c.source)]
        if not knobs:
            why = "no kernel was given with --start" if not start else "none of the --start kernels declares TUNABLE knobs"
            raise OptimizeError(f"--rewrites none leaves only the TUNABLE knobs of your --start kernels to tune, and {why}; "
                                "give one that declares them (README: tunable kernels), or leave --rewrites out")
        if device.startswith("cpu") and all(c.uses_triton for c in knobs):
            raise OptimizeError("--rewrites none would tune only Triton kernels' knobs, and on the CPU Triton runs in its "
                                "interpreter, whose timing is refused, so no setting could be told from another; tune them "
                                "on a GPU (--device cuda)")
        return []
    unknown = [n for n in given if n not in REWRITES]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(REWRITES), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise OptimizeError(f"--rewrites {unknown[0]}: no such rewrite{hint}; give all, none, or some of "
                            f"{', '.join(REWRITES)}")
    return [n for n in REWRITES if n in given]


def _archive_start(run: RunDir, spec: SearchSpec, resume: bool = False) -> None:
    """Put the user's kernels in the archive before the loop starts, so the loop measures them first.

    A resume adds those a kill stopped from being added, reading them from their files again;
    content addressing makes adding one twice a no-op.
    """
    if not spec.start:
        return
    from kernelscout.agent.policies.tuner import USER_ORIGIN, user_proposal
    from kernelscout.tools.archive import ROOT_ID, Archive
    from kernelscout.tools.plugins import device_kind

    archive = Archive(run)
    if resume and sum(r.origin == USER_ORIGIN for r in archive.all()) >= len(spec.start):
        return
    for path in spec.start:
        if resume and not Path(path).exists():
            raise OptimizeError(f"{path}: given with --start but gone before it was archived; put it back and resume")
        p = user_proposal(path, spec.path, device_kind(spec.device)[0])
        archive.add(p.sha, p.source, ROOT_ID, p.origin, p.params, p.hypothesis, p.features, iteration=0)


def _load_space(path: str, what: str, objective: str = "file"):
    from kernelscout.sandbox.replay import CacheFileError, ReplaySpace, space_files

    if Path(path).is_dir():
        inside = [str(f) for f in space_files(Path(path))]
        some = f"; in it: {', '.join(inside[:3])}{f' and {len(inside) - 3} more' if len(inside) > 3 else ''}" if inside else ""
        raise OptimizeError(f"{path}: a folder; {what} takes one Kernel Tuner cache file (.json or .json.gz){some} "
                            "(`kscout run FOLDER --budget N` searches every space in a folder, one after another)")
    if not Path(path).exists():
        from kernelscout.sandbox.replay import space_hint

        raise OptimizeError(f"{path}: no such recorded space ({what}){space_hint(path)}")
    try:
        return ReplaySpace.load(path, objective)
    except CacheFileError as exc:
        raise OptimizeError(f"{exc}; give {what} a cache file Kernel Tuner wrote, or its T4 results (.json or .json.gz)") from None


def _check_space(path: str, warm_start: list[str], surrogate: str, objective: str = "file") -> str:
    """Refuse, before a run directory exists, a recorded space (or prior) the search could not use; the space's
    content sha when it can."""
    space = _load_space(path, "--space", objective)
    if space.notes:
        from rich.console import Console

        err = Console(stderr=True)
        for note in space.notes:
            err.print(f"[dim]note: {note}[/dim]", soft_wrap=True)
    if not space.ok_mask.any():
        raise OptimizeError(f"{path}: no configuration in this space ran (all {len(space)} failed), so there is nothing "
                            "to search or to time a reference with; record the space on hardware where some run")
    for prior_path in warm_start:
        prior = _load_space(prior_path, "--warm-start", objective)
        same_file = Path(prior_path).resolve() == Path(path).resolve()
        if same_file or (prior.param_names == space.param_names and prior.configs == space.configs
                         and prior.device_name == space.device_name and np.array_equal(prior.times, space.times, equal_nan=True)):
            raise OptimizeError(f"{prior_path}: this is the space being searched, so as a prior it would hand the surrogate "
                                "every answer; --warm-start takes the same kernel recorded on another device")
        if set(prior.param_names) != set(space.param_names):
            raise OptimizeError(f"{prior_path}: its parameters ({', '.join(prior.param_names)}) differ from the space's "
                                f"({', '.join(space.param_names)}); --warm-start takes the same kernel recorded on another device")
        timed = int(prior.ok_mask.sum())
        if timed < 2:
            raise OptimizeError(f"{prior_path}: only {timed} of its configurations ran; a --warm-start prior needs at least "
                                "two timed configurations, so leave this one out")
    check_llm(policy="tuner", surrogate=surrogate)
    return space.content_sha


def check_llm(policy: str, surrogate: str) -> None:
    """Refuse, before a run directory exists, an LLM policy or surrogate with no usable provider: found
    only once the loop starts, it left a run that every `kscout resume` failed on the same way."""
    if "llm" not in (policy, surrogate):
        return
    from kernelscout.agent.llm import require_chat_model

    what, instead = ("the llm policy", "--policy tuner") if policy == "llm" else ("the llm surrogate", "--surrogate learned")
    try:
        require_chat_model(None, what)
    except ValueError as exc:  # LLMConfigError too: a provider asked for but not usable as configured
        raise OptimizeError(f"{exc} (or use {instead})") from None


def _cluster_device(device: str, address: str) -> str:
    """With --ray, `auto` means the cluster's GPUs if it has any: this machine may have none."""
    if device not in ("auto", "cpu", "cuda"):
        raise OptimizeError(f"with --ray, use --device auto, cpu or cuda (got {device!r}); Ray assigns each actor its GPU")
    if device != "auto":
        return device
    try:
        from kernelscout.sandbox.ray_pool import connect

        return "cuda" if connect(address).get("GPU", 0) > 0 else "cpu"
    except (ImportError, ValueError) as exc:
        raise OptimizeError(str(exc)) from None


def resume_search(run_dir: str, quiet: bool = False, *, max_usd: Optional[float] = None, max_llm_tokens: Optional[int] = None,
                  max_wall: Optional[float] = None, max_device_s: Optional[float] = None,
                  patience: Optional[int] = None, solved_chance: Optional[float] = None) -> OptimizeResult:
    """Go on with a search: one that was interrupted, or one that finished at its budget (after `kscout budget
    DIR --set N`) or at a limit given here higher than it was (`max_usd` ...; None keeps a limit as it is)."""
    check_limits(max_usd=max_usd, max_llm_tokens=max_llm_tokens, max_wall=max_wall, max_device_s=max_device_s, patience=patience,
                 solved_chance=solved_chance)
    if not Path(run_dir).is_dir():
        raise OptimizeError(f"{run_dir}: no such run directory")
    if not (Path(run_dir) / "run.db").exists():  # a search killed before it began, or a folder of something else
        raise OptimizeError(f"{run_dir}: not a run directory (no run.db), so nothing in it to resume; a search stopped "
                            "before it began leaves it so: start it again (`kscout optimize` or `kscout run` with this --run-dir)")
    run = _open_run(run_dir)
    try:
        spec = load_spec(run)
    except ValueError as exc:
        raise OptimizeError(str(exc)) from None
    check_plugins(spec.policy, spec.surrogate, spec.device)  # a run made with a plugin goes on with it, if still installed
    if solved_chance is not None and spec.kind != "space":
        raise OptimizeError(f"--solved-chance stops a search of a recorded space; {run_dir} searched a code problem, "
                            "whose search has no such stop: leave the flag out")
    if spec.kind == "space":
        content = _check_space(spec.path, spec.warm_start, spec.surrogate, spec.objective)
    else:
        content = _problem_content(spec.path)
        check_llm(spec.policy, spec.surrogate)
    with _searching(run, resuming=True):
        _check_unchanged(run, spec, content)
        spec = change_limits(run, spec, max_usd=max_usd, max_llm_tokens=max_llm_tokens, max_wall_s=max_wall,
                             max_device_s=max_device_s, patience=patience, solved_chance=solved_chance)
        _archive_start(run, spec, resume=True)
        return _run(run, spec, resume=True, quiet=quiet)


def _problem_content(path: str) -> str:
    """The sha of the problem a stored search was started on, read again; refused if it is gone or broken."""
    from kernelscout.sandbox.problem import InputFileError, load_problem

    try:
        return load_problem(path).sha
    except InputFileError as exc:
        raise OptimizeError(f"{exc} (this run searched it; put it back as it was to go on)") from None


def _check_unchanged(run: RunDir, spec: SearchSpec, content: str) -> None:
    """Refuse to go on with a search whose problem (or recorded space) has changed since it measured it.

    Every speedup in the folder, and the parent the search would build on, was measured against the earlier
    version; mixed with measurements of the new one they would compare kernels that solve different problems,
    and `best.py` could be a kernel that is wrong for the file as it is now."""
    with run.connect() as db:
        rows = db.execute("SELECT problem_sha, COUNT(*) FROM measurements GROUP BY problem_sha").fetchall()
    earlier = sum(n for sha, n in rows if sha != content)
    if earlier:
        what = "problem" if spec.kind == "problem" else "recorded space"
        raise OptimizeError(
            f"{spec.path}: this {what} has changed since {run.path} measured it ({earlier} measurement"
            f"{'s were' if earlier > 1 else ' was'} made against the earlier version, so its speedups and its best kernel "
            f"do not apply to the file as it is now); put the file back as it was to go on with this run, or start a new "
            f"run for the changed {what} (a new --run-dir)")


def _open_dispatcher(run: RunDir, spec: SearchSpec, quiet: bool):
    """Scale-out workers for this run, or nothing (measure in this process, one at a time)."""
    from kernelscout.tools.plugins import is_device_plugin

    saved = run.get_meta(SCALING_KEY)
    scaling = Scaling.model_validate_json(saved) if saved else Scaling()
    if not scaling.dispatched and not is_device_plugin(spec.device):
        return contextlib.nullcontext()
    from kernelscout.agent.dispatch import open_dispatcher

    try:
        dispatcher = open_dispatcher(run, spec.device, scaling.workers, scaling.ray, replay_delay_s=scaling.replay_delay_s)
    except (ImportError, ValueError) as exc:  # PluginError too: a device plugin that failed when made
        raise OptimizeError(str(exc)) from None
    if not quiet:
        from rich.console import Console

        Console(stderr=True).print(f"[dim]measuring on {dispatcher.describe()}[/dim]")
    return dispatcher


def _llm_errors() -> tuple[type[BaseException], ...]:
    """The LLM errors that stop a search unfinished (not the cost caps, which end it as a stop reason)."""
    try:
        from kernelscout.agent.llm import LLMConfigError, LLMUnavailableError
    except ImportError:  # no LLM SDKs installed: nothing can raise them
        return ()
    return (LLMConfigError, LLMUnavailableError)


def _paused(run: RunDir, exc: Exception, once: str) -> SearchPaused:
    """A search stopped by something outside it (the LLM provider, a plugin): where it stands and how to go on."""
    status = Budget(run).status()
    of = f" of {status.cap}" if status.cap is not None else ""
    return SearchPaused(f"{exc}\nThe search stopped after {status.used}{of} measurements; nothing measured is lost. "
                        f"Once {once}, continue with: kscout resume {run.path}")


def _run(run: RunDir, spec: SearchSpec, resume: bool, quiet: bool, report: bool = True) -> OptimizeResult:
    from kernelscout.sandbox.pool import WorkerPool
    from kernelscout.sandbox.slot import WorkersGone
    from kernelscout.tools.plugins import PluginError

    from kernelscout.sandbox.problem import problem_name

    title = problem_name(spec.path) if spec.kind == "problem" else Path(spec.path).name  # "softmax", not "problem.py"
    run.event("session_start", resume=resume)  # where this session's time begins (a multi-problem run's summary adds it)
    with WorkerPool() as pool, _open_dispatcher(run, spec, quiet) as dispatcher, \
            SearchProgress(Budget(run).status().cap or spec.settings.budget, title, live=False if quiet else None) as progress:
        try:
            loop = build_loop(run, spec, on_event=None if quiet else progress, pool=pool)
            if dispatcher is not None:
                loop.scale_out(dispatcher)
            state = loop.run_to_end(resume=resume)
        except PluginError as exc:  # an installed plugin broke its contract: the user's to fix, the run's to resume
            raise _paused(run, exc, "the plugin is fixed") from None
        except WorkersGone as exc:  # the device is down, not the candidates wrong: nothing more is spent on it
            raise _paused(run, exc, "the workers are back") from None
        except KeyboardInterrupt:
            status = Budget(run).status()
            raise SearchInterrupted(run.path, status.used, status.cap, status.reserved) from None
        except _llm_errors() as exc:  # a key rejected, a service down: the user's to fix, the run's to resume
            raise _paused(run, exc, "that is fixed") from None
    result = summarise(run, spec, state, notes=loop.target.space.notes if spec.kind == "space" else ())
    if report:  # benchmarks skip it (agent/bench.py): thousands of runs, nobody reads their reports
        from kernelscout.agent.report import write_report

        write_report(run.path, title=f"kernelscout: {title}")
    run.event("finished", **result.model_dump())
    return result
