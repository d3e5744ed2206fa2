"""One search at a time in a run directory.

The ledger stops two processes from overspending a cap, but two searches in one folder (a `kscout resume`
typed while the search it resumes is still running) would each adopt or repeat the other's work: seen,
the same candidate measured and charged twice, and two different "best" kernels reported. A search
therefore holds an advisory lock on `search.lock` in its folder for as long as it runs. The kernel drops
the lock when the process dies, however it dies, so a killed search never leaves its folder locked and
`kscout resume` works at once.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here, so no protection (the ledger still caps spending)
    fcntl = None

LOCK_FILE = "search.lock"
MEASURING = "a measurement made outside a search (`kscout measure`, the MCP server or a chat)"
_HELD: set[Path] = set()  # folders this process searches in now (a lock file read from here would say "busy")


class RunBusy(Exception):
    """Another live process is searching in this folder, or (seen by a search) measuring in it."""

    def __init__(self, folder: Path, holder: str, owners: tuple[tuple[int, str], ...] = (), resuming: bool = False):
        """`owners`: (pid, host) of the measurements in flight, when the caller can read them from the ledger
        (measurements hold the lock shared, so none can write its name into the lock file). `resuming`: the
        refused search lives in this folder, so another folder is no way out."""
        self.folder, self.holder = folder, holder
        if holder == MEASURING:
            named = "".join(f", pid {pid} on {host}" for pid, host in owners)
            way_out = "then resume" if resuming else "or search in another folder (--run-dir)"
            super().__init__(f"{folder} is in use by {holder}{named}, which is still running; wait for it to finish, {way_out}")
        else:
            super().__init__(f"{folder} is in use by a search that is still running ({holder or 'another process'}); "
                             "wait for it to finish, or stop it (Ctrl-C) and then `kscout resume` it")


def this_command(argv: Optional[list[str]] = None) -> str:
    """How this process was started, as its user typed it (`kscout optimize`, `kscout mcp`, `python tune.py`): what a
    busy folder's message names, so that the holder can be found in a terminal or `ps`."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return "python"
    path = Path(argv[0])
    if path.name == "kscout" or (path.name == "__main__.py" and path.parent.name == "kernelscout"):
        sub = next((a for a in argv[1:] if not a.startswith("-")), None)
        return f"kscout {sub}" if sub else "kscout"
    return f"python {path.name}" if path.name and path.name != "-c" else "python"


@contextmanager
def exclusive(folder: Path | str, what: str) -> Iterator[None]:
    """Hold the folder's search lock for the block; RunBusy at once when another process holds it."""
    folder = Path(folder)
    if fcntl is None:  # no lock to take, but this process still knows it is searching here
        _HELD.add(folder.resolve())
        try:
            yield
        finally:
            _HELD.discard(folder.resolve())
        return
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(folder, _who_holds(handle)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{what}, pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        _HELD.add(folder.resolve())
        try:
            yield
        finally:
            _HELD.discard(folder.resolve())
            handle.seek(0)
            handle.truncate()
    finally:
        handle.close()  # closing the file releases the lock


def _who_holds(handle) -> str:
    """Who holds the lock this process could not take exclusively. A shared lock still granted means the
    holders are measurements (they hold it shared and write nothing); otherwise a search holds it, whose name
    may not be written yet in the moment after it took the lock."""
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        return handle.read().strip() or "just started, its pid not yet written"
    fcntl.flock(handle, fcntl.LOCK_UN)
    return MEASURING


@contextmanager
def shared(folder: Path | str) -> Iterator[None]:
    """Keep searches out of the folder for the block, beside other holders of this lock: a measurement made
    outside a search holds it from the check to the charge, so a search cannot start in between and find
    the measurement charged to its budget. RunBusy at once while a search holds the folder; nothing in this
    process's own searched folders (their measurements belong there) or in a path that is not a folder (left
    to the run directory's own error)."""
    folder = Path(folder)
    try:
        usable = fcntl is not None and folder.resolve() not in _HELD and not (folder.exists() and not folder.is_dir())
        if usable:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # under a file, say: the run directory's own check says so
        usable = False
    if not usable:
        yield
        return
    with open(folder / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RunBusy(folder, handle.read().strip() or "another process") from None
        yield  # closing the file releases the lock


def holder(folder: Path | str) -> Optional[str]:
    """Who is searching in the folder now, or None. Reads only; never creates the lock file."""
    path = Path(folder) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return None
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "another process"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def searching_here(folder: Path | str) -> bool:
    """Whether this process is searching in the folder now (its measurements there are the search's own)."""
    return Path(folder).resolve() in _HELD


def held_elsewhere(folder: Path | str) -> Optional[str]:
    """Who is searching in the folder, unless it is this process (whose own measurements belong there)."""
    if searching_here(folder):
        return None
    return holder(folder)
