"""One kernelscout process at a time measures on a device of this machine.

Two measurements timed at the same moment on one device disturb each other: the busy-machine check
then voids both timings, and both are still charged (seen: two MCP servers on one run directory,
4.98x and 5.14x "not valid" for a kernel that measures about 2.9x alone). Inside one process the
callers already take turns (the MCP server's lock, the search loop); this lock makes separate
processes (two servers, a server and `kscout measure`, two searches) take turns too. It is an
advisory `flock` on a file in the compile cache folder, so the kernel releases it when a process
dies. Scale-out slots (`--workers`, `--ray`) measure side by side on purpose, on their own cores or
GPUs, and do not take it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from contextlib import contextmanager
from typing import Iterator

from kernelscout.sandbox.pool import CACHE_DIR

log = logging.getLogger(__name__)


@contextmanager
def device_turn(device: str) -> Iterator[None]:
    """Hold this machine's measuring turn for `device` (waiting for another process's to end)."""
    path = CACHE_DIR / "locks" / f"measure-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:  # an unwritable cache: measure without the lock rather than not at all
        log.warning("could not open %s (%s): measurements of other processes may overlap this one", path, exc)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another kscout process is measuring on %s; waiting for its turn to end", device)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock
