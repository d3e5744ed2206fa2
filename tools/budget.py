"""The measurement ledger: a cap that no process, adapter or crash can exceed.

A measurement is *reserved* before the device is touched and *settled* (charged or released)
afterwards. Reservations count as spent, so a process killed mid-measurement can only
under-spend. A reservation left by a dead process is adopted by the next request for the same
measurement key, so resuming never pays twice for one measurement.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

from kernelscout.tools.rundir import RunDir, has_column
from kernelscout.tools.schema import BudgetStatus


class BudgetExhausted(Exception):
    def __init__(self, status: BudgetStatus, run_dir: str = "RUN_DIR"):
        self.status = status
        super().__init__(
            f"the measurement budget is spent: {status.used} of {status.cap} used"
            + (f" ({status.reserved} in flight)" if status.reserved else "")
            + f"; raise the cap with `kscout budget {run_dir} --set N`, or use a new run directory"
        )


class CapBelowUsed(ValueError):
    """A cap under what the folder has already spent: it could only read as "7 used of 5"."""

    def __init__(self, cap: int, used: int):
        self.cap, self.used = cap, used
        super().__init__(f"a cap of {cap} is below the {used} measurements already used; a cap of {used} stops any "
                         "further measurement, a larger one allows more")


class InFlight(Exception):
    """Another process is measuring the same candidate now; wait for its result rather than pay again."""

    def __init__(self, pid: int, host: str):
        self.pid, self.host = pid, host
        super().__init__(f"pid {pid} on {host} is measuring the same candidate")


@dataclass(frozen=True)
class Reservation:
    id: int
    key: str
    adopted: bool = False


def _owner_gone(pid: int, owner_host: str, host: str, owner_start: Optional[str]) -> bool:
    """A reservation's owner that has died on this host (one on another host cannot be checked from here). A live
    process with its pid but another start (`process_start`) reuses the number, as a restarted container's processes
    do, so the owner is gone too. Rows written before the start was recorded have none: a live pid counts as the owner."""
    if owner_host != host:
        return False
    if not _pid_alive(pid):
        return True
    return owner_start is not None and (now := process_start(pid)) is not None and now != owner_start


def process_start(pid: int) -> Optional[str]:
    """What tells one process from a later one with the same pid: the boot and the clock tick it started at, read
    from /proc (None where there is none). No wall clock is involved, so a clock set forward cannot make a live
    owner look new."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rpartition(")")[2].split()[19]  # field 22, starttime; the name before ")" may hold spaces
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{f.read().strip()}:{int(ticks)}"
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not waited for yet still answers kill(0): a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _own_start() -> Optional[str]:
    return process_start(os.getpid())  # read each time: a forked child has a pid and a start of its own


def _start_column(db) -> str:
    """`owner_start`, or NULL in a run opened read-only whose ledger predates the column (a writer adds it)."""
    return "owner_start" if has_column(db, "ledger", "owner_start") else "NULL"


class Budget:
    def __init__(self, run: RunDir):
        self.run = run

    @property
    def cap(self) -> Optional[int]:
        value = self.run.get_meta("measurement_cap")
        return None if value in (None, "") else int(value)

    def set_cap(self, cap: Optional[int]) -> None:
        """CapBelowUsed for a cap under what is already spent. Read and written in one transaction, so a
        measurement charged by another process in between cannot slip under the new cap unseen."""
        if cap is not None and cap < 0:
            raise ValueError("a measurement budget cannot be negative")
        with self.run.transaction() as db:
            used = self._status(db).used
            if cap is not None and cap < used:
                raise CapBelowUsed(cap, used)
            self.run.set_meta("measurement_cap", "" if cap is None else str(cap), db=db)

    def status(self) -> BudgetStatus:
        with self.run.connect() as db:
            return self._status(db)

    def _status(self, db) -> BudgetStatus:
        counts = dict(db.execute("SELECT state, COUNT(*) FROM ledger GROUP BY state").fetchall())
        charged, reserved = counts.get("charged", 0), counts.get("reserved", 0)
        row = db.execute("SELECT value FROM meta WHERE key = 'measurement_cap'").fetchone()
        cap = int(row[0]) if row and row[0] not in (None, "") else None
        used = charged + reserved
        return BudgetStatus(cap=cap, used=used, reserved=reserved, remaining=None if cap is None else max(0, cap - used))

    def adoptable(self) -> int:
        """Reservations left by a process on this host that has died: in flight when it was killed, each will
        be taken up by the next request for its key without a new charge, so they are room, not spending."""
        host = socket.gethostname()
        with self.run.connect() as db:
            rows = db.execute(f"SELECT owner_pid, owner_host, {_start_column(db)} FROM ledger WHERE state = 'reserved'").fetchall()
        return sum(1 for pid, owner_host, start in rows if _owner_gone(pid, owner_host, host, start))

    def in_flight(self) -> tuple[tuple[int, str], ...]:
        """(pid, host) of each live process holding a reservation: the measurements running now."""
        host = socket.gethostname()
        with self.run.connect() as db:
            rows = db.execute(f"SELECT owner_pid, owner_host, {_start_column(db)} FROM ledger WHERE state = 'reserved' ORDER BY id").fetchall()
        return tuple(dict.fromkeys((pid, owner_host) for pid, owner_host, start in rows if not _owner_gone(pid, owner_host, host, start)))

    def reserve(self, key: str, share: bool = False) -> Reservation:
        """Reserve one measurement of `key`. InFlight when another live process is measuring the same key,
        unless `share` (a measurement asked for again on purpose): its result will be this one's."""
        host = socket.gethostname()
        with self.run.transaction() as db:
            for rid, pid, owner_host, start in db.execute(
                "SELECT id, owner_pid, owner_host, owner_start FROM ledger WHERE key = ? AND state = 'reserved'", (key,)
            ).fetchall():
                if _owner_gone(pid, owner_host, host, start):
                    db.execute("UPDATE ledger SET owner_pid = ?, owner_start = ? WHERE id = ?", (os.getpid(), _own_start(), rid))
                    return Reservation(rid, key, adopted=True)
                if not share and pid != os.getpid():
                    raise InFlight(pid, owner_host)
            status = self._status(db)
            if status.cap is not None and status.used >= status.cap:
                raise BudgetExhausted(status, str(self.run.path))
            cur = db.execute(
                "INSERT INTO ledger (key, state, owner_pid, owner_host, owner_start, created) VALUES (?, 'reserved', ?, ?, ?, ?)",
                (key, os.getpid(), host, _own_start(), time.time()),
            )
            return Reservation(cur.lastrowid, key)

    def settle(self, reservation: Reservation, charged: bool, db=None) -> None:
        sql = "UPDATE ledger SET state = ?, settled = ? WHERE id = ? AND state = 'reserved'"
        args = ("charged" if charged else "released", time.time(), reservation.id)
        if db is not None:
            db.execute(sql, args)
        else:
            with self.run.transaction() as tx:
                tx.execute(sql, args)
