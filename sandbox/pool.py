"""Warm sandbox worker processes: spawn, talk to, watch, kill and replace.

Workers are spawned with ``subprocess`` (fork+exec, so nothing of the supervisor's memory is
inherited), or, for a search's CPU workers, forked from a zygote that was itself spawned that way and
never loads candidate code (sandbox/zygote.py), in their own session, with an environment that keeps only what a kernel needs and
never a credential. On Linux the supervisor is made non-dumpable before the first worker starts
(so a candidate cannot read the supervisor's environment through /proc), each worker is a child
subreaper (so processes a candidate starts, even in new sessions or double-forked, stay in the
worker's process tree), each worker has a network namespace of its own with no usable device (so
a candidate cannot reach the network) and a PID namespace of its own (so it cannot signal the
supervisor or the user's other processes; both best effort, see sandbox/launcher.py), and killing a worker
kills that whole tree. SIGTERM and SIGHUP to the supervisor kill its workers before it dies.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Optional, Union

from kernelscout.sandbox import protocol, zygote
from kernelscout.sandbox.scratch import ScratchDir

FORK_IF_WARMED = "if warmed"
Fork = Union[bool, Literal["if warmed"]]  # WorkerProcess's `fork`

LOG_LIMIT = 64 * 1024  # bytes of sandbox output kept per measurement (head and tail)

log = logging.getLogger(__name__)

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
ALLOCATOR_KEEP_BYTES = 1 << 30  # blocks below this come from (and go back to) the heap, not fresh mmap pages


def share_precompiled_headers(workdir: Path, env: dict[str, str]) -> None:
    """Point Inductor's precompiled C++ headers at the shared cache instead of the worker's own TMPDIR.

    Inductor keeps them in ``$TMPDIR/torchinductor_<user>/precompiled_headers`` whatever
    TORCHINDUCTOR_CACHE_DIR says (torch 2.13, codecache.py: they are meant to be global). A worker's
    TMPDIR is its own fresh folder, so every worker rebuilt them: about 147 MB and 10 s before its first
    compiled CPU candidate on the development VM (22.8 s against 12.4 s for a first torch.compile). The
    headers are named by a hash of the preprocessed header, the flags and the compiler version, so
    workers that share them cannot pick up a wrong one; sharing is what torch does outside a sandbox."""
    user = env.get("LOGNAME") or env.get("USER") or env.get("LNAME") or env.get("USERNAME")
    if not user:
        try:
            import getpass

            user = getpass.getuser()
        except Exception:  # no name to guess: the worker builds its own headers, as before
            return
    shared = CACHE_DIR / "inductor_precompiled_headers"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        own = workdir / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
        own.mkdir(exist_ok=True)
        (own / "precompiled_headers").symlink_to(shared, target_is_directory=True)
    except OSError:  # a read-only cache or no symlinks: the worker builds its own, as before
        return


def clean_env(device: str, threads: int, memory_bytes: int, workdir: Path, cpus: Sequence[int] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ALLOWED.match(k) and not _SECRET.search(k)}
    env.update(
        HOME=str(workdir),
        TMPDIR=str(workdir),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        MALLOC_ARENA_MAX="4",
        # glibc hands large blocks back to the OS on free and page-faults them in again on the next call,
        # until its adaptive thresholds settle, and then trims again now and then: an eager reference with
        # 16 MB temporaries took 20 ms in a fresh worker and 12-13 ms later, so a speedup depended on what
        # the worker had run before (1.98x, 1.37x, 0.95x for one pair, three times in a row). Fixed
        # thresholds keep freed blocks for reuse from the first call, as a warm process does: 12 ms throughout.
        MALLOC_MMAP_THRESHOLD_=str(ALLOCATOR_KEEP_BYTES),
        MALLOC_TRIM_THRESHOLD_=str(ALLOCATOR_KEEP_BYTES),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        KSCOUT_DEVICE=device,
        KSCOUT_THREADS=str(threads),
        KSCOUT_WORKER_MEMORY_BYTES=str(memory_bytes),
        TORCH_EXTENSIONS_DIR=str(CACHE_DIR / "torch_extensions"),
        TRITON_CACHE_DIR=str(CACHE_DIR / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(CACHE_DIR / "inductor"),
        # Inductor compiles in-process: its parallel compile pool (a subprocess plus a thread that reads
        # from it) outlives the call that started it, and the harness rightly reports work left running.
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    if cpus:  # the launcher pins the worker to these cores before any candidate code (launcher.pin_cpus)
        env["KSCOUT_CPUS"] = ",".join(str(c) for c in sorted(cpus))
    if os.environ.get("KSCOUT_SANDBOX_NETWORK") == "allow":  # a kernel that must reach the network
        env["KSCOUT_SANDBOX_NETWORK"] = "allow"
    if os.environ.get("KSCOUT_SANDBOX_PIDS") == "shared":  # a system where a PID namespace breaks something
        env["KSCOUT_SANDBOX_PIDS"] = "shared"
    if os.environ.get("KSCOUT_SANDBOX_FILES") == "open":  # a kernel that must write somewhere else
        env["KSCOUT_SANDBOX_FILES"] = "open"
    # where the worker may still write once the launcher has restricted it, and read (restrict_files there)
    caches = [CACHE_DIR / name for name in COMPILE_CACHES]
    for folder in caches:
        try:
            folder.mkdir(parents=True, exist_ok=True)  # a folder that does not exist cannot be allowed
        except OSError:
            pass
    extra = [p for p in os.environ.get("KSCOUT_SANDBOX_WRITE", "").split(os.pathsep) if p]  # the user's own additions
    env["KSCOUT_SANDBOX_WRITABLE"] = os.pathsep.join([str(workdir), *map(str, caches), *device_files(), *extra])
    env["KSCOUT_SANDBOX_READABLE"] = os.pathsep.join(readable_paths())
    if device.startswith("cpu"):
        env["TRITON_INTERPRET"] = "1"  # the only way a Triton kernel runs without a GPU
    return env


# The compile caches workers share (below CACHE_DIR, which also holds files the supervisor reads, such as
# the measured CPU peaks that speed-of-light bounds use: a worker may write only these folders of it)
COMPILE_CACHES = ("torch_extensions", "triton", "inductor", "inductor_precompiled_headers")
# Device files a kernel may open for writing: the usual character devices, shared memory, and the GPU's
# (NVIDIA, AMD). Not the rest of /dev: as root, a worker could otherwise write to disks, terminals,
# /dev/kmsg or /dev/kvm (found in a review).
_DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/shm", "/dev/nvidia*",
                 "/dev/nvidia-caps", "/dev/dri", "/dev/kfd")


def device_files() -> list[str]:
    import glob

    return sorted({path for pattern in _DEVICE_FILES for path in glob.glob(pattern)})


def private_folders(needed: Optional[list[str]] = None) -> list[Path]:
    """The folders whose files a worker must not read: the user's home, the folder kscout was started in (where
    `kscout.toml` may hold an API key) and the user's kscout config folder where XDG_CONFIG_HOME puts it outside home.

    A folder other than home stays readable when something the worker needs contains it (Python itself, this
    package, the compile caches, `KSCOUT_SANDBOX_READ`), since Landlock can only allow: kscout run from inside a
    virtual environment's own folder keeps that folder readable. A folder holding a virtual environment (the usual
    project layout) stays private, with the environment inside it allowed. `needed`: `_needed_paths()`, when the
    caller has it already."""
    home = Path.home().resolve()
    if home == Path(home.anchor) or not home.is_dir():
        return []
    config_home = Path(os.environ["XDG_CONFIG_HOME"]) if os.environ.get("XDG_CONFIG_HOME") else home / ".config"
    needs = [Path(p) for p in (_needed_paths() if needed is None else needed)]
    folders = [home]
    for folder in (Path.cwd(), config_home / "kscout"):  # the two places agent/llm_config.py reads kscout.toml from
        try:
            folder = folder.resolve()
        except OSError:
            continue
        if folder.is_dir() and folder != Path(folder.anchor) and not folder.is_relative_to(home) and folder not in folders \
                and not any(folder.is_relative_to(path) for path in needs):
            folders.append(folder)
    return folders


def _needed_paths() -> list[str]:
    """What a worker cannot run without, wherever it lies: Python, this package, the compile caches, and what
    the user adds with `KSCOUT_SANDBOX_READ`."""
    import kernelscout
    import kernelscout.sandbox

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *kernelscout.__path__, *kernelscout.sandbox.__path__, *(str(CACHE_DIR / name) for name in COMPILE_CACHES),
             *(p for p in os.environ.get("KSCOUT_SANDBOX_READ", "").split(os.pathsep) if p)]
    return [os.path.realpath(p) for p in paths if p and os.path.exists(p)]


def readable_paths() -> list[str]:
    """What a worker may read: everything but the private folders (`private_folders`), and in them only the Python
    installation, the import path, this package and the compile caches.

    Why: a candidate runs as the user, and the environment is scrubbed of keys, but the user's files were not:
    a review's candidate read an API key from ~/.config/kscout/config.toml and printed it into the verdict,
    which the LLM policy then sent to the provider with its repair request; a later one (sixty-fifth session)
    read it from ./kscout.toml in a project folder outside home. SSH keys, cloud credentials and shell history
    live in home too. Landlock can only allow, so "all but these" is the folders beside each of their
    ancestors. Returns [] (no read restriction) when home is / or absent. An import-path entry that holds a
    private folder (the working folder itself, under `python -m`) is left out: the worker imports nothing from it."""
    needed = _needed_paths()
    private = private_folders(needed)
    if not private:
        return []
    allowed: set[str] = set()

    def beside(folder: Path) -> None:  # `folder` holds a private folder: allow every child that holds none
        try:
            children = list(folder.iterdir())
        except OSError:
            return
        for child in children:
            if child in private:
                continue
            if any(p.is_relative_to(child) for p in private):
                beside(child)
            else:
                allowed.add(str(child))

    beside(Path(private[0].anchor))
    optional = [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)]
    for path in [*needed, *optional]:
        real = Path(path)
        if any(real.is_relative_to(p) for p in private) and not any(p.is_relative_to(real) for p in private):
            allowed.add(str(real))
    return sorted(allowed)


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


# -- the supervisor's side of process hygiene (Linux) --------------------------------------------
_LINUX = sys.platform.startswith("linux")
_PR_SET_DUMPABLE = 4

# Runs in each new worker process before the worker module, so before any candidate code: namespaces,
# capabilities, Landlock, seccomp, then exec of the worker (sandbox/launcher.py says why each).
_LAUNCHER = (Path(__file__).with_name("launcher.py")).read_text()

_SUPERVISOR_PID: Optional[int] = None
_LIVE: dict[int, "WorkerProcess"] = {}  # pid -> worker, for the signal handler and atexit
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_SETUP_LOCK = threading.Lock()


def protect_supervisor() -> None:
    """Prepare this process to supervise sandbox workers: call before the first worker is spawned.

    Why: a candidate runs as the same user as the supervisor, and on Linux a process may read
    /proc/<pid>/environ, /proc/<pid>/mem, maps and fd of any *dumpable* process of its own user.
    The worker's environment is scrubbed, but the supervisor's still holds the user's API keys,
    and the worker knows the supervisor's pid (getppid()). PR_SET_DUMPABLE 0 makes those files
    root-owned and ptrace-gated, so a same-user process can no longer open them or ptrace the
    supervisor. (A worker of a root supervisor would still pass that gate with CAP_SYS_PTRACE,
    CAP_SYS_ADMIN or CAP_PERFMON; the worker launcher drops those.) Side effects on the
    supervisor: no core dumps, a debugger or py-spy must attach as root, and a non-root
    supervisor cannot read its own /proc/self/environ. Spawned workers are dumpable again, since
    exec resets the flag, so the supervisor can still watch and kill them.

    Also, once per process: SIGTERM and SIGHUP kill every live worker's process tree and then take
    their previous course (by default, the process dies of the signal as before), and an atexit
    hook kills any worker a pool did not close. SIGINT is left alone (KeyboardInterrupt unwinds and
    the pools close their workers). Signal handlers can only be installed from the main thread;
    WorkerPool() calls this too, which is usually on the main thread.

    Idempotent; no-op off Linux except for the signal handlers and atexit hook.
    """
    global _SUPERVISOR_PID
    with _SETUP_LOCK:
        if _SUPERVISOR_PID != os.getpid():  # first call in this process (or in a forked child)
            _SUPERVISOR_PID = os.getpid()
            if _LINUX:
                try:
                    import ctypes

                    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
                except (OSError, AttributeError):
                    pass
            atexit.register(_kill_all_workers)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                if signum in _PREVIOUS_HANDLERS:
                    continue
                previous = signal.getsignal(signum)
                _PREVIOUS_HANDLERS[signum] = previous
                # left alone when ignored on purpose (nohup) or installed from C
                if previous not in (signal.SIG_IGN, None, _on_terminate):
                    signal.signal(signum, _on_terminate)


def _on_terminate(signum: int, frame: Any) -> None:
    """Kill the workers, then let the signal take its previous course."""
    _kill_all_workers()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _kill_all_workers() -> None:
    if _SUPERVISOR_PID != os.getpid():  # a forked child must not kill its parent's workers
        return
    for worker in list(_LIVE.values()):
        worker.kill(wait=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LIVE.clear)  # a forked child supervises none of its parent's workers


# -- process trees -------------------------------------------------------------------------------
class _Proc(tuple):
    """(parent pid, process group, state letter, start time in clock ticks) from /proc/<pid>/stat."""

    ppid = property(lambda self: self[0])
    pgid = property(lambda self: self[1])
    state = property(lambda self: self[2])
    start = property(lambda self: self[3])


def _proc_table() -> dict[int, _Proc]:
    """Every process on the machine, by pid."""
    table: dict[int, _Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # fields[i] is field i + 3 of proc(5)
            table[int(entry)] = _Proc((int(fields[1]), int(fields[2]), fields[0], int(fields[19])))
        except (OSError, IndexError, ValueError):
            continue
    return table


def _tree(roots: list[int], table: dict[int, _Proc]) -> list[int]:
    """`roots`, their descendants and the members of their process groups, parents before children."""
    children: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
        groups.setdefault(proc.pgid, []).append(pid)
    order = [r for r in dict.fromkeys(roots)]
    seen = set(order)
    for pid in order:  # grows while it is walked
        for other in children.get(pid, []) + groups.get(pid, []):
            if other not in seen:
                seen.add(other)
                order.append(other)
    return order


def _still(known: dict[int, int], table: dict[int, _Proc]) -> list[int]:
    """The pids in `known` (pid -> start time) that are still the same processes (not a reused pid)."""
    return [pid for pid, start in known.items() if pid in table and table[pid].start == start]


def freeze_tree(root: Optional[int], known: Optional[dict[int, int]] = None) -> list[int]:
    """SIGSTOP `root`, everything descended from it or in its process group, and the `known` processes;
    return the pids stopped, parents before children.

    A process group misses anything a candidate moves to a new session (setsid,
    start_new_session=True), so the tree is walked instead, parents before children, and walked again
    until no new process appears (a stopped process cannot fork). Processes orphaned earlier were
    re-parented to the worker, a child subreaper, so they are in the tree too; `known` (pid -> start
    time) adds processes seen under the worker earlier that may have left the tree since. `root` must
    be a pid that cannot have been reused (a worker not yet reaped). Never raises.
    """
    known = known or {}
    if not _LINUX or (root is None and not known):
        return []
    frozen: list[int] = []
    seen: set[int] = set()
    for _ in range(100):
        table = _proc_table()
        roots = ([root] if root is not None else []) + _still(known, table)
        new = [pid for pid in _tree(roots, table) if pid not in seen and pid in table]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return frozen


def kill_tree(root: Optional[int], known: Optional[dict[int, int]] = None) -> None:
    """SIGKILL `root`, everything descended from it or in its process group, and the `known` processes:
    frozen first (`freeze_tree`), so nothing forks away while they are killed. Never raises."""
    if not _LINUX:
        if root is not None:
            try:
                os.killpg(root, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return
    for pid in freeze_tree(root, known):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class WorkerDied(Exception):
    def __init__(self, message: str):
        super().__init__(message)


class WorkerTimedOut(Exception):
    pass


class WorkerOutOfMemory(Exception):
    pass


_WARNED_NAMESPACES = False


def _warn_if_namespaces_refused(network: str, pids: str = "") -> None:
    """Once per process: a Linux worker that could not get a network (or PID) namespace of its own."""
    global _WARNED_NAMESPACES
    refused = [what for what, state, prefix in (("the network", network, "open (no network namespace"),
                                                ("the user's other processes", pids, "shared (no PID namespace"))
               if state.startswith(prefix)]
    if _LINUX and refused and not _WARNED_NAMESPACES:
        _WARNED_NAMESPACES = True
        log.warning("sandbox workers can reach %s: %s. Allow unprivileged user namespaces "
                    "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04 "
                    "kernel.apparmor_restrict_unprivileged_userns=0) to cut them off.",
                    " and ".join(refused), network if network.startswith("open (no") else pids)


_WARNED_FILES = False


def _warn_if_writes_unconfined(files: str) -> None:
    """Once per process: a Linux worker the kernel would not confine (no Landlock, before 5.13), so a
    candidate could rewrite the run directory. Not when the user lifted it (KSCOUT_SANDBOX_FILES=open)."""
    global _WARNED_FILES
    refused = files.startswith("open (no Landlock") or files.startswith("open (Landlock refused")
    if _LINUX and refused and not _WARNED_FILES:
        _WARNED_FILES = True
        log.warning("sandbox workers can write wherever this user can, the run directory included: %s. "
                    "A kernel with Landlock (Linux 5.13+, enabled in the lsm= boot list) confines them.", files)


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

    @property
    def workdir(self) -> Path:
        """The worker's cwd, HOME and TMPDIR."""
        return self._scratch.path

    def __init__(self, device: str = "cpu", threads: Optional[int] = None, memory_bytes: Optional[int] = None,
                 fork: Fork = True, cpus: Sequence[int] = ()):
        """`fork`: from the zygote where it serves (CPU, Linux; sandbox/zygote.py), else launched. A one-off
        measurement launches: starting a zygote and forking from it takes about 0.5 s longer than one launch.
        `FORK_IF_WARMED`: from this process's zygote only if one is running and has warmed Inductor (none is
        started), else launched: for a one-off pool in a process that already has one, and for referees.
        `cpus`: the cores it runs on (all of the supervisor's when empty), fixed before candidate code runs."""
        self.device = device
        self.threads = threads or default_threads()
        self.memory_bytes = memory_bytes if memory_bytes is not None else default_memory_bytes()
        self._scratch = ScratchDir("worker")  # swept by a later worker if this supervisor is killed
        self.log_path = self.workdir / "worker.log"
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        env = clean_env(device, self.threads, self.memory_bytes if device.startswith("cpu") else 0, self.workdir,
                        cpus if device.startswith("cpu") else ())
        share_precompiled_headers(self.workdir, env)
        protect_supervisor()
        self.proc: Any = None
        self.forked = False  # from the zygote (sandbox/zygote.py), or launched
        parent = None
        if fork and zygote.enabled(device):
            parent = zygote.warmed_zygote(self.threads, env) if fork == FORK_IF_WARMED else zygote.zygote_for(self.threads, env)
        if parent is not None:
            try:
                self.proc = parent.spawn(env, self.workdir, self.log_path, (cmd_r, res_w))
                self.forked = True
            except zygote.ZygoteUnavailable as exc:  # it died since: launch this one, the next gets a new zygote
                log.info("launching a worker: %s", exc)
        if self.proc is None:
            self.proc = self._launch(env, cmd_r, res_w)
        os.close(cmd_r)
        os.close(res_w)
        self.pid = self.proc.pid  # the launcher: the process this supervisor started and waits for
        self.worker_pid = self.pid  # the process running candidate code (below the launcher in a PID namespace)
        self._own = {self.pid}  # the sandbox's own processes, which are never strays
        self._seen: dict[int, int] = {}  # pid -> start time of the processes last seen under the worker
        _LIVE[self.pid] = self
        self.info: dict[str, Any] = {}
        self.measurements = 0
        self.candidates_run = 0  # counted before a candidate is handed over; a search's pool never reuses such a worker

    def _launch(self, env: dict[str, str], cmd_r: int, res_w: int) -> subprocess.Popen:
        """A new interpreter for the worker: on Linux through the launcher, which confines it first."""
        launch = ["-c", _LAUNCHER] if _LINUX else ["-m", "kernelscout.sandbox.worker"]
        with open(self.log_path, "wb") as log:
            return subprocess.Popen(
                [sys.executable, *launch, str(cmd_r), str(res_w)],
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_r, res_w),
                start_new_session=True,
                close_fds=True,
            )

    @property
    def own_pids(self) -> frozenset[int]:
        """The sandbox's own processes (launcher, namespace init, worker) as this supervisor sees them."""
        return frozenset(self._own)

    # -- talking -----------------------------------------------------------------------------
    def request_by(self, cmd: str, deadline: float, **fields: Any) -> dict[str, Any]:
        """`request` within a measurement's overall deadline (time.monotonic()); a step that starts
        after the deadline still gets 10 ms, so it fails as a timeout rather than never being asked."""
        return self.request(cmd, max(0.01, deadline - time.monotonic()), **fields)

    def request(self, cmd: str, timeout: Optional[float], **fields: Any) -> dict[str, Any]:
        nonce = secrets.token_hex(8)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            protocol.send(self._cmd_w, {"cmd": cmd, "nonce": nonce, **fields})
            while True:
                reply = protocol.recv(self._res_r, deadline, poll=self._watch)
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
        _warn_if_namespaces_refused(self.info.get("network", ""), self.info.get("pids", ""))
        _warn_if_writes_unconfined(self.info.get("files", ""))
        if self.info.get("pids") == "isolated" and _LINUX:
            # the namespace's init and the worker run under the launcher: part of the sandbox, not strays.
            # At hello no candidate code has run, so the launcher's tree is exactly those processes.
            tree = _tree([self.pid], _proc_table())
            self._own.update(tree)
            self.worker_pid = tree[-1]
        return self.info

    def _wait_exit(self) -> Optional[int]:
        try:
            return self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return None

    def _under(self, table: dict[int, _Proc]) -> list[int]:
        """The live processes under this worker (its tree and group, and any seen there before), itself excluded."""
        roots = ([self.pid] if self.proc.returncode is None else []) + _still(self._seen, table)
        return [pid for pid in _tree(roots, table) if pid != self.pid and pid in table and table[pid].state not in "ZX"]

    def _watch(self) -> None:
        """Called while waiting for a reply: remember the worker's processes and enforce its memory limit."""
        if not _LINUX:
            return
        table = _proc_table()
        under = self._under(table)
        # remembered by start time, so a process that leaves the tree (its parent died after the
        # candidate undid the subreaper flag) is still killed with the worker, and a reused pid never is
        self._seen = {pid: table[pid].start for pid in under}
        if self.memory_bytes:
            rss = _rss_bytes([self.pid] + under)
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

    def log_size(self) -> int:
        """Where the worker's output stands now, for `log_since`."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """What the worker printed from `offset` on: its head and tail when over LOG_LIMIT bytes, so that a
        problem printing on every call cannot fill the run directory or a message."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        if len(data) > LOG_LIMIT:
            data = data[: LOG_LIMIT // 2] + b"\n... (output truncated) ...\n" + data[-LOG_LIMIT // 2:]
        return data.decode(errors="replace")

    def stray_processes(self) -> list[str]:
        """Names of the processes running under this worker. Between measurements there should be none:
        anything here was started by a candidate and outlived it (sessions and double forks included)."""
        if not _LINUX:
            return []
        pids = [pid for pid in self._under(_proc_table()) if pid not in self._own]
        names = []
        for pid in pids:
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip() or str(pid))
            except OSError:
                names.append(str(pid))
        return names

    @contextlib.contextmanager
    def frozen(self) -> Iterator["Freeze"]:
        """Stop the worker's whole process tree (SIGSTOP, which no process can catch) for the duration,
        so nothing of a candidate's runs while another process is timed; then let it go on.

        A stop takes effect when a process returns to user space, so one inside a long system call runs
        on (a red-team pass kept a "stopped" process busy with one 2 GB write): the CPU time the tree used
        while it should have been stopped is read at the end (`Freeze.ran_s`). A candidate's work already
        queued on a GPU is not stopped either: that is the device's, not a process's."""
        stopped = freeze_tree(self.pid if self.proc.returncode is None else None, self._seen)
        freeze = Freeze(stopped)
        try:
            if stopped:
                _wait_stopped(stopped)
            freeze.start()
            yield freeze
        finally:
            freeze.end()
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except (ProcessLookupError, PermissionError):
                    pass

    def kill(self, wait: bool = True) -> None:
        """Kill the worker's whole process tree: a hung candidate's children die too, even in new sessions."""
        # Until it is reaped, the worker's pid cannot be reused, so its tree is safe to walk.
        kill_tree(self.pid if self.proc.returncode is None else None, self._seen)
        self._seen = {}
        if wait:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill()
        _LIVE.pop(self.pid, None)
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._scratch.remove()


