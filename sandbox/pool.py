"""Warm sandbox worker processes: spawn, talk to, watch, kill and replace.

Workers are spawned with ``subprocess`` (fork+exec, so nothing of the supervisor's memory is
inherited), in their own session, with an environment that keeps only what a kernel needs and
never a credential. On Linux the supervisor is made non-dumpable before the first worker starts
(so a candidate cannot read the supervisor's environment through /proc), each worker is a child
subreaper (so processes a candidate starts, even in new sessions or double-forked, stay in the
worker's process tree), each worker has a network namespace of its own with no usable device (so
a candidate cannot reach the network) and a PID namespace of its own (so it cannot signal the
supervisor or the user's other processes; both best effort, see `_LAUNCHER`), and killing a worker
kills that whole tree. SIGTERM and SIGHUP to the supervisor kill its workers before it dies.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from kernelscout.sandbox import protocol
from kernelscout.sandbox.scratch import ScratchDir

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


def clean_env(device: str, threads: int, memory_bytes: int, workdir: Path) -> dict[str, str]:
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


def readable_paths() -> list[str]:
    """What a worker may read: everything but the user's home folder, and in it only the Python
    installation, the import path, this package and the compile caches.

    Why: a candidate runs as the user, and the environment is scrubbed of keys, but the files in home
    were not: a review's candidate read an API key from ~/.config/kscout/config.toml and printed it into
    the verdict, which the LLM policy then sent to the provider with its repair request. SSH keys, cloud
    credentials and shell history live there too. Landlock can only allow, so "all but home" is the
    folders beside each of home's ancestors. Returns [] (no read restriction) when home is / or absent.
    `KSCOUT_SANDBOX_READ` adds folders."""
    home = Path.home().resolve()
    if home == Path(home.anchor) or not home.is_dir():
        return []
    allowed: set[str] = set()
    for parent, step in zip(reversed(home.parents), [*reversed(home.parents)][1:] + [home]):
        try:
            allowed.update(str(child) for child in parent.iterdir() if child != step)
        except OSError:
            continue
    import kernelscout
    import kernelscout.sandbox

    inside = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), *sys.path,
              *kernelscout.__path__, *kernelscout.sandbox.__path__, *(str(CACHE_DIR / name) for name in COMPILE_CACHES),
              *(p for p in os.environ.get("KSCOUT_SANDBOX_READ", "").split(os.pathsep) if p)]
    for path in inside:
        if path and os.path.exists(path):
            real = Path(os.path.realpath(path))
            if real.is_relative_to(home):
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

# Runs in each new worker process before the worker module, so before any candidate code. With a PID
# namespace the process the supervisor started (the launcher) stays outside it and mirrors the exit of
# the worker, which runs two forks down; without one it execs the worker in place (same pid). Every
# step is best effort: a kernel or a user that refuses one still gets a working worker.
_LAUNCHER = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
prctl = libc.prctl
# CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS: a network namespace of the worker's
# own, whose only device is a loopback that is down, so a candidate cannot send the user's files
# anywhere; and a PID namespace with a /proc of its own (mounted in a private mount namespace), in
# which the supervisor and every other process of the user have no pid, so a candidate can neither
# signal them (SIGSTOP the supervisor, kill(-1) the user's session) nor read their /proc entries (the
# environment of a process the user started with an API key in it). The user namespace is what lets a
# normal user create them; mapping the same uid and gid keeps the worker's file access what it was.
# A kernel or security module that refuses some leaves those open, and the worker says so in its
# hello. KSCOUT_SANDBOX_NETWORK=allow and KSCOUT_SANDBOX_PIDS=shared opt out.
NEWUSER, NEWNET, NEWPID, NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000
want_net = os.environ.get("KSCOUT_SANDBOX_NETWORK") != "allow"
want_pid = os.environ.get("KSCOUT_SANDBOX_PIDS") != "shared"
network = "isolated" if want_net else "open (KSCOUT_SANDBOX_NETWORK=allow)"
pids = "isolated" if want_pid else "shared (KSCOUT_SANDBOX_PIDS=shared)"
proc = "private" if want_pid else "host"
if want_net or want_pid:
    uid, gid = os.getuid(), os.getgid()
    net = NEWNET if want_net else 0
    tries = [NEWUSER | net | NEWPID | NEWNS, NEWUSER | net | NEWPID] if want_pid else []
    tries += [NEWUSER | net] if want_net else []  # some kernels allow one namespace and not another
    made, reason = 0, ""
    for flags in tries:
        if libc.unshare(flags) == 0:
            made = flags
            break
        reason = reason or os.strerror(ctypes.get_errno())
    if want_pid and not made & NEWPID:
        pids, proc = "shared (no PID namespace: " + reason + ")", "host"
    elif want_pid and not made & NEWNS:
        proc = "host (no mount namespace: " + reason + ")"
    if want_net and not made:
        network = "open (no network namespace: " + reason + ")"
    if made:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            try:
                with open("/proc/self/" + name, "w") as f:
                    f.write(text)
            except OSError:
                pass
os.environ["KSCOUT_SANDBOX_NETWORK"], os.environ["KSCOUT_SANDBOX_PIDS"], os.environ["KSCOUT_SANDBOX_PROC"] = network, pids, proc
# PR_CAPBSET_DROP, for a supervisor running as root: without these the worker cannot read another
# root process's memory or environment through /proc, load kernel modules, or trace anything
# (CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF,
# CAP_CHECKPOINT_RESTORE). Dropped from the bounding set, they are gone once the worker is exec'd.
# After the user namespace, whose creation hands the process a full set again (scoped to that
# namespace, but scoped is not the same as gone).
for cap in (16, 17, 19, 21, 38, 39, 40):
    prctl(24, cap, 0, 0, 0)
prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid program (sudo, su) gives them back
channel = [int(fd) for fd in sys.argv[1:3]]

def mirror(status):
    # leave as the worker left: the same exit code, or killed by the same signal (the supervisor
    # reports a candidate's SIGSEGV as such); init passes a signal on as 128 + its number
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code if code >= 0 else 1)

if pids == "isolated":
    # A new PID namespace holds only the children made after unshare. The first is its init (pid 1):
    # it reaps orphans, and when it exits the kernel kills everything left in the namespace. The worker
    # is init's child, an ordinary process, so signals it sends itself behave as usual.
    child = os.fork()
    if child:  # the launcher, outside: the supervisor's child, it mirrors init's exit
        for fd in channel:
            os.close(fd)
        mirror(os.waitpid(child, 0)[1])
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the launcher killed, init (and so all) dies
    if proc == "private":
        # mounts made private first, so that the new /proc stays in this namespace
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        if libc.mount(None, b"/", None, 16384 | (1 << 18), None) != 0 or \
                libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:  # MS_NOSUID | MS_NODEV | MS_NOEXEC
            proc = "host (mounting /proc: " + os.strerror(ctypes.get_errno()) + ")"
        os.environ["KSCOUT_SANDBOX_PROC"] = proc
    worker = os.fork()
    if worker:
        for fd in channel:
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            pid, status = os.wait()
            if pid == worker:
                # encoded for the launcher: init cannot be killed by its own signal
                os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status))
# PR_SET_CHILD_SUBREAPER: a process the candidate orphans (double fork, daemon) is re-parented to the
# worker instead of init, so it stays in the worker's process tree, where the supervisor finds it.
prctl(36, 1, 0, 0, 0)

def restrict_files():
    # Landlock (Linux 5.13+, unprivileged, inherited by every child): from here on the worker can create,
    # change or delete files only below the folders and files the supervisor names (its scratch folder,
    # the compile caches, the usual device files), and read nothing in the user's home folder but what
    # the supervisor names (Python, the import path, the caches). Running programs stays open
    # (compilers). Without it a candidate could find the run directory and rewrite its SQLite files
    # (forge a measurement, hand back budget), or read the user's keys from their files.
    if os.environ.get("KSCOUT_SANDBOX_FILES") == "open":
        return "open (KSCOUT_SANDBOX_FILES=open)"
    call = libc.syscall
    call.restype = ctypes.c_long
    abi = call(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return "open (no Landlock: " + os.strerror(ctypes.get_errno()) + ")"
    readable = [p for p in os.environ.get("KSCOUT_SANDBOX_READABLE", "").split(os.pathsep) if p]
    read = (1 << 2) | (1 << 3) if readable else 0  # read file, read dir
    handled = (1 << 1) | (1 << 4) | (1 << 5) | sum(1 << bit for bit in range(6, 13)) | read  # write, remove, make
    handled |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # refer (rename/link across), truncate
    on_files = handled & ((1 << 1) | (1 << 2) | (1 << 14))  # the rights a rule on a file (not a folder) may carry
    # ABI 6+: signals and abstract UNIX sockets scoped to the worker's own processes, so that where the
    # PID namespace is off (refused, or KSCOUT_SANDBOX_PIDS=shared) a candidate still cannot SIGSTOP the
    # supervisor or kill(-1) the user's session
    scoped = 3 if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    ruleset = call(ctypes.c_long(444), attr, ctypes.c_size_t(24 if scoped else 8), ctypes.c_uint32(0))
    if ruleset < 0:
        return "open (Landlock refused a ruleset: " + os.strerror(ctypes.get_errno()) + ")"

    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        if not os.path.isdir(path):
            rights &= on_files
        rule = ctypes.create_string_buffer(rights.to_bytes(8, sys.byteorder) + fd.to_bytes(4, sys.byteorder, signed=True))
        ok = call(ctypes.c_long(445), ctypes.c_int(ruleset), ctypes.c_int(1), rule, ctypes.c_uint32(0)) == 0
        os.close(fd)
        return ok

    writable = [path for path in os.environ.get("KSCOUT_SANDBOX_WRITABLE", "").split(os.pathsep) if allow(path, handled)]
    for path in readable:
        allow(path, read)
    if call(ctypes.c_long(446), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        return "open (Landlock refused: " + os.strerror(ctypes.get_errno()) + ")"
    os.close(ruleset)
    folders = [p for p in writable if not p.startswith("/dev/")]
    return "writes only below " + ", ".join(folders) + " and to " + str(len(writable) - len(folders)) + " device files" + (
        "; no reads in the home folder but Python's and the caches" if read else "") + " (Landlock ABI " + str(abi) + (
        "; signals and abstract sockets scoped to the worker)" if scoped else ")")

os.environ["KSCOUT_SANDBOX_FILES"] = restrict_files()

def refuse_unix_sockets():
    # seccomp: socket(AF_UNIX, ...) fails with EACCES from here on, in the worker and all it starts. The
    # network namespace cuts TCP and abstract sockets, but a socket file on disk is reached by path:
    # a review's candidate connected to the user's ssh-agent and had it sign data with the user's key;
    # docker.sock or a Ray node's sockets would answer the same way. The worker talks over pipes.
    if os.environ.get("KSCOUT_SANDBOX_NETWORK") == "allow":
        return "open (KSCOUT_SANDBOX_NETWORK=allow)"
    import platform, struct
    arch, nr = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}.get(platform.machine(), (None, None))
    if arch is None:
        return "open (no seccomp filter for " + platform.machine() + ")"
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [
        (ld, 0, 0, 4),  # the architecture
        (jeq, 0, 6, arch),  # another one (a 32-bit process): allow
        (ld, 0, 0, 0),  # the system call's number
        (jge, 3, 0, 0x40000000),  # x32 numbering: refuse
        (jeq, 0, 3, nr),  # not socket(): allow
        (ld, 0, 0, 16),  # its first argument, the address family
        (jeq, 0, 1, 1),  # AF_UNIX: refuse
        (ret, 0, 0, 0x00050000 | 13),  # SECCOMP_RET_ERRNO | EACCES
        (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    ]
    code = b"".join(struct.pack("HBBI", *op) for op in program)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if prctl(22, 2, ctypes.c_void_p(ctypes.addressof(fbuf)), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return "open (seccomp refused: " + os.strerror(ctypes.get_errno()) + ")"
    return "UNIX sockets refused (seccomp)"

os.environ["KSCOUT_SANDBOX_SOCKETS"] = refuse_unix_sockets()
os.environ.pop("KSCOUT_SANDBOX_WRITABLE", None)
os.environ.pop("KSCOUT_SANDBOX_READABLE", None)
os.execv(sys.executable, [sys.executable, "-m", "kernelscout.sandbox.worker"] + sys.argv[1:])
"""

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


