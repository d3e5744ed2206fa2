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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here, so no protection (the ledger still caps spending)
    fcntl = None

LOCK_FILE = "search.lock"
_HELD: set[Path] = set()  # folders this process searches in now (a lock file read from here would say "busy")


class RunBusy(Exception):
    """Another live process is searching in this folder."""

    def __init__(self, folder: Path, holder: str):
        self.folder, self.holder = folder, holder
        super().__init__(f"{folder} is in use by a search that is still running ({holder or 'another process'}); "
                         "wait for it to finish, or stop it (Ctrl-C) and then `kscout resume` it")


@contextmanager
def exclusive(folder: Path | str, what: str) -> Iterator[None]:
    """Hold the folder's search lock for the block; RunBusy at once when another process holds it."""
    folder = Path(folder)
    if fcntl is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RunBusy(folder, handle.read().strip()) from None
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


def held_elsewhere(folder: Path | str) -> Optional[str]:
    """Who is searching in the folder, unless it is this process (whose own measurements belong there)."""
    if Path(folder).resolve() in _HELD:
        return None
    return holder(folder)