class Freeze:
    """The processes a `WorkerProcess.frozen` block stopped, and the CPU time they used while stopped."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.ran_s = 0.0
        self._at_start = 0.0

    def _cpu_s(self) -> float:
        ticks = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime: every thread of the process
            except (OSError, IndexError, ValueError):
                continue
        return ticks / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self._at_start = self._cpu_s()

    def end(self) -> None:
        self.ran_s = max(0.0, self._cpu_s() - self._at_start)


def _wait_stopped(pids: list[int], timeout_s: float = 0.5) -> None:
    """Until every one of `pids` shows as stopped (or gone): SIGSTOP is delivered asynchronously."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        table = _proc_table()
        if all(pid not in table or table[pid].state in "TtZX" for pid in pids):
            return
        time.sleep(0.001)


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # second field: resident pages
        except (OSError, IndexError, ValueError):
            continue
    return total


class _Spare(threading.Thread):
    """A worker being started in the background, to replace one that was retired."""

    def __init__(self, device: str, threads: Optional[int], memory_bytes: Optional[int], fork: Fork = True,
                 cpus: Sequence[int] = ()):
        super().__init__(name=f"kscout-spare-{device}", daemon=True)
        self.device, self.threads, self.memory_bytes, self.fork, self.cpus = device, threads, memory_bytes, fork, cpus
        self.worker: Optional[WorkerProcess] = None
        self.environ = dict(os.environ)  # what it was started under: a worker takes its settings from it

    def run(self) -> None:
        try:
            worker = WorkerProcess(self.device, self.threads, self.memory_bytes, self.fork, self.cpus)
        except Exception:  # acquire() starts one in the foreground, where the failure is reported
            return
        try:
            worker.start()
        except Exception:
            worker.close()
            return
        self.worker = worker

    def take(self) -> Optional[WorkerProcess]:
        """The started worker, if it started and the environment it was started under still holds."""
        self.join()
        worker, self.worker = self.worker, None
        if worker is not None and self.environ != dict(os.environ):  # KSCOUT_SANDBOX_*, HOME, a thread count...
            worker.close()
            return None
        return worker


