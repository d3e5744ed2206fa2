"""The supervisor's side of the zygote: a clean process that has imported torch and forks CPU workers.

Why: a worker is never used for a second candidate (a candidate can take over its worker's channel,
docs/harness_hardening.md), so every measurement needs a new worker, and a new interpreter spends about
2.5 s importing torch on a 2-core VM before it can say hello: back-to-back measurements waited for it. A
fork of a process that already has torch takes a few milliseconds. The zygote never loads a problem or
candidate, holds no secret (it gets the scrubbed environment of a worker), and is not dumpable; each
worker it forks confines itself exactly as a launched one does, before any candidate code (its own PID
namespace, capabilities dropped, Landlock, seccomp: sandbox/launcher.py, `confine_forked_worker`).

Only CPU workers come from it: a CUDA context does not survive fork, and that path has not been checked on
a GPU, so CUDA workers are launched as before. `KSCOUT_SANDBOX_ZYGOTE=off` launches CPU workers too.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

from kernelscout.sandbox.scratch import ScratchDir

log = logging.getLogger(__name__)

_LAUNCHER = Path(__file__).with_name("launcher.py").read_text()


class ZygoteUnavailable(Exception):
    pass


class ForkedProcess:
    """A worker forked by the zygote, with the part of `subprocess.Popen` the pool uses. The zygote, its
    parent, reports its exit; this supervisor can still signal it (same user) and read its /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._done = threading.Event()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class Zygote:
    """One zygote process and the thread that reads what it says (forks and exits)."""

    def __init__(self, env: dict[str, str], start_timeout: float = 120.0) -> None:
        from kernelscout.sandbox.pool import share_precompiled_headers  # pool imports this module

        self._scratch = ScratchDir("zygote")
        env = {**env, "HOME": str(self._scratch.path), "TMPDIR": str(self._scratch.path)}
        # its warm-up compiles too: without the shared headers it built 149 MB of them in its own TMPDIR, 4 s
        share_precompiled_headers(self._scratch.path, env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(self._scratch.path / "zygote.log", "wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _LAUNCHER, "zygote", str(theirs.fileno())], env=env, cwd=self._scratch.path,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                    start_new_session=True, close_fds=True)
        finally:
            theirs.close()
        self._sock = ours
        self._children: dict[int, ForkedProcess] = {}  # the reader thread's alone
        self._forks: queue.Queue[Optional[ForkedProcess]] = queue.Queue()
        self._spawn_lock = threading.Lock()
        self.gone = False
        self.warmed = False  # Inductor warmed (`warm_inductor`): from then on a fork that lives long costs its later forks nothing
        ours.settimeout(start_timeout)
        try:
            hello = json.loads(ours.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            self.close()
            raise ZygoteUnavailable(f"the zygote did not start ({exc}): {self.log_tail()}") from None
        if "ready" not in hello:
            self.close()
            raise ZygoteUnavailable(f"the zygote did not start: {self.log_tail()}")
        ours.settimeout(None)
        threading.Thread(target=self._read, name="kscout-zygote-reader", daemon=True).start()

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join((self._scratch.path / "zygote.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None

    def _read(self) -> None:
        """The zygote answers a fork before it reaps that child, and this thread reads in order: a child is
        registered before its exit can arrive."""
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "forked" in message:
                child = self._children[int(message["forked"])] = ForkedProcess(int(message["forked"]))
                self._forks.put(child)
            elif "warmed" in message:
                self.warmed = True
            elif "exit" in message and (child := self._children.pop(int(message["exit"]), None)) is not None:
                child.exited(int(message["code"]))
        # the zygote is gone, and its children with it (each has PR_SET_PDEATHSIG)
        self.gone = True
        for child in self._children.values():
            child.exited(-9)
        self._children.clear()
        self._forks.put(None)

    def spawn(self, env: dict[str, str], cwd: Path, log_path: Path, fds: tuple[int, int],
              timeout: float = 30.0) -> ForkedProcess:
        """A new worker in `cwd` with `env`, its stdout and stderr appended to `log_path`, talking over `fds`
        (the worker's ends of its two pipes, which the caller still closes)."""
        request = json.dumps({"env": env, "cwd": str(cwd), "log": str(log_path)}).encode()
        with self._spawn_lock:
            if not self.alive:
                raise ZygoteUnavailable("the zygote has exited: " + self.log_tail())
            try:
                socket.send_fds(self._sock, [request], list(fds))
                child = self._forks.get(timeout=timeout)
            except (OSError, queue.Empty) as exc:
                raise ZygoteUnavailable(f"the zygote did not fork a worker ({exc})") from None
            if child is None:
                raise ZygoteUnavailable("the zygote has exited: " + self.log_tail())
            return child

    def close(self) -> None:
        """End the zygote; the workers it forked die with it."""
        try:
            self._sock.close()
        except (OSError, AttributeError):
            pass
        proc = getattr(self, "proc", None)
        if proc is not None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._scratch.remove()


_ZYGOTES: dict[tuple, Zygote] = {}
_REFUSED: set[tuple] = set()
_LOCK = threading.Lock()


def enabled(device: str) -> bool:
    return sys.platform.startswith("linux") and device.startswith("cpu") and os.environ.get("KSCOUT_SANDBOX_ZYGOTE") != "off"


def _key(threads: int, env: dict[str, str]) -> tuple:
    return (threads, env.get("KSCOUT_SANDBOX_NETWORK"), env.get("KSCOUT_SANDBOX_PIDS"), sys.executable)


def warmed_zygote(threads: int, env: dict[str, str]) -> Optional[Zygote]:
    """This process's zygote for such workers if it is running and has warmed Inductor; None otherwise (none
    is started). A worker that lives as long as its pool (the referee) is forked only from such a one: the
    zygote warms only while none of its children is alive, so one forked before would keep every later
    compiled candidate from the warm-up (4 s more each)."""
    with _LOCK:
        zygote = _ZYGOTES.get(_key(threads, env))
    return zygote if zygote is not None and zygote.alive and zygote.warmed else None


def zygote_for(threads: int, env: dict[str, str]) -> Optional[Zygote]:
    """This process's zygote for workers with `threads` threads (a thread count is read when torch loads),
    started on first use and again if it died; None where one could not be started (the pool then
    launches workers as before, and says why once in the log). `env` is a CPU worker's environment: the
    zygote imports torch under it, so allocator and compile settings read at load are the workers'."""
    key = _key(threads, env)
    with _LOCK:
        if key in _REFUSED:
            return None
        zygote = _ZYGOTES.get(key)
        if zygote is not None and zygote.alive:
            return zygote
        if zygote is not None:
            zygote.close()
        base = {k: v for k, v in env.items() if k not in ("KSCOUT_SANDBOX_WRITABLE", "KSCOUT_SANDBOX_READABLE",
                                                          "KSCOUT_WORKER_MEMORY_BYTES")}
        try:
            zygote = Zygote(base)
        except (OSError, ZygoteUnavailable) as exc:
            _REFUSED.add(key)
            _ZYGOTES.pop(key, None)
            log.warning("sandbox workers are launched one by one (about 2.5 s each): %s", exc)
            return None
        _ZYGOTES[key] = zygote
        return zygote


def close_all() -> None:
    if _OWNER != os.getpid():
        return
    with _LOCK:
        for zygote in _ZYGOTES.values():
            zygote.close()
        _ZYGOTES.clear()


def _forget() -> None:
    """In a forked child: the parent's zygotes are not this process's to use or close."""
    global _OWNER
    _ZYGOTES.clear()
    _REFUSED.clear()
    _OWNER = os.getpid()


_OWNER = os.getpid()
atexit.register(close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
