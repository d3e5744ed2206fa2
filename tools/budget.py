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

from kernelscout.tools.rundir import RunDir
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


def _owner_gone(pid: int, owner_host: str, host: str, reserved_at: float) -> bool:
    """A reservation's owner that has died on this host (one on another host cannot be checked from here). A live
    process with its pid that started after the reservation was made is another process that reuses the number (a
    restarted container gives its processes the same low pids), so the owner is gone too."""
    return owner_host == host and (not _pid_alive(pid) or _started_after(pid, reserved_at))


def _started_after(pid: int, moment: float) -> bool:
    """Whether process `pid` started after `moment` (epoch seconds), read from /proc (False where there is none). The
    boot time /proc gives is whole seconds, so a start within 2 s of the moment does not count."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK") > moment + 2.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False


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
            rows = db.execute("SELECT owner_pid, owner_host, created FROM ledger WHERE state = 'reserved'").fetchall()
        return sum(1 for pid, owner_host, created in rows if _owner_gone(pid, owner_host, host, created))

    def in_flight(self) -> tuple[tuple[int, str], ...]:
        """(pid, host) of each live process holding a reservation: the measurements running now."""
        host = socket.gethostname()
        with self.run.connect() as db:
            rows = db.execute("SELECT owner_pid, owner_host, created FROM ledger WHERE state = 'reserved' ORDER BY id").fetchall()
        return tuple(dict.fromkeys((pid, owner_host) for pid, owner_host, created in rows
                                   if not _owner_gone(pid, owner_host, host, created)))

    def reserve(self, key: str, share: bool = False) -> Reservation:
        """Reserve one measurement of `key`. InFlight when another live process is measuring the same key,
        unless `share` (a measurement asked for again on purpose): its result will be this one's."""
        host = socket.gethostname()
        with self.run.transaction() as db:
            for rid, pid, owner_host, created in db.execute(
                "SELECT id, owner_pid, owner_host, created FROM ledger WHERE key = ? AND state = 'reserved'", (key,)
            ).fetchall():
                if _owner_gone(pid, owner_host, host, created):
                    # taken over now: `created` dates the owner's hold, which `_owner_gone` compares with its start
                    db.execute("UPDATE ledger SET owner_pid = ?, created = ? WHERE id = ?", (os.getpid(), time.time(), rid))
                    return Reservation(rid, key, adopted=True)
                if not share and pid != os.getpid():
                    raise InFlight(pid, owner_host)
            status = self._status(db)
            if status.cap is not None and status.used >= status.cap:
                raise BudgetExhausted(status, str(self.run.path))
            cur = db.execute(
                "INSERT INTO ledger (key, state, owner_pid, owner_host, created) VALUES (?, 'reserved', ?, ?, ?)",
                (key, os.getpid(), host, time.time()),
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
