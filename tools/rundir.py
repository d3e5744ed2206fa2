"""A run directory: the unit of persistence (SQLite for state, files for kernels and events).

Every write that matters is a SQLite transaction, so killing the process at any moment leaves
either the old state or the new one, never half of each.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'charged', 'released')),
    owner_pid INTEGER,
    owner_host TEXT,
    created REAL NOT NULL,
    settled REAL
);
CREATE INDEX IF NOT EXISTS ledger_key ON ledger(key);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ledger_id INTEGER,
    key TEXT NOT NULL,
    problem_sha TEXT,
    candidate_sha TEXT,
    problem_path TEXT,
    candidate_path TEXT,
    device TEXT,
    status TEXT NOT NULL,
    charged INTEGER NOT NULL,
    speedup REAL,
    result_json TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_key ON measurements(key);
"""


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "kernels").mkdir(exist_ok=True)
        self.db_path = self.path / "run.db"
        with self.connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.db_path, timeout=60.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=60000")
            yield db
        finally:
            db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock up front, so read-check-write sequences cannot interleave."""
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def get_meta(self, key: str) -> Optional[str]:
        with self.connect() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def event(self, kind: str, **data: Any) -> None:
        line = json.dumps({"ts": time.time(), "event": kind, "pid": os.getpid(), **data}, default=str)
        with open(self.path / "events.jsonl", "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def save_kernel(self, sha: str, source: str) -> Path:
        path = self.path / "kernels" / f"{sha[:16]}.py"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        return path