def kill_tree(root: Optional[int], known: Optional[dict[int, int]] = None) -> None:
    """SIGKILL `root`, everything descended from it or in its process group, and the `known` processes.

    A process group misses anything a candidate moves to a new session (setsid,
    start_new_session=True), so the tree is walked instead. It is frozen first with SIGSTOP,
    parents before children, and walked again until no new process appears (a stopped process
    cannot fork), then killed. Processes orphaned earlier were re-parented to the worker, a child
    subreaper, so they are in the tree too; `known` (pid -> start time) adds processes seen under
    the worker earlier that may have left the tree since. `root` must be a pid that cannot have been
    reused (a worker not yet reaped). Never raises.
    """
    known = known or {}
    if not _LINUX:
        if root is not None:
            try:
                os.killpg(root, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return
    if root is None and not known:
        return
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
    for pid in frozen:
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

    def __init__(self, device: str = "cpu", threads: Optional[int] = None, memory_bytes: Optional[int] = None):
        self.device = device
        self.threads = threads or default_threads()
        self.memory_bytes = memory_bytes if memory_bytes is not None else default_memory_bytes()
        self._scratch = ScratchDir("worker")  # swept by a later worker if this supervisor is killed
        self.log_path = self.workdir / "worker.log"
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        env = clean_env(device, self.threads, self.memory_bytes if device.startswith("cpu") else 0, self.workdir)
        share_precompiled_headers(self.workdir, env)
        protect_supervisor()
        launch = ["-c", _LAUNCHER] if _LINUX else ["-m", "kernelscout.sandbox.worker"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
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
        os.close(cmd_r)
        os.close(res_w)
        self.pid = self.proc.pid  # the launcher: the process this supervisor started and waits for
        self.worker_pid = self.pid  # the process running candidate code (below the launcher in a PID namespace)
        self._own = {self.pid}  # the sandbox's own processes, which are never strays
        self._seen: dict[int, int] = {}  # pid -> start time of the processes last seen under the worker
        _LIVE[self.pid] = self
        self.info: dict[str, Any] = {}
        self.measurements = 0
        self.ran_candidate = False  # set before a candidate is handed over; such a worker is never reused

    @property
    def own_pids(self) -> frozenset[int]:
        """The sandbox's own processes (launcher, namespace init, worker) as this supervisor sees them."""
        return frozenset(self._own)

    # -- talking -----------------------------------------------------------------------------
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

    def __init__(self, device: str, threads: Optional[int], memory_bytes: Optional[int]):
        super().__init__(name=f"kscout-spare-{device}", daemon=True)
        self.device, self.threads, self.memory_bytes = device, threads, memory_bytes
        self.worker: Optional[WorkerProcess] = None
        self.environ = dict(os.environ)  # what it was started under: a worker takes its settings from it

    def run(self) -> None:
        try:
            worker = WorkerProcess(self.device, self.threads, self.memory_bytes)
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
                 reuse: bool = False):
        """`reuse=True` keeps a worker warm across candidates, as before the review: for candidates that
        are one's own (the test suite's shared pool), never for a search's."""
        self.threads = threads
        self.memory_bytes = memory_bytes
        self.spares = spares
        self.reuse = reuse
        self._idle: dict[str, list[WorkerProcess]] = {}
        self._starting: dict[str, _Spare] = {}
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
        worker = WorkerProcess(device, self.threads, self.memory_bytes)
        try:
            worker.start(start_timeout)
        except Exception:
            worker.close()
            raise
        return worker

    def release(self, worker: WorkerProcess, healthy: bool) -> None:
        """Keep a healthy worker warm unless it has run a candidate; close one that is not, or that has
        processes left running under it."""
        if healthy and (self.reuse or not worker.ran_candidate) and worker.alive and not worker.stray_processes():
            self._idle.setdefault(worker.device, []).append(worker)
            return
        worker.close()
        if self.spares and worker.device not in self._starting and not self._idle.get(worker.device):
            spare = _Spare(worker.device, self.threads, self.memory_bytes)
            self._starting[worker.device] = spare
            spare.start()

    def prewarm(self, device: str) -> None:
        self.release(self.acquire(device), healthy=True)

    def close(self) -> None:
        for spare in self._starting.values():
            worker = spare.take()
            if worker is not None:
                worker.close()
        self._starting.clear()
        for workers in self._idle.values():
            for worker in workers:
                worker.close()
        self._idle.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