class WorkerPool:
    """Keeps a warm worker per device; a worker that has run a candidate is never used again.

    Why retire every worker after its candidate: the candidate runs in the worker's process, so it can
    reach everything the worker holds, its command channel included. A candidate that takes the
    channel over (found in a review, docs/harness_hardening.md) answers the supervisor itself; kept
    warm, that worker would then forge the measurements of every later candidate, honest ones
    included. A replacement is started in the background as soon as the old worker is closed
    (`spares`), so a search that does anything between two measurements (forecasting, an LLM call)
    finds it ready; a one-off measurement (`spares=False`) starts none.
    """

    def __init__(self, threads: Optional[int] = None, memory_bytes: Optional[int] = None, spares: bool = True,
                 candidates_per_worker: int = 1, fork: Optional[bool] = None, cpus: Sequence[int] = ()):
        """`candidates_per_worker` above 1 keeps a worker warm across candidates, as before the review: for
        candidates that are one's own (the test suite's shared pool), never for a search's; even then a worker
        is retired after that many (a long-lived worker's heap and threads drift from a fresh one's, and the
        referee, a fresh process, then reads the reference as slowed beside an honest candidate). `fork`: workers from the zygote
        (sandbox/zygote.py); by default where a pool starts more than one (`spares`), else only from a zygote this
        process already has warm (`FORK_IF_WARMED`); False launches every one. `cpus`: the cores its
        CPU workers are pinned to (`--workers N` gives each slot its own share); all of them when empty."""
        self.threads = threads
        self.cpus = tuple(cpus)
        self.memory_bytes = memory_bytes
        self.spares = spares
        self.fork: Fork = (True if spares else FORK_IF_WARMED) if fork is None else fork
        self.candidates_per_worker = max(1, candidates_per_worker)
        self._idle: dict[str, list[WorkerProcess]] = {}
        self._starting: dict[str, _Spare] = {}
        self._referees: dict[str, WorkerProcess] = {}
        self._referee_starting: dict[str, _Spare] = {}
        protect_supervisor()  # again at the first spawn; this call is usually the one on the main thread

    def acquire(self, device: str, start_timeout: float = 120.0) -> WorkerProcess:
        idle = self._idle.setdefault(device, [])
        spare = self._starting.pop(device, None)
        if spare is not None and (worker := spare.take()) is not None:
            idle.append(worker)
        while idle:
            worker = idle.pop()
            if worker.alive:
                return worker
            worker.close()
        worker = WorkerProcess(device, self.threads, self.memory_bytes, self.fork, self.cpus)
        try:
            worker.start(start_timeout)
        except Exception:
            worker.close()
            raise
        return worker

    @property
    def reuse(self) -> bool:
        return self.candidates_per_worker > 1

    def release(self, worker: WorkerProcess, healthy: bool) -> None:
        """Keep a healthy worker warm unless it has run a candidate; close one that is not, or that has
        processes left running under it."""
        if healthy and worker.candidates_run < self.candidates_per_worker and worker.alive and not worker.stray_processes():
            self._idle.setdefault(worker.device, []).append(worker)
            return
        worker.close()
        if self.spares and worker.device not in self._starting and not self._idle.get(worker.device):
            spare = _Spare(worker.device, self.threads, self.memory_bytes, self.fork, self.cpus)
            self._starting[worker.device] = spare
            spare.start()

    def prepare_referee(self, device: str) -> None:
        """Start the device's referee in the background unless it is running or starting: a measurement
        calls this as it begins, so that the referee's start (an interpreter importing torch, where no
        zygote serves) overlaps the candidate's worker's, not the candidate's timing."""
        worker = self._referees.get(device)
        if (worker is not None and worker.alive) or device in self._referee_starting:
            return
        spare = _Spare(device, self.threads, self.memory_bytes, fork=self._referee_fork, cpus=self.cpus)
        self._referee_starting[device] = spare
        spare.start()

    @property
    def _referee_fork(self) -> Fork:
        """Forked only from a zygote that has warmed Inductor, else launched: the zygote warms for its later forks
        only while none of them is alive, and a referee lives as long as the pool (compiled candidates took 4 s
        longer each when it was forked before). So a search's first referee is launched (an interpreter importing
        torch, 3.5 s on a slow VM) and a later pool's in the same process is forked (headless runs, one pool a problem)."""
        return FORK_IF_WARMED if self.fork else False

    def wait_for_referee(self, device: str) -> None:
        """Before timing begins: a referee still starting would take CPU from the timed calls."""
        spare = self._referee_starting.get(device)
        if spare is not None:
            spare.join()

    def referee(self, device: str, start_timeout: float = 120.0) -> WorkerProcess:
        """The device's referee: a worker that never loads candidate code, kept for the pool's life.

        It judges what a candidate's own worker cannot be trusted to (sandbox/referee.py): that worker
        runs the candidate in its own process, so whatever it reports, the candidate could have written."""
        worker = self._referees.get(device)
        if worker is not None and worker.alive and not worker.candidates_run:
            return worker
        if worker is not None:
            worker.close()
        spare = self._referee_starting.pop(device, None)
        if spare is not None and (worker := spare.take()) is not None:
            self._referees[device] = worker
            return worker
        worker = WorkerProcess(device, self.threads, self.memory_bytes, fork=self._referee_fork, cpus=self.cpus)
        try:
            worker.start(start_timeout)
        except Exception:
            worker.close()
            raise
        self._referees[device] = worker
        return worker

    def retire_referee(self, device: str) -> None:
        """Close the device's referee (it failed or timed out); the next call to `referee` starts another."""
        worker = self._referees.pop(device, None)
        if worker is not None:
            worker.close()

    def prewarm(self, device: str) -> None:
        self.release(self.acquire(device), healthy=True)

    def close(self) -> None:
        for starting in (self._starting, self._referee_starting):
            for spare in starting.values():
                worker = spare.take()
                if worker is not None:
                    worker.close()
            starting.clear()
        for workers in [*self._idle.values(), list(self._referees.values())]:
            for worker in workers:
                worker.close()
        self._idle.clear()
        self._referees.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
