"""Warm sandbox worker processes: spawn, talk to, watch, kill and replace.

Workers are spawned with ``subprocess`` (fork+exec, so nothing of the supervisor's memory is
inherited), in their own session so a timeout can kill the whole process group, with an
environment that keeps only what a kernel needs and never a credential.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from kernelscout.sandbox import protocol

# Variables a kernel build or run may need; everything else is dropped.
_ALLOWED = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|SHELL|USER|LOGNAME|TMPDIR|"
    r"CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|CUDNN_[A-Z_]+|LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|C_INCLUDE_PATH|CPLUS_INCLUDE_PATH|"
    r"CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|MAX_JOBS|TORCH_CUDA_ARCH_LIST|ROCM_PATH|HIP_[A-Z_]+|HSA_[A-Z_]+|"
    r"VIRTUAL_ENV|CONDA_PREFIX|PYTHONPATH|PYTHONHOME|TRITON_[A-Z_]+)$"
)
# Even an allowed name is dropped when it looks like a credential or belongs to a model provider.
_SECRET = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION|"
    r"^(ANTHROPIC|OPENAI|AZURE|AWS|GOOGLE|GCP|GEMINI|HF|HUGGING|GITHUB|GH|MISTRAL|COHERE|GROQ|TOGETHER|KSCOUT_LLM)",
    re.IGNORECASE,
)

CACHE_DIR = Path(os.environ.get("KSCOUT_CACHE_DIR", Path.home() / ".cache" / "kernelscout"))


def clean_env(device: str, threads: int, memory_bytes: int, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ALLOWED.match(k) and not _SECRET.search(k)}
    env.update(
        HOME=str(workdir),
        TMPDIR=str(workdir),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        MALLOC_ARENA_MAX="4",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        KSCOUT_DEVICE=device,
        KSCOUT_THREADS=str(threads),
        KSCOUT_WORKER_MEMORY_BYTES=str(memory_bytes),
        TORCH_EXTENSIONS_DIR=str(CACHE_DIR / "torch_extensions"),
        TRITON_CACHE_DIR=str(CACHE_DIR / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(CACHE_DIR / "inductor"),
    )
    if device.startswith("cpu"):
        env["TRITON_INTERPRET"] = "1"  # the only way a Triton kernel runs without a GPU
    return env


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def default_memory_bytes() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return int(min(total * 0.75, 64 << 30))


class WorkerDied(Exception):
    def __init__(self, message: str):
        super().__init__(message)


class WorkerTimedOut(Exception):
    pass


class WorkerOutOfMemory(Exception):
    pass


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (" (a segmentation fault)" if name == "SIGSEGV" else "")
    return f"exited with code {code}"


class WorkerProcess:
    """One sandbox worker. Not thread-safe: one measurement at a time."""

    def __init__(self, device: str = "cpu", threads: Optional[int] = None, memory_bytes: Optional[int] = None):
        self.device = device
        self.threads = threads or default_threads()
        self.memory_bytes = memory_bytes if memory_bytes is not None else default_memory_bytes()
        self.workdir = Path(tempfile.mkdtemp(prefix="kscout-worker-"))
        self.log_path = self.workdir / "worker.log"
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        env = clean_env(device, self.threads, self.memory_bytes if device.startswith("cpu") else 0, self.workdir)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelscout.sandbox.worker", str(cmd_r), str(res_w)],
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_r, res_w),
                start_new_session=True,
                close_fds=True,
            )
        os.close(cmd_r)
        os.close(res_w)
        self.pid = self.proc.pid
        self.info: dict[str, Any] = {}
        self.measurements = 0

    # -- talking -----------------------------------------------------------------------------
    def request(self, cmd: str, timeout: Optional[float], **fields: Any) -> dict[str, Any]:
        nonce = secrets.token_hex(8)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            protocol.send(self._cmd_w, {"cmd": cmd, "nonce": nonce, **fields})
            while True:
                reply = protocol.recv(self._res_r, deadline, poll=self._watch_memory)
                if reply.get("nonce") == nonce:
                    return reply
                # anything else on the channel was not written by the harness: ignore it
        except protocol.ChannelTimeout:
            self.kill()
            raise WorkerTimedOut() from None
        except (protocol.ChannelClosed, ValueError) as exc:
            code = self._wait_exit()
            if code is None:  # the channel broke but the process lives: not trustworthy any more
                self.kill()
                raise WorkerDied(f"the worker's result channel was corrupted ({exc})") from None
            raise WorkerDied(f"the worker {_describe_exit(code)}") from None

    def start(self, timeout: float = 120.0) -> dict[str, Any]:
        self.info = self.request("hello", timeout)
        return self.info

    def _wait_exit(self) -> Optional[int]:
        try:
            return self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return None

    def _watch_memory(self) -> None:
        if not self.memory_bytes:
            return
        rss = _group_rss_bytes(self.pid)
        if rss > self.memory_bytes:
            self.kill()
            raise WorkerOutOfMemory(f"the worker used {rss / 2**30:.1f} GiB, over its limit of {self.memory_bytes / 2**30:.1f} GiB")

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the worker's whole process group: grandchildren of a hung candidate die too."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.alive:
            self.kill()
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)


def _group_rss_bytes(pgid: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat: process group
                continue
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss pages
        except (OSError, IndexError, ValueError):
            continue
    return total


class WorkerPool:
    """Keeps warm workers per device and replaces any that crash, hang or were tampered with."""

    def __init__(self, threads: Optional[int] = None, memory_bytes: Optional[int] = None):
        self.threads = threads
        self.memory_bytes = memory_bytes
        self._idle: dict[str, list[WorkerProcess]] = {}

    def acquire(self, device: str, start_timeout: float = 120.0) -> WorkerProcess:
        idle = self._idle.setdefault(device, [])
        while idle:
            worker = idle.pop()
            if worker.alive:
                return worker
            worker.close()
        worker = WorkerProcess(device, self.threads, self.memory_bytes)
        try:
            worker.start(start_timeout)
        except Exception:
            worker.close()
            raise
        return worker

    def release(self, worker: WorkerProcess, healthy: bool) -> None:
        if healthy and worker.alive:
            self._idle.setdefault(worker.device, []).append(worker)
        else:
            worker.close()

    def prewarm(self, device: str) -> None:
        self.release(self.acquire(device), healthy=True)

    def close(self) -> None:
        for workers in self._idle.values():
            for worker in workers:
                worker.close()
        self._idle.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
