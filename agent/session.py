"""Build a search from a stored spec, so `kscout optimize` and `kscout resume` construct the same loop."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from pydantic import BaseModel, Field

from kernelscout.agent.graph import PROBLEM_UNUSABLE, SOLVED, SearchLoop, considered_count, considered_per_measurement
from kernelscout.agent.run_view import surrogate_notes
from kernelscout.agent.search_spec import SPEC_KEY, SearchSpec
from kernelscout.agent.stops import Stop, stop_of
from kernelscout.tools.archive import CLEAR_GAIN, Archive, clear_gain
from kernelscout.tools.budget import Budget
from kernelscout.tools.rundir import RunDir, read_events


class OptimizeResult(BaseModel):
    status: Literal["finished", "failed"]
    stop_reason: Optional[str] = None
    stop: Optional[Stop] = Field(None, description="the stop as data: its kind and, where a limit caused it, the setting")
    best_speedup: Optional[float] = Field(None, description="measured speedup of the best verified kernel over the reference: "
                                          "the median of its re-measurements where it was confirmed, else the measurement that chose it")
    search_speedup: Optional[float] = Field(None, description="the measurement that made it the best, as the search saw it")
    confirmed_speedups: list[float] = Field(default_factory=list, description="its re-measurements after the search stopped (--confirm)")
    best_runtime_ms: Optional[float] = None
    best_path: Optional[str] = None
    measurements_used: int = 0
    candidates_considered: int = 0
    considered_per_measurement: float = 0.0
    run_dir: str
    policy: str
    surrogate: str
    device: str
    llm_tokens: int = Field(0, description="tokens the search's LLM calls used, prompts and replies (0 offline)")
    llm_usd: float = Field(0.0, description="what they cost at the configured prices")
    message: str = ""
    notes: list[str] = Field(default_factory=list, description="what the input says that the search does not use as written "
                             "(a recorded space's objective it does not follow or follows for equal work, records it replays as "
                             "failures, ...)")
    continue_with: Optional[str] = Field(None, description="the command that lets a search stopped by its budget or "
                                                           "a limit go on, with a value for it")


def save_spec(run: RunDir, spec: SearchSpec) -> None:
    check_spec(run, spec)
    run.set_meta(SPEC_KEY, spec.model_dump_json())


# The limits a user may change when resuming (`kscout resume DIR --max-usd X`): each setting with its flag.
# Changing one changes no measurement, so unlike the rest of the spec it is not fixed at the start.
LIMIT_FLAGS = {"max_usd": "--max-usd", "max_llm_tokens": "--max-tokens", "max_wall_s": "--max-wall",
               "max_device_s": "--max-device-seconds", "patience": "--patience", "solved_chance": "--solved-chance"}


def check_spec(run: RunDir, spec: SearchSpec) -> None:
    """Refuse a folder that holds something else. Measurements made there outside a search (`kscout measure`,
    the MCP server, the chat) would be charged to this search's budget and shown as its own; a different
    search would be mixed with this one. Reads only, so it can run before the folder is locked or changed."""
    existing = run.get_meta(SPEC_KEY)
    if existing:
        differences = spec_differences(SearchSpec.model_validate_json(existing), spec)
        if differences:
            raise ValueError(_different_search(run, differences))
        return
    used = Budget(run).status().used
    if used:
        raise ValueError(f"{run.path} already holds {used} measurement{'s' if used > 1 else ''} made outside a search "
                         "(`kscout measure`, the MCP server or the chat), which this search would count as its own; pick a "
                         f"new --run-dir (`kscout show {run.path}` lists what is there)")


# Each stored setting by the flag that sets it, to name a difference as the user typed it.
SPEC_NAMES = {"kind": "kind of search", "path": "file searched", "device": "--device", "policy": "--policy",
              "surrogate": "--surrogate", "budget": "--budget", "proposals_per_iteration": "--proposals",
              "confirm": "--confirm", "seed": "--seed", "warm_start": "--warm-start", "start": "--start",
              "history": "--history", "objective": "--objective", **LIMIT_FLAGS}


def spec_differences(stored: SearchSpec, asked: SearchSpec) -> dict[str, tuple[Any, Any]]:
    """Setting -> (stored value, asked value) for each one that differs, settings' fields at the top level."""
    def flat(spec: SearchSpec) -> dict[str, Any]:
        fields = spec.model_dump()
        settings = fields.pop("settings")
        return {**fields, **settings}

    before, after = flat(stored), flat(asked)
    return {name: (before[name], value) for name, value in after.items() if before.get(name) != value}


def _different_search(run: RunDir, differences: dict[str, tuple[Any, Any]]) -> str:
    what = "; ".join(f"{SPEC_NAMES.get(name, name)} {_shown(old)} there, {_shown(new)} here"
                     for name, (old, new) in differences.items())
    if set(differences) == {"budget"}:
        budget = differences["budget"][1]
        # a search that stopped as solved would stop again at once: the resume must lift that stop too
        lift = " --solved-chance 0" if _last_stop(run).startswith(SOLVED) else ""
        todo = (f"to go on with it under the new budget: `kscout budget {run.path} --set {budget} && kscout resume "
                f"{run.path}{lift}`, or give a new --run-dir")
    else:
        todo = f"use `kscout resume {run.path}` to go on with it, or a new --run-dir"
    return f"{run.path} already holds a different search ({what}); {todo}"


