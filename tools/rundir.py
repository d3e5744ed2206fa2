"""A run directory: the unit of persistence (SQLite for state, files for kernels and events).

Every write that matters is a SQLite transaction, so killing the process at any moment leaves
either the old state or the new one, never half of each.

Durability comes in two grades. The budget ledger and measurement records are written with
`synchronous=FULL` (an fsync per commit): they must survive even an OS crash, because a lost
record could mean paying for a measurement twice. Bookkeeping that is re-derived idempotently
after a resume (the archive's candidates and forecasts) commits with `durable=False`, i.e.
`synchronous=NORMAL` in WAL mode: still atomic and safe against kill -9, only an OS crash could
drop the last few commits. Each thread keeps one open connection per run directory, because
opening and closing one per call (with the WAL checkpoint a last close does) cost more than the
queries themselves.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from kernelscout.tools.atomic import write_text_atomic

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'charged', 'released')),
    owner_pid INTEGER,
    owner_host TEXT,
    owner_start TEXT,
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


SQLITE_MAX_PATH = 512  # SQLite's longest file name on Unix (SQLITE_MAX_PATHNAME), the database's journals included
MULTI_PROBLEM_MARK = "headless.db"  # the state of a `kscout run` (agent/headless.py), whose own searches are below it


class RunDirError(ValueError):
    """A run directory that cannot be one; the message says what to give instead."""


def _logs(db_path: Path) -> tuple[Path, Path]:
    return db_path.with_name(db_path.name + "-wal"), db_path.with_name(db_path.name + "-shm")


def _reader_makes_logs(db_path: Path) -> bool:
    """Whether a read-only connection opened now would leave files behind: a reader of a WAL database makes its
    -shm and -wal when they are missing, and as a reader it cannot remove them again. Only in a folder it may
    write to; elsewhere nothing can be made (the database is then read as immutable or from a copy)."""
    return not any(p.exists() for p in _logs(db_path)) and os.access(db_path.parent, os.W_OK)


def _remove_reader_logs(db_path: Path, readers: list[sqlite3.Connection]) -> None:
    """Close `readers`, then let SQLite itself remove the -shm and -wal they made: the last connection to close a
    WAL database deletes both, and a read-write one can. It reads one row and writes nothing (the log it made is
    empty); while any other process has the database open (a search started meanwhile), SQLite leaves them."""
    for db in readers:
        db.close()
    readers.clear()
    wal, _ = _logs(db_path)
    try:
        if wal.is_file() and wal.stat().st_size == 0:
            db = sqlite3.connect(f"{db_path.absolute().as_uri()}?mode=rw", uri=True, timeout=0.1, isolation_level=None)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchall()
            finally:
                db.close()
    except (OSError, sqlite3.Error):
        pass  # tidying only: the files are SQLite's own and harmless


@contextmanager
def reading(db_path: Path | str, timeout: float = 5.0) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a run's database, closed on leaving the block, which leaves no -shm or -wal
    behind that were not there before. `with sqlite3.connect(...)` only commits; on Python 3.11 the connection
    then stays open until a later cyclic garbage collection (seen here: one file descriptor per run read, until
    `gc.collect()`), holding the database open long after the read."""
    db_path = Path(db_path)
    tidy = _reader_makes_logs(db_path)
    db = sqlite3.connect(f"{db_path.absolute().as_uri()}?mode=ro", uri=True, timeout=timeout)
    try:
        yield db
    finally:
        if tidy:
            _remove_reader_logs(db_path, [db])
        else:
            db.close()


def has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    """Whether `table` has `column`: a run made by an earlier version may lack one added since."""
    return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))


