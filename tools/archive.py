"""The archive: every candidate the search considered, its forecast, and (if measured) its measurement.

Forecasts and measurements sit side by side, so calibration can be recomputed at any time, and
a skipped candidate is recorded with the forecast that got it skipped.

A candidate the rule found worth measuring but that lost its place in the queue (more were worth
measuring than the loop keeps pending) is *shelved*, not skipped: no forecast judged it, so a
policy that ranks a whole space may propose it again once its model ranks it high again, and
re-adding it puts it back in the queue. Skipped, measured and failed candidates stay settled.

Archive writes commit with `durable=False` (see tools/rundir.py): every one is idempotent and a
resume re-derives it, while the measurement it points to lives in the durable ledger tables.
"""

from __future__ import annotations

import json
import time
from statistics import median
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from pydantic import BaseModel, Field

from kernelscout.tools.rundir import RunDir, has_column
from kernelscout.tools.schema import Measurement

SCHEMA = """
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sha TEXT NOT NULL UNIQUE,
    parent_id INTEGER,
    path TEXT,
    origin TEXT,
    params_json TEXT,
    hypothesis TEXT,
    features_json TEXT,
    iteration INTEGER,
    state TEXT NOT NULL DEFAULT 'proposed',
    measurement_id INTEGER,
    speedup REAL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS forecasts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    candidate_id INTEGER NOT NULL,
    iteration INTEGER,
    surrogate TEXT,
    forecast_json TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    created REAL NOT NULL,
    repeats INTEGER NOT NULL DEFAULT 0,
    first_iteration INTEGER,
    UNIQUE (candidate_id, iteration)
);
CREATE TABLE IF NOT EXISTS tool_forecasts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem_sha TEXT NOT NULL,
    candidate_sha TEXT NOT NULL,
    parent_sha TEXT,
    device TEXT,
    parent_speedup REAL NOT NULL,
    label TEXT,
    forecast_json TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS confirmations (
    label TEXT PRIMARY KEY,
    candidate_id INTEGER NOT NULL,
    measurement_id INTEGER,
    speedup REAL,
    ok INTEGER NOT NULL,
    created REAL NOT NULL
);
"""

# forecasts' columns newer than the table (ALTER TABLE adds them to an earlier run's)
_ADDED_FORECAST_COLUMNS = {"repeats": "INTEGER NOT NULL DEFAULT 0", "first_iteration": "INTEGER"}

ROOT_ID = 0  # the problem's own Model: speedup 1.0 by definition

# A best under 1% faster than the reference is not reported as a gain, nor written to best.py: re-measuring moves a
# speedup by more than that on a CPU (docs/benchmarks.md), and a tie (a sleep-bound problem, a kernel torch already
# calls) read as "1.003x" would be a claim no later measurement need bear out.
CLEAR_GAIN = 1.01


def clear_gain(speedup: Optional[float]) -> bool:
    return speedup is not None and speedup >= CLEAR_GAIN


class CandidateRecord(BaseModel):
    id: int
    sha: str
    parent_id: Optional[int] = None
    path: Optional[str] = None
    origin: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    hypothesis: str = ""
    features: dict[str, Any] = Field(default_factory=dict)
    iteration: int = 0
    state: str = "proposed"  # proposed | skipped | shelved | measured | failed | suspect | unconfirmed
    measurement_id: Optional[int] = None
    speedup: Optional[float] = Field(None, description="measured speedup over the reference (never a forecast)")

    @property
    def requeued(self) -> bool:
        """Queued again after a measurement that judged nothing (`Archive.requeue`), so it is timed anew."""
        return self.state == "proposed" and self.measurement_id is not None


def _row(r) -> CandidateRecord:
    return CandidateRecord(
        id=r[0], sha=r[1], parent_id=r[2], path=r[3], origin=r[4] or "", params=json.loads(r[5] or "{}"),
        hypothesis=r[6] or "", features=json.loads(r[7] or "{}"), iteration=r[8] or 0, state=r[9],
        measurement_id=r[10], speedup=r[11],
    )


