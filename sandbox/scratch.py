"""Temp folders that a killed owner does not leave behind for good.

A sandbox worker's home (where a candidate's own temp files land) and a measure slot's copies of
shipped sources live in temp folders that `close()` removes. A SIGKILL, an out-of-memory kill or a lost
Ray actor skips `close()`, and before this module every such kill left its folders in /tmp for good
(a test run on the development VM left 44; a `kscout optimize examples/softmax` killed with SIGKILL
mid-search left its worker's home with 147 MB of Inductor build files).

Each folder therefore holds a lock file that its owner keeps locked for as long as it lives; the kernel
drops the lock when the owner dies, whatever killed it. Making a new folder first removes the folders
of the same kind whose lock can be taken. Liveness is read from the lock, not from a pid, because pids
are reused and say nothing across containers that share /tmp. A folder without the lock file (being
made right now, or left by an older kernelscout) is never touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # not POSIX: folders are made and removed as before, and never swept
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".kscout-owner.lock"


class ScratchDir:
    """A folder under the system temp dir named ``kscout-{kind}-{label}-*``, held until `remove()` or the
    owner's death. Making one sweeps the dead owners' folders of the same kind, whatever their label."""

    def __init__(self, kind: str, label: str = "") -> None:
        self.kind = kind
        sweep(kind)
        self.path = Path(tempfile.mkdtemp(prefix=f"kscout-{kind}-{label + '-' if label else ''}"))
        self._fd: Optional[int] = _hold(self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _hold(folder: Path) -> Optional[int]:
    """Lock a fresh lock file and only then give it its name, so a sweeper never finds it unlocked."""
    if fcntl is None:
        return None
    staging = folder / f"{LOCK_NAME}.{os.getpid()}"
    fd = os.open(staging, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.replace(staging, folder / LOCK_NAME)
    return fd


def sweep(kind: str, root: Optional[Path] = None) -> list[Path]:
    """Remove this user's ``kscout-{kind}-*`` folders whose owner is gone; returns what was removed."""
    if fcntl is None:
        return []
    root = Path(root or tempfile.gettempdir())
    removed = []
    try:
        candidates = list(root.glob(f"kscout-{kind}-*"))
    except OSError:
        return []
    for folder in candidates:
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # no lock file: being made, or not ours to judge
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner holds it: alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed
