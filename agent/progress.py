"""Live progress for a search: a budget bar and the last decisions on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

POLICY_ORDER = "the policy's order"  # a cold start's order where the predict event names none


class SearchProgress:
    def __init__(self, budget: int, title: str, console: Optional[Console] = None, live: Optional[bool] = None):
        self.console = console or Console(stderr=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.budget, self.title = budget, title
        self.used, self.best, self.considered = 0, 1.0, 0
        self.recent: deque[str] = deque(maxlen=6)
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} measurements"))
        self._task = self._bar.add_task(title, total=budget)
        self._live: Optional[Live] = None
        self._t0 = time.monotonic()
        self._order_said: Optional[str] = None  # a cold start's order, said in full once, then "the same order" (log only)

    def __enter__(self) -> "SearchProgress":
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def _render(self):
        info = Table.grid(padding=(0, 2))
        info.add_row(f"best so far: [bold]{self.best:.3f}x[/bold]", f"candidates considered: {self.considered}",
                     f"elapsed: {time.monotonic() - self._t0:.0f} s")
        lines = Table.grid()
        for line in self.recent:
            lines.add_row(line)
        return Group(self._bar, info, lines)

    def __call__(self, kind: str, data: dict) -> None:
        line = self._describe(kind, data)
        if line is None:
            return
        if self._live:
            self.recent.append(line)
            self._bar.update(self._task, completed=self.used)
            self._live.update(self._render())
        else:
            print(f"[{time.monotonic() - self._t0:7.1f}s] {line}", file=sys.stderr, flush=True)

    def _describe(self, kind: str, d: dict) -> Optional[str]:
        if kind == "propose":
            back = f", {d['revived']} shelved earlier and back" if d.get("revived") else ""
            return f"iteration from parent #{d['parent']}: {d['new']} new candidate{'' if d['new'] == 1 else 's'}{back}, {d['pending']} pending"
        if kind == "predict":
            self.considered = d.get("total_considered", self.considered)
            if d.get("uninformative") and d["uninformative"] == d["considered"]:  # nothing was forecast, so nothing chose
                why = f" ({clip_line(d['why_uninformative'], 240)})" if d.get("why_uninformative") else ""
                order = d.get("order") or POLICY_ORDER
                # the live view keeps its last few lines only, so there the first saying would scroll away: it says it each time
                said, self._order_said = order == self._order_said and self._live is None, order
                return f"{d['considered']} candidates, no usable forecast{why}: measuring {d['measure'] or 'none'} in " \
                       f"{'the same order' if said else order}"
            return f"forecast {d['considered']} candidates, measuring {d['measure'] or 'none'}"
        if kind in ("measure", "confirm") and d.get("cap"):  # raised mid-search with `kscout budget --set`
            self.budget = d["cap"]
            self._bar.update(self._task, total=self.budget)
        if kind == "measure":
            self.used = d.get("used", self.used)
            self.best = max(self.best, d.get("best") or self.best)
            sp = f" {d['speedup']:.3f}x" if d.get("speedup") else ""
            flag = " (timing not valid)" if d["status"] == "ok" and not d.get("timing_valid") else ""
            if d.get("suspect"):  # it does not count as the best: say why here, not only in events.jsonl
                flag += f" (suspect, not counted: {clip_line(d['suspect'])})"
            elif d.get("less_work"):  # under the reference's bound, and its own FLOPs explain it
                flag += " (under the reference's speed-of-light bound; its own FLOPs explain it: it does less work, counted)"
            # until something beats it, the best kernel is the reference itself: say so rather than print a bare 1.000x
            best = f"{self.best:.3f}x" if self.best > 1.0 else "still the reference"
            why = f" - {clip_line(d['why'])}" if d.get("why") else ""
            return f"measured #{d['candidate']}: {d['status']}{sp}{flag}; budget {self.used}/{self.budget}, best {best}{why}"
        if kind == "confirm":
            self.used = d.get("used", self.used)
            sp = f"{d['speedup']:.3f}x" if d.get("speedup") else d["status"]
            why = f" ({clip_line(d['why'])})" if d.get("why") else ""
            verdict = ("" if d.get("ok") else f": it stays the best, measured once{why}" if d.get("void")
                       else f": it no longer counts as the best{why}")
            return (f"re-measured the best, #{d['candidate']}: {sp} (the search measured {d['search_speedup']:.3f}x){verdict}; "
                    f"budget {self.used}/{self.budget}")
        if kind == "confirm_skipped":
            return f"best #{d['candidate']} not re-measured: {d['reason']}"
        if kind in ("surrogate_note", "policy_note"):
            return d["note"]
        if kind == "continue":
            return f"continuing a finished search: {d['reason']}"
        if kind in ("stop", "budget_exhausted"):
            return f"stop: {d.get('reason', 'budget spent')}"
        return None


def clip_line(text: str, limit: int = 160) -> str:
    """One line of a measurement's message for the log: `kscout show DIR` has it whole."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."