def _last_stop(run: RunDir) -> str:
    """The reason the search in `run` last stopped, from its event log ("" if it never stopped)."""
    reasons = [e.get("reason") or "" for e in read_events(run.path / "events.jsonl") if e.get("event") == "stop"]
    return reasons[-1] if reasons else ""


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "none"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def change_limits(run: RunDir, spec: SearchSpec, **limits: Any) -> SearchSpec:
    """The stored search with new values for the limits given (None: leave it as it is), saved."""
    update = {name: value for name, value in limits.items() if value is not None}
    unknown = set(update) - set(LIMIT_FLAGS)
    if unknown:
        raise ValueError(f"not a limit a resume can change: {', '.join(sorted(unknown))}")
    if not update:
        return spec
    changed = spec.model_copy(update={"settings": spec.settings.model_copy(update=update)})
    run.set_meta(SPEC_KEY, changed.model_dump_json())
    return changed


def load_spec(run: RunDir) -> SearchSpec:
    text = run.get_meta(SPEC_KEY)
    if not text and run.get_meta("chat_problem"):  # cli_chat.PROBLEM_META: the folder of a chat session
        raise ValueError(f"{run.path} holds a `kscout chat` session, not a search; continue it with "
                         f"`kscout chat --run-dir {run.path}`")
    if not text:
        raise ValueError(f"{run.path} holds no search to resume (no {SPEC_KEY} in run.db)")
    return SearchSpec.model_validate_json(text)


def build_loop(run: RunDir, spec: SearchSpec, on_event: Optional[Callable[[str, dict], None]] = None, pool: Any = None) -> SearchLoop:
    from kernelscout.agent.factory import make_policy, make_predictor, make_target

    target = make_target(spec, run, pool)
    policy = make_policy(spec, target)
    predictor = make_predictor(spec, target)
    if hasattr(policy, "attach_forecaster"):
        policy.attach_forecaster(predictor)  # a policy that can enumerate its space ranks it with the surrogate
    return SearchLoop(run, target, policy, predictor, spec.settings, on_event=on_event)


def _best_config_record(run: RunDir, archive: Archive, spec: SearchSpec, best: Any, best_ms: Optional[float],
                        speedup: Optional[float], confirmed: list[float]) -> dict:
    """best.json of a recorded space: the configuration and, beside its figures, what they are (a speedup over
    the configuration the seed drew, timings recorded on another machine and replayed), so the file read alone
    is not misread."""
    from kernelscout.agent.targets import REPLAY_REFERENCE_KEY

    drawn = run.get_meta(REPLAY_REFERENCE_KEY)
    with run.connect() as db:
        row = db.execute("SELECT device FROM measurements WHERE id = ?", (best.measurement_id,)).fetchone()
    return {"config": best.params, "runtime_ms": best_ms, "speedup": speedup, "search_speedup": best.speedup,
            "confirmed_speedups": confirmed, "reference_ms": archive.reported_reference_ms(best),
            "reference_config": json.loads(drawn) if drawn else None, "seed": spec.settings.seed,
            "device": row[0] if row else None, "space": spec.path,
            "note": ("speedup = reference_ms / runtime_ms: the configuration the seed drew against this one, timed together; "
                     "the times are the recorded space's, replayed (no kernel ran)")}


