"""Extension builds in the shared compile cache survive a worker killed in the middle of one.

torch.utils.cpp_extension serialises builds of one extension with a `lock` file in its build folder
(`FileBaton`): whoever creates it builds, everyone else polls until it is gone. A worker killed while
building (its compile time ran out, a crash) leaves the file behind, and every later build of that
extension, in any worker, polled until its own limit ran out and was reported as a slow build (seen:
a 20 s build "took longer than 90 s" after one killed at 10 s). The cache is shared on purpose
(a first build costs 15-25 s on 2 cores), so the file has to be told apart from a live one.

Here the builder also holds an advisory lock (`flock`) on `lock.owner` beside it for as long as it
builds; the kernel drops that lock with the process, however it dies. A `lock` file whose owner lock
can be taken is therefore stale and is removed. Only sandbox workers build in kernelscout's cache, and
every one of them runs this.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any


class StaleBuildError(RuntimeError):
    pass


def _owner(baton: Any) -> str:
    return baton.lock_file_path + ".owner"


def _try_owner(path: str) -> int | None:
    """The owner lock's descriptor if no live process holds it, else None."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def try_acquire(self: Any) -> bool:
    owner = _try_owner(_owner(self))
    if owner is None:
        return False  # a live build holds it
    try:
        self.fd = os.open(self.lock_file_path, os.O_CREAT | os.O_EXCL)
    except FileExistsError:  # left by a build that died: nobody holds its owner lock
        os.remove(self.lock_file_path)
        self.fd = os.open(self.lock_file_path, os.O_CREAT | os.O_EXCL)
    self.owner_fd = owner
    return True


def wait(self: Any) -> None:
    """Until whoever holds the owner lock is done; a `lock` file still there then was left by a builder
    that died (a live one removes it before letting the owner lock go)."""
    fd = os.open(_owner(self), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the supervisor's time limit bounds this wait
        if os.path.exists(self.lock_file_path):
            os.remove(self.lock_file_path)
            raise StaleBuildError(
                f"the build of this extension that another worker was running died ({self.lock_file_path}); "
                "measure again to build it afresh")
    finally:
        os.close(fd)


def release(self: Any) -> None:
    if self.fd is not None:
        os.close(self.fd)
        self.fd = None
    os.remove(self.lock_file_path)  # before the owner lock goes, so a waiter never sees a live `lock` unowned
    owner = getattr(self, "owner_fd", None)
    if owner is not None:
        os.close(owner)  # drops the flock
        self.owner_fd = None


def install() -> None:
    """Patch torch's FileBaton in this process (a worker, before any candidate code runs)."""
    from torch.utils import file_baton

    cls = file_baton.FileBaton
    cls.try_acquire, cls.wait, cls.release = try_acquire, wait, release