_COLUMNS = "id, sha, parent_id, path, origin, params_json, hypothesis, features_json, iteration, state, measurement_id, speedup"
_COLUMNS_OF_C = ", ".join(f"c.{name.strip()}" for name in _COLUMNS.split(","))  # the same, in a join


class ParsedOnUse(Mapping):
    """A JSON object parsed the first time it is read. A long search forecasts the same waiting candidates again
    every iteration (150,000 forecasts for 400 measurements on an 11,000-configuration space), and a view
    of the run reads the few that decided a measurement: parsing all of them was most of `kscout show`'s time."""

    __slots__ = ("_text", "_value")

    def __init__(self, text: str) -> None:
        self._text, self._value = text, None

    def _parsed(self) -> dict:
        if self._value is None:
            self._value = json.loads(self._text)
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._parsed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())

    def __repr__(self) -> str:
        return repr(self._parsed())


class Archive:
    def __init__(self, run: RunDir):
        self.run = run
        self._parsed: dict[int, tuple[tuple, CandidateRecord]] = {}  # id -> (raw row, record); see _record
        run.create_tables(SCHEMA, durable=False)
        if not run.read_only:
            self._add_columns()

    def _add_columns(self) -> None:
        """Columns added since a run's tables were made, so an earlier run goes on (resumed, or read by this version)."""
        with self.run.transaction(durable=False) as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(forecasts)")}
            for column, kind in _ADDED_FORECAST_COLUMNS.items():
                if column not in have:
                    db.execute(f"ALTER TABLE forecasts ADD COLUMN {column} {kind}")

    def _forecast_column(self, db: Any, column: str, otherwise: str) -> str:
        """`f.column`, or `otherwise` (an SQL expression) in a run made before it and opened read-only."""
        return f"f.{column}" if has_column(db, "forecasts", column) else otherwise

    def add(self, sha: str, source: Optional[str], parent_id: Optional[int], origin: str, params: dict, hypothesis: str,
            features: dict, iteration: int) -> CandidateRecord:
        """Idempotent by content: proposing the same source twice gives the same record (a shelved one
        back in the queue)."""
        path = str(self.run.save_kernel(sha, source)) if source is not None else None
        with self.run.transaction(durable=False) as db:
            db.execute("UPDATE candidates SET state = 'proposed' WHERE sha = ? AND state = 'shelved'", (sha,))
            row = db.execute(f"SELECT {_COLUMNS} FROM candidates WHERE sha = ?", (sha,)).fetchone()
            if row is None:  # (an INSERT OR IGNORE would use up an id each time a known candidate comes back)
                db.execute(
                    "INSERT INTO candidates (sha, parent_id, path, origin, params_json, hypothesis, features_json, iteration, created)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (sha, parent_id, path, origin, json.dumps(params, default=str), hypothesis, json.dumps(features, default=str),
                     iteration, time.time()),
                )
                row = db.execute(f"SELECT {_COLUMNS} FROM candidates WHERE sha = ?", (sha,)).fetchone()
        return self._record(row)

    def _record(self, row: tuple) -> CandidateRecord:
        """Parse a row once: the loop re-reads the whole archive every iteration, and JSON decoding plus
        validation of unchanged rows was most of that. The raw row is compared, so any change is seen;
        records are shared between calls, so treat them as read-only."""
        hit = self._parsed.get(row[0])
        if hit is not None and hit[0] == row:
            return hit[1]
        rec = _row(row)
        # the path as recorded names the folder as the search was started (relative to where it was, say): the
        # archived file as it is now, wherever the run directory is reached from
        rec.path = self.run.kernel_path(rec.path)
        self._parsed[row[0]] = (tuple(row), rec)
        return rec

    def get(self, candidate_id: int) -> CandidateRecord:
        with self.run.connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
        if row is None:
            raise KeyError(f"no candidate #{candidate_id} in {self.run.path}")
        return self._record(row)

    def by_sha(self, sha: str) -> Optional[CandidateRecord]:
        with self.run.connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM candidates WHERE sha = ?", (sha,)).fetchone()
        return self._record(row) if row else None

    def all(self) -> list[CandidateRecord]:
        with self.run.connect() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM candidates ORDER BY id").fetchall()
        return [self._record(r) for r in rows]

    def shas(self, state: Optional[str] = None) -> set[str]:
        """Every candidate's content key, or those in one state."""
        with self.run.connect() as db:
            if state is None:
                return {r[0] for r in db.execute("SELECT sha FROM candidates")}
            return {r[0] for r in db.execute("SELECT sha FROM candidates WHERE state = ?", (state,))}

    def record_forecast(self, candidate_id: int, iteration: int, surrogate: str, forecast: dict, decision: str, reason: str) -> None:
        """A forecast that repeats the candidate's last decision (still deferred, shelved again) takes the place of
        the row that holds it, which counts it in `repeats`; `first_iteration` keeps where that row began. A
        candidate waiting in the queue is forecast again every iteration, and one row per forecast made run.db
        grow with the square of a long search (40 MB of forecasts at 400 measurements on gemm_RTX_3090, 29,332
        rows for 2,400 candidates), while what is read back is each candidate's latest forecast, the one it was
        measured on, and how many were made. A decision to measure always gets a row of its own."""
        row = (iteration, surrogate, json.dumps(forecast, default=str), decision, reason, time.time())
        with self.run.transaction(durable=False) as db:
            last = db.execute("SELECT id, iteration, decision FROM forecasts WHERE candidate_id = ? ORDER BY id DESC LIMIT 1",
                              (candidate_id,)).fetchone()
            if last is not None and last[1] == iteration:  # this iteration again (a resume): the forecast made now holds
                db.execute("UPDATE forecasts SET iteration = ?, surrogate = ?, forecast_json = ?, decision = ?, reason = ?,"
                           " created = ? WHERE id = ?", (*row, last[0]))
            elif last is not None and last[2] == decision and decision != "measure":
                db.execute("UPDATE forecasts SET iteration = ?, surrogate = ?, forecast_json = ?, decision = ?, reason = ?,"
                           " created = ?, repeats = repeats + 1, first_iteration = COALESCE(first_iteration, ?) WHERE id = ?",
                           (*row, last[1], last[0]))
            else:
                db.execute("INSERT INTO forecasts (candidate_id, iteration, surrogate, forecast_json, decision, reason, created,"
                           " first_iteration) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (candidate_id, *row, iteration))
            if decision in ("skip", "shelve"):
                state = "skipped" if decision == "skip" else "shelved"
                db.execute("UPDATE candidates SET state = ? WHERE id = ? AND state = 'proposed'", (state, candidate_id))

    def record_measurement(self, candidate_id: int, m: Measurement, suspect: bool = False) -> None:
        usable = m.usable
        state = "suspect" if (usable and suspect) else "measured" if usable else "failed"
        with self.run.transaction(durable=False) as db:
            db.execute(
                "UPDATE candidates SET state = ?, measurement_id = ?, speedup = ? WHERE id = ?",
                (state, m.measurement_id, m.speedup if usable else None, candidate_id),
            )

    def requeue(self, candidate_id: int) -> None:
        """Back to the queue: a candidate whose measurement judged nothing (its timing void because the machine
        was busy) is measured again; its earlier measurement stays in the ledger and its id on the record,
        which is what marks it `requeued` (a candidate never measured has none)."""
        with self.run.transaction(durable=False) as db:
            db.execute("UPDATE candidates SET state = 'proposed', speedup = NULL WHERE id = ?", (candidate_id,))

    def void_timings(self, reason_prefix: str) -> list[tuple[int, int]]:
        """(candidate id, how many charged measurements share its key) for each failed candidate whose latest
        measurement ran but whose timing was void for a reason starting with `reason_prefix`. Read from the
        ledger, not kept in memory, so a search killed between a void timing and its retry still retries."""
        with self.run.connect() as db:
            rows = db.execute(
                "SELECT c.id, (SELECT COUNT(*) FROM measurements o WHERE o.key = m.key AND o.charged = 1)"
                " FROM candidates c JOIN measurements m ON m.id = c.measurement_id"
                " WHERE c.state = 'failed' AND m.status = 'ok'"
                " AND substr(json_extract(m.result_json, '$.timing_invalid_reason'), 1, ?) = ? ORDER BY c.id",
                (len(reason_prefix), reason_prefix)).fetchall()
        return [(cid, times) for cid, times in rows]

    def failures(self, limit: int = 8) -> tuple[int, list[tuple[CandidateRecord, Measurement]]]:
        """(how many candidates' measurements did not count, the latest `limit` of them with their
        measurement): a failure's message, or what voided its timing, is what a user needs to fix it,
        and the candidate's file (or configuration) is what they open to do so."""
        with self.run.connect() as db:
            total = db.execute("SELECT COUNT(*) FROM candidates WHERE state = 'failed'").fetchone()[0]
            rows = db.execute(f"SELECT {_COLUMNS_OF_C}, m.result_json FROM candidates c JOIN measurements m ON m.id = c.measurement_id"
                              " WHERE c.state = 'failed' ORDER BY c.id DESC LIMIT ?", (limit,)).fetchall()
        return total, [(self._record(r[:-1]), Measurement.model_validate_json(r[-1])) for r in rows]

    def forecasts(self, lazy: bool = False) -> list[dict]:
        """Every forecast with the measured outcome next to it (None where the candidate was never measured).
        A row stands for `repeats` + 1 forecasts of its candidate in a row with the same decision, made from
        iteration `first_iteration` to `iteration`, and holds the latest of them (`record_forecast`).
        `lazy`: each row's "forecast" is a read-only mapping parsed when first read, for views that read few."""
        with self.run.connect() as db:
            repeats = self._forecast_column(db, "repeats", "0")
            first = self._forecast_column(db, "first_iteration", "f.iteration")
            rows = db.execute(
                "SELECT f.candidate_id, f.iteration, f.surrogate, f.forecast_json, f.decision, f.reason, c.state, c.speedup, c.parent_id,"
                f" {repeats}, COALESCE({first}, f.iteration) FROM forecasts f JOIN candidates c ON c.id = f.candidate_id ORDER BY f.id"
            ).fetchall()
        return [
            {"candidate_id": r[0], "iteration": r[1], "surrogate": r[2], "forecast": ParsedOnUse(r[3]) if lazy else json.loads(r[3]), "decision": r[4],
             "reason": r[5], "state": r[6], "measured_speedup": r[7], "parent_id": r[8], "repeats": r[9], "first_iteration": r[10]}
            for r in rows
        ]

    def last_abstention(self) -> Optional[dict]:
        """The search's latest uninformative forecast (the surrogate had nothing to go on), found by SQLite."""
        with self.run.connect() as db:
            row = db.execute("SELECT forecast_json FROM forecasts WHERE json_extract(forecast_json, '$.informative') = 0"
                             " ORDER BY id DESC LIMIT 1").fetchone()
        return json.loads(row[0]) if row else None

    def record_tool_forecast(self, problem_sha: str, candidate_sha: str, parent_sha: Optional[str], device: str,
                             parent_speedup: float, forecast: dict, label: str = "") -> None:
        """A forecast asked of the `predict` tool (MCP server, chat) about a file, kept so that a later
        measurement of that file can score it, as the search's forecasts are scored."""
        with self.run.transaction(durable=False) as db:
            db.execute("INSERT INTO tool_forecasts (problem_sha, candidate_sha, parent_sha, device, parent_speedup, label,"
                       " forecast_json, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (problem_sha, candidate_sha, parent_sha, device, parent_speedup, label, json.dumps(forecast, default=str),
                        time.time()))

    def tool_forecasts(self) -> list[dict]:
        """Every `predict` tool forecast, with the speedup of the first verified measurement of the same file
        (same problem and device) taken after it; None where there is none yet. Of several forecasts of
        one file against one parent that the same measurement answers, only the last counts: an agent
        that asks again before measuring should not weigh that measurement twice in the scores."""
        with self.run.connect() as db:
            rows = db.execute("SELECT problem_sha, candidate_sha, parent_sha, device, parent_speedup, label, forecast_json, created"
                              " FROM tool_forecasts ORDER BY id").fetchall()
            latest: dict[tuple, dict] = {}
            for psha, csha, parent, device, parent_speedup, label, fc, created in rows:
                later = db.execute("SELECT id, result_json FROM measurements WHERE problem_sha = ? AND candidate_sha = ? AND device = ?"
                                   " AND status = 'ok' AND created >= ? ORDER BY id", (psha, csha, device, created)).fetchall()
                usable = [(mid, m) for mid, m in ((r[0], Measurement.model_validate_json(r[1])) for r in later) if m.usable]
                answered_by = usable[0][0] if usable else None
                key = (psha, csha, parent, device, answered_by)  # unanswered ones too: asking again is one forecast
                latest.pop(key, None)  # re-inserted last, so the dict keeps the order of the forecasts that count
                latest[key] = {"label": label, "forecast": json.loads(fc), "parent_speedup": parent_speedup,
                               "measured_speedup": usable[0][1].speedup if usable else None}
        return list(latest.values())

    def record_confirmation(self, label: str, candidate_id: int, m: Measurement, ok: bool, void: bool = False) -> None:
        """A re-measurement of a chosen candidate; one that fails (wrong, invalid timing, below speed-of-light)
        takes the candidate out of "best", since its first measurement can no longer be trusted. A `void` one
        (its timing was taken while the machine was busy) judged nothing, so the candidate stays as it was."""
        with self.run.transaction(durable=False) as db:
            db.execute("INSERT OR IGNORE INTO confirmations (label, candidate_id, measurement_id, speedup, ok, created) VALUES (?, ?, ?, ?, ?, ?)",
                       (label, candidate_id, m.measurement_id, m.speedup if ok else None, int(ok), time.time()))
            if not ok and not void:
                db.execute("UPDATE candidates SET state = 'unconfirmed' WHERE id = ? AND state = 'measured'", (candidate_id,))

    def uncounted_confirmations(self, candidate_id: int) -> list[str]:
        """Why each re-measurement of a candidate that did not count failed, oldest first (its measurement's
        reason: an error, an invalid timing, or the machine was busy)."""
        with self.run.connect() as db:
            rows = db.execute("SELECT m.result_json FROM confirmations f JOIN measurements m ON m.id = f.measurement_id"
                              " WHERE f.candidate_id = ? AND f.ok = 0 ORDER BY f.created, f.label", (candidate_id,)).fetchall()
        out = []
        for (result,) in rows:
            m = Measurement.model_validate_json(result)
            out.append("its time was below speed-of-light" if m.usable else (m.unusable_reason or m.status.value))
        return out

    def confirmations_spent(self, cap: Optional[int]) -> int:
        """How many of the re-measurement slots belonging to this cap were spent (graph.py's labels; a void
        attempt, timed on a busy machine, leaves its slot open)."""
        with self.run.connect() as db:
            return db.execute("SELECT COUNT(*) FROM confirmations WHERE label LIKE ? AND label NOT LIKE '%:void:%'",
                              (f"confirm:{cap}:%",)).fetchone()[0]

    def void_confirmations(self, label: str) -> int:
        """Attempts at a re-measurement slot whose timing a busy machine voided."""
        with self.run.connect() as db:
            return db.execute("SELECT COUNT(*) FROM confirmations WHERE label LIKE ?", (f"{label}:void:%",)).fetchone()[0]

    def confirmation(self, label: str) -> Optional[int]:
        """The candidate a confirmation label was spent on, if it was."""
        with self.run.connect() as db:
            row = db.execute("SELECT candidate_id FROM confirmations WHERE label = ?", (label,)).fetchone()
        return row[0] if row else None

    def confirmations(self, candidate_id: int) -> list[tuple[int, float]]:
        """(measurement id, speedup) of a candidate's successful re-measurements, oldest first; the
        measurement that chose it is not among them."""
        with self.run.connect() as db:
            rows = db.execute("SELECT measurement_id, speedup FROM confirmations WHERE candidate_id = ? AND ok = 1 ORDER BY created, label",
                              (candidate_id,)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def reported_speedup(self, rec: CandidateRecord) -> Optional[float]:
        """The speedup to show for a candidate: the median of its re-measurements where it has any, since the
        measurement that made it the best was the largest of many noisy draws; else that measurement."""
        confirmed = [sp for _, sp in self.confirmations(rec.id)]
        return median(confirmed) if confirmed else rec.speedup

    def reported_runtime_ms(self, rec: CandidateRecord) -> Optional[float]:
        """The time to go with `reported_speedup`: the median of its re-measurements' times where it has any,
        else the time of the measurement that chose it."""
        return self._reported_ms(rec, "runtime_ms")

    def reported_reference_ms(self, rec: CandidateRecord) -> Optional[float]:
        """The reference's time in the same measurements as `reported_runtime_ms`: a speedup is the ratio of the two
        times of one measurement, and the run's median reference time, next to the best's, would not give it."""
        return self._reported_ms(rec, "ref_runtime_ms")

    def _reported_ms(self, rec: CandidateRecord, field: str) -> Optional[float]:
        ids = [mid for mid, _ in self.confirmations(rec.id)] or [rec.measurement_id]
        with self.run.connect() as db:
            rows = [db.execute("SELECT result_json FROM measurements WHERE id = ?", (mid,)).fetchone() for mid in ids if mid is not None]
        times = [t for row in rows if row and (t := getattr(Measurement.model_validate_json(row[0]), field)) is not None]
        return median(times) if times else None

    def best(self) -> Optional[CandidateRecord]:
        """The fastest candidate that was measured, verified and not suspect, by its reported speedup: a
        re-measured candidate competes with its re-measurements, not with the draw that first chose it."""
        confirmed = self._confirmed_medians()
        with self.run.connect() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM candidates WHERE state = 'measured' AND speedup IS NOT NULL"
                " AND id NOT IN (SELECT candidate_id FROM confirmations WHERE ok = 1) ORDER BY speedup DESC, id LIMIT 1"
            ).fetchone()
        best = self._record(row) if row else None
        top = max(sorted(confirmed), key=confirmed.__getitem__, default=None)
        if top is not None and (best is None or confirmed[top] > (best.speedup or 0.0)):
            return self.get(top)
        return best

    def reported_best(self) -> Optional[CandidateRecord]:
        """The candidate a finished search reports: once any candidate was re-measured, the best re-measured
        one, since a candidate measured once may only look faster by luck; else the best."""
        confirmed = self._confirmed_medians()
        if not confirmed:
            return self.best()
        return self.get(max(sorted(confirmed), key=confirmed.__getitem__))

    def _confirmed_medians(self) -> dict[int, float]:
        """Median re-measured speedup of each verified candidate that has one."""
        with self.run.connect() as db:
            rows = db.execute(
                "SELECT f.candidate_id, f.speedup FROM confirmations f JOIN candidates c ON c.id = f.candidate_id"
                " WHERE f.ok = 1 AND c.state = 'measured'").fetchall()
        by_id: dict[int, list[float]] = {}
        for cid, sp in rows:
            by_id.setdefault(cid, []).append(sp)
        return {cid: median(v) for cid, v in by_id.items()}

    def counts(self) -> dict[str, int]:
        with self.run.connect() as db:
            return dict(db.execute("SELECT state, COUNT(*) FROM candidates GROUP BY state").fetchall())