class RunDir:
    """`read_only=True` opens an existing run for reading only: nothing is created or written, and a folder
    that cannot be written to (a colleague's run, an archive, a read-only mount) can still be read."""

    def __init__(self, path: Path | str, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path} is a file, not a folder; give the run directory as a folder (new or earlier)")
        if (self.path / MULTI_PROBLEM_MARK).is_file():  # what is written here could not be reached again
            raise RunDirError(f"{self.path} is a multi-problem run (kscout run), whose searches are in "
                              f"{self.path / 'problems'}/NAME, each taking only its own measurements; give another folder "
                              f"(`kscout show {self.path}` reads the run, `kscout resume {self.path}` goes on with it)")
        self.db_path = self.path / "run.db"
        self._local = threading.local()
        longest = len(str(self.db_path.absolute())) + len("-journal")
        if longest > SQLITE_MAX_PATH:  # SQLite's own message ("unable to open database file") would blame the folder
            raise RunDirError(f"{self.path} is too long a path for the run's database ({longest} characters with its file "
                              f"names, SQLite takes at most {SQLITE_MAX_PATH}); give a shorter path")
        if read_only:
            if not self.db_path.is_file():
                raise RunDirError(f"{self.path} holds no run.db: give the run directory that `kscout optimize` printed")
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "kernels").mkdir(exist_ok=True)
            self.create_tables(SCHEMA)
            self._add_ledger_columns()
        except (OSError, sqlite3.OperationalError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise RunDirError(f"{self.path} cannot be used as a run directory ({reason}); "
                              "give a folder you can write to") from None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key in ("_local", "_tidy_readers", "_tidy"):  # connections stay with the process and thread that opened them
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _connection(self, durable: bool) -> sqlite3.Connection:
        local = self._local
        db = getattr(local, "db", None)
        if db is None or local.pid != os.getpid():
            if self.read_only:
                db = self._reader()
            else:
                db = sqlite3.connect(self.db_path, timeout=60.0, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA busy_timeout=60000")
            local.db, local.pid, local.sync = db, os.getpid(), None
        want = "FULL" if durable else "NORMAL"
        if local.sync != want and not db.in_transaction and not self.read_only:
            db.execute(f"PRAGMA synchronous={want}")
            local.sync = want
        return db

    def _reader(self) -> sqlite3.Connection:
        """A read-only connection. A WAL database wants its -shm file, which a reader creates if it is missing;
        in a folder it cannot write to, the database is read as immutable instead (a run no process is
        writing to), or, where its log still holds commits, from a private copy of both."""
        uri = self.db_path.absolute().as_uri()
        try:
            tidy = _reader_makes_logs(self.db_path)
            # check_same_thread off: the tidying below closes it from whichever thread collects this RunDir
            db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60.0, isolation_level=None, check_same_thread=False)
            if tidy:  # the files it makes go when this RunDir does (or at exit)
                readers = self.__dict__.setdefault("_tidy_readers", [])
                readers.append(db)
                if "_tidy" not in self.__dict__:
                    self._tidy = weakref.finalize(self, _remove_reader_logs, self.db_path, readers)
            db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
            return db
        except sqlite3.OperationalError as exc:
            if os.access(self.path, os.W_OK):
                raise RunDirError(f"{self.db_path} cannot be read ({exc})") from None
        except sqlite3.DatabaseError as exc:  # not SQLite at all, or damaged
            raise RunDirError(f"{self.db_path} is not a run's database ({exc}); give the run directory that `kscout "
                              "optimize` printed") from None
        log, _ = _logs(self.db_path)
        if log.is_file() and log.stat().st_size:
            # commits still in the log (its writer did not close cleanly): read a copy of both, which SQLite
            # can open as a WAL database, rather than the database file alone, which lacks them
            import shutil
            import tempfile

            self._snapshot = tempfile.TemporaryDirectory(prefix="kscout-read-")  # removed with this object
            copy = Path(self._snapshot.name) / self.db_path.name
            shutil.copyfile(self.db_path, copy)
            shutil.copyfile(log, copy.with_name(log.name))
            db = sqlite3.connect(copy, isolation_level=None)
        else:
            db = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
        db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
        return db

    def _add_ledger_columns(self) -> None:
        """`owner_start` (tools/budget.py) on a ledger made before it, so an earlier run goes on."""
        with self.connect() as db:
            if not has_column(db, "ledger", "owner_start"):
                try:
                    db.execute("ALTER TABLE ledger ADD COLUMN owner_start TEXT")
                except sqlite3.OperationalError as exc:  # another process added it in between
                    if "duplicate column" not in str(exc):
                        raise

    def create_tables(self, schema: str, durable: bool = True) -> None:
        """Create the tables of `schema` that are missing. Read-only, the missing ones are made empty and
        temporary, for this connection alone (a run of `kscout measure` has no archive, say), so a reader
        needs no case of its own for them and the run's file is never written."""
        with self.connect(durable) as db:
            if not self.read_only:
                db.executescript(schema)
                return
            present = {row[0] for row in db.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}
            for statement in schema.split(";"):
                words = statement.split()
                if words[:5] == ["CREATE", "TABLE", "IF", "NOT", "EXISTS"] and words[5] not in present:
                    db.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))

    @contextmanager
    def connect(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """This thread's connection; writes outside a transaction commit at once, with the given durability."""
        yield self._connection(durable)

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock up front, so read-check-write sequences cannot interleave.

        `durable=False` is for bookkeeping that a resume re-derives (see the module docstring); the
        ledger and measurement records keep the default.
        """
        db = self._connection(durable)
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads on this thread that all see one moment of the run (a read transaction): a view of a run a
        search is writing to would otherwise count the ledger and the archive at different moments."""
        db = self._connection(durable=True)
        if db.in_transaction:
            yield
            return
        db.execute("BEGIN")
        try:
            yield
        finally:
            db.execute("ROLLBACK")

    def close(self) -> None:
        """Close this thread's connection (others close when their thread or this object goes away)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def get_meta(self, key: str) -> Optional[str]:
        with self.connect() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str, db: Optional[sqlite3.Connection] = None) -> None:
        """`db`: a transaction the caller holds (a value checked and written at once), else one of its own."""
        if db is not None:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
            return
        with self.transaction() as own:
            self.set_meta(key, value, db=own)

    def event(self, kind: str, **data: Any) -> None:
        line = json.dumps({"ts": time.time(), "event": kind, "pid": os.getpid(), **data}, default=str)
        with open(self.path / "events.jsonl", "a") as f:
            f.write(line + "\n")  # closing flushes to the OS: enough against a killed process (the log is not the record)

    def kernel_path(self, recorded: Optional[str]) -> Optional[str]:
        """A candidate's archived file in this run directory as it is now: the path recorded names the folder the
        run had then, and a run directory copied or moved since must point into itself."""
        if not recorded or Path(recorded).parent.name != "kernels":
            return recorded
        return str(self.path / "kernels" / Path(recorded).name)

    def save_kernel(self, sha: str, source: str) -> Path:
        path = self.path / "kernels" / f"{sha[:16]}.py"
        if not path.exists():
            write_text_atomic(path, source)
        return path


def read_events(log: Path) -> Iterator[dict]:
    """The events of a log in order; a missing log has none, and a line cut short by a kill is passed over."""
    for line in (log.read_text().splitlines() if log.is_file() else []):
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue
