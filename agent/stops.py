"""The reasons a search stops, in words for people and as a kind for scripts.

Kept apart from agent/graph.py (which imports LangGraph) so that `kscout show` and other light readers of a
finished run can name its stop without loading the search."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

BUDGET_SPENT = "measurement budget spent"
PROBLEM_UNUSABLE = "the problem cannot be measured"
"""Stop reason (followed by the measurement's message) when a measurement blames the problem, not the
candidate: a reference that raises fails every candidate the same way, so searching on wastes the run."""
RUN_DIR_UNUSABLE = "the run directory cannot be used"
"""Stop reason (followed by the measurement's message) when the run directory refused a measurement before anything
ran (a folder that can no longer be written to, say): nothing was charged, and the candidate waits for a resume."""
MACHINE_BUSY = "the machine is busy"
"""Stop reason when measurements in a row came back void because other processes held the worker's
cores (`sandbox.stats.busy_machine`): each was charged and none taught the search anything, so the rest
of the budget waits for `kscout resume` on an idle machine instead of going the same way."""
SOLVED = "nothing left is likely to beat the best"
"""Stop reason on a recorded space once the surrogate gives every configuration not yet measured, together, less than
`SearchSettings.solved_chance` of beating the best by a clear margin (`SpaceSearchPolicy.chance_left`). The rule that
skips single candidates needs 19 measured winners before it may skip any, which a search that found its optimum early
never sees: without this stop such a search measured a 500-configuration space whole under a budget of 600."""
SOLVED_AFTER = 20  # measurements before the stop above may act (`agent.graph.SearchLoop._solved`)
AT_SOL = "best kernel is within the speed-of-light margin"
NEAR_SOL = "of speed-of-light: a problem this close gets at most half the budget"
NOTHING_LEFT = "the policy has nothing left worth measuring"

StopKind = Literal["budget", "limit", "solved", "nothing_left", "speed_of_light", "near_speed_of_light", "machine_busy",
                   "problem_unusable", "run_dir_unusable"]


class Stop(BaseModel):
    """Why a search ended, for scripts: `stop_reason` says the same in words, and its wording may change."""
    kind: StopKind
    setting: Optional[str] = Field(None, description="the limit that stopped it (kinds limit and solved): a SearchSettings "
                                   "name such as patience, max_wall_s, max_usd or solved_chance")
    value: Optional[float] = Field(None, description="that limit's value when it stopped the search")
    chance: Optional[float] = Field(None, description="kind solved: the surrogate's chance, summed over the configurations "
                                    "not measured, that one beats the best by a clear margin (below `value`)")


def stop_of(reason: Optional[str], limit: Optional[dict] = None) -> Optional[Stop]:
    """The kind of a recorded stop (None: the search has not stopped). `limit` is the loop's `stop_limit`; runs
    recorded before it existed give the reason alone, and a solved stop is still told from its words."""
    reason, limit = reason or "", limit or {}
    if not reason:
        return None
    if limit.get("setting"):
        return Stop(kind="solved" if limit["setting"] == "solved_chance" else "limit", setting=limit["setting"],
                    value=limit.get("value"), chance=limit.get("chance"))
    kinds: list[tuple[bool, StopKind]] = [
        (reason == BUDGET_SPENT, "budget"), (reason.startswith(SOLVED), "solved"), (reason.startswith(NOTHING_LEFT), "nothing_left"),
        (reason == AT_SOL, "speed_of_light"), (NEAR_SOL in reason, "near_speed_of_light"),
        (reason.startswith(MACHINE_BUSY), "machine_busy"), (reason.startswith(PROBLEM_UNUSABLE), "problem_unusable"),
        (reason.startswith(RUN_DIR_UNUSABLE), "run_dir_unusable")]
    return next((Stop(kind=kind) for hit, kind in kinds if hit), None)


def recorded_stop(finished: Optional[dict]) -> Optional[Stop]:
    """The stop a `finished` event (or a summary) recorded; one from before results carried it is told from its words,
    and one of a kind this version does not know (written by a later one) is left out rather than fail the reader."""
    if not finished:
        return None
    if not finished.get("stop"):
        return stop_of(finished.get("stop_reason"))
    try:
        return Stop.model_validate(finished["stop"])
    except ValueError:
        return None