def summarise(run: RunDir, spec: SearchSpec, state: dict, notes: Sequence[str] = ()) -> OptimizeResult:
    """`notes`: what the input said that the search did not use as written (a recorded space's `notes`)."""
    archive = Archive(run)
    used = Budget(run).status().used
    considered = considered_count(archive)
    best = archive.reported_best()
    best_path, best_ms = None, None
    confirmations = archive.confirmations(best.id) if best else []
    confirmed = [sp for _, sp in confirmations]
    speedup = archive.reported_speedup(best) if best else None
    if best is not None:
        best_ms = archive.reported_runtime_ms(best)
        for stale in ("best.py", "best.json"):  # a later re-measurement can take the lead away from it
            (run.path / stale).unlink(missing_ok=True)
        if not clear_gain(speedup):
            pass  # nothing clearly beat the reference: a best.py would be a regression (or a tie) waiting to be copied
        elif best.path:
            best_path = str(run.path / "best.py")
            shutil.copyfile(best.path, best_path)
        else:
            best_path = str(run.path / "best.json")
            Path(best_path).write_text(json.dumps(_best_config_record(run, archive, spec, best, best_ms, speedup, confirmed),
                                                  indent=2, default=str))
    if best is None:
        message = "no candidate beat or matched the reference with a verified, valid timing; the reference stands"
        failed, latest = archive.failures(limit=1)
        if failed and latest:  # what to fix is what the user needs, not only that nothing counted
            why = (latest[0][1].unusable_reason or latest[0][1].status.value).splitlines()[0]
            message += f" ({failed} measured candidate(s) did not count; the last: {why})"
    elif speedup <= 1.0:
        message = f"nothing beat the reference: the best verified candidate ran at {speedup:.3f}x"
    elif not clear_gain(speedup):
        message = (f"nothing clearly beat the reference: the best verified candidate ran at {speedup:.4f}x, less than "
                   f"{CLEAR_GAIN - 1:.0%} faster, which re-measuring can undo; the reference stands and no best.py is written")
    else:
        message = f"best verified kernel: {speedup:.3f}x over the reference"
    if best is not None:
        message += confirmation_note(best.speedup, confirmed, spec.settings.confirm, archive.uncounted_confirmations(best.id))
        challenger = archive.best()
        if challenger is not None and challenger.id != best.id:
            message += (f"; #{challenger.id} measured {challenger.speedup:.3f}x once, not re-measured "
                        "(raise the budget and resume to check it)")
    stop_reason = state.get("stop_reason") or ""
    unusable = stop_reason.startswith(PROBLEM_UNUSABLE)
    if unusable and spec.kind == "space":  # a recorded space is replayed as it was recorded: what failed is a proposal
        message = (f"{PROBLEM_UNUSABLE} (below): the {spec.policy} policy proposed a configuration the recorded space cannot "
                   "replay; a policy for a recorded space proposes its configurations (target.space.configs)")
    elif unusable:
        message = f"{PROBLEM_UNUSABLE} (below); fix the problem file (`kscout measure PROBLEM CANDIDATE` shows the error), then start a new run"
    return OptimizeResult(
        status="failed" if unusable else "finished", stop_reason=state.get("stop_reason"),
        stop=stop_of(state.get("stop_reason"), state.get("stop_limit")), best_speedup=speedup, search_speedup=best.speedup if best else None,
        confirmed_speedups=confirmed, best_runtime_ms=best_ms, best_path=best_path,
        measurements_used=used, candidates_considered=considered,
        considered_per_measurement=round(considered_per_measurement(archive, used), 3), run_dir=str(run.path),
        policy=spec.policy, surrogate=spec.surrogate, device=spec.device, message=message, **_llm_use(run),
        notes=list(notes) + surrogate_notes(spec.surrogate, archive.forecasts(lazy=True) if spec.surrogate == "llm" else []),  # the table read only where it can say something
        continue_with=None if unusable else continue_command(run, state),
    )


def continue_command(run: RunDir, state: dict) -> Optional[str]:
    """How to search on after a stop the user's own numbers caused: the budget, or a limit given at the start.
    The value offered is twice the old one (any larger one works). Other stops (nothing left worth measuring,
    speed of light reached) have nothing to raise."""
    import shlex

    from kernelscout.agent.stops import BUDGET_SPENT, MACHINE_BUSY

    where = shlex.quote(str(run.path))  # copied into a shell as it is printed

    if (state.get("stop_reason") or "").startswith(MACHINE_BUSY):
        ledger = Budget(run).status()
        if ledger.cap is not None and ledger.remaining == 0:  # timing the void candidates again needs room
            return f"kscout budget {where} --set {2 * ledger.cap} && kscout resume {where}"
        return f"kscout resume {where}"
    if state.get("stop_reason") == BUDGET_SPENT:
        cap = Budget(run).status().cap
        return f"kscout budget {where} --set {2 * cap} && kscout resume {where}" if cap else None
    limit = state.get("stop_limit") or {}
    flag, value = LIMIT_FLAGS.get(limit.get("setting", "")), limit.get("value")
    if flag is None or value is None:
        return None
    if limit.get("setting") == "solved_chance":  # lowered, not raised, to go on; 0 measures on to the budget
        return f"kscout resume {where} {flag} 0"
    doubled = 2 * value
    return f"kscout resume {where} {flag} {doubled if isinstance(doubled, int) else format(doubled, 'g')}"


def _llm_use(run: RunDir) -> dict:
    """The run's LLM meter as stored (agent/factory.py keeps it in run.db, so a resume adds to it)."""
    from kernelscout.agent.llm_pricing import stored_usage

    usage = stored_usage(run)
    if usage is None:
        return {}
    return {"llm_tokens": usage.total_tokens, "llm_usd": round(usage.cost_usd, 6)}


def confirmation_note(search_speedup: float, confirmed: list[float], wanted: int, uncounted: Optional[list[str]] = None) -> str:
    """How far to trust the reported speedup: a best measured once is reported at the draw that made it the best,
    which reads high, so the line says so. Nothing that failed to beat the reference is re-measured (graph.py).
    `uncounted`: why its re-measurements that did not count failed (a busy machine voids one without judging)."""
    if confirmed:
        again = "re-measured" if len(confirmed) == 1 else f"median of {len(confirmed)} re-measurements"
        return f" ({again}; {search_speedup:.3f}x when the search chose it)"
    if search_speedup <= 1.0:
        return ""
    if uncounted:
        from kernelscout.agent.progress import clip_line

        return f" (measured once: its re-measurement did not count: {clip_line(uncounted[-1])})"
    if wanted:
        return " (not re-measured: no budget was left to confirm it)"
    return " (measured once, not re-measured: --confirm was 0)"
