"""The first code of every sandbox worker: confine the process, then exec the worker module.

Run by the supervisor (sandbox/pool.py) as ``python -c <this file's text> CMD_FD RES_FD`` on Linux, so
before the worker module and before any candidate code. With a PID namespace, the process the supervisor
started (the launcher) stays outside it and mirrors the exit of the worker, which runs two forks down;
without one it execs the worker in place (same pid). Every step is best effort: a kernel or a user that
refuses one still gets a working worker, and the worker's hello says what was refused
(KSCOUT_SANDBOX_NETWORK, _PIDS, _PROC, _FILES, _SOCKETS, _CPUS).

Why its text with ``-c`` and not ``-m kernelscout.sandbox.launcher``: ``-m`` would import the package
(kernelscout/__init__.py and what it imports) before the confinement, and pay for that import in every
worker. This file imports only the standard library. Importing it does nothing; `main()` does it all.
"""

import ctypes
import os
import signal
import sys

libc = ctypes.CDLL(None, use_errno=True)
prctl = libc.prctl

NEWUSER, NEWNET, NEWPID, NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000


def make_namespaces(with_pid=True):
    """CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS: a network namespace of the worker's own,
    whose only device is a loopback that is down, so a candidate cannot send the user's files anywhere;
    and a PID namespace with a /proc of its own (mounted in a private mount namespace), in which the
    supervisor and every other process of the user have no pid, so a candidate can neither signal them
    (SIGSTOP the supervisor, kill(-1) the user's session) nor read their /proc entries (the environment of
    a process the user started with an API key in it). The user namespace is what lets a normal user
    create them; mapping the same uid and gid keeps the worker's file access what it was. A kernel or
    security module that refuses some leaves those open. KSCOUT_SANDBOX_NETWORK=allow and
    KSCOUT_SANDBOX_PIDS=shared opt out. Returns what was made: (network, pids, proc) as the hello says them."""
    want_net = os.environ.get("KSCOUT_SANDBOX_NETWORK") != "allow"
    want_pid = with_pid and os.environ.get("KSCOUT_SANDBOX_PIDS") != "shared"
    network = "isolated" if want_net else "open (KSCOUT_SANDBOX_NETWORK=allow)"
    pids = "isolated" if want_pid else "shared (KSCOUT_SANDBOX_PIDS=shared)"
    proc = "private" if want_pid else "host"
    if not (want_net or want_pid):
        return network, pids, proc
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
    return network, pids, proc


def drop_privileges():
    """PR_CAPBSET_DROP, for a supervisor running as root: without these the worker cannot read another root
    process's memory or environment through /proc, load kernel modules, or trace anything (CAP_SYS_MODULE,
    CAP_SYS_RAWIO, CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE). Dropped
    from the bounding set, they are gone once the worker is exec'd. After the user namespace, whose
    creation hands the process a full set again (scoped to that namespace, but scoped is not the same as
    gone)."""
    for cap in (16, 17, 19, 21, 38, 39, 40):
        prctl(24, cap, 0, 0, 0)
    prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid program (sudo, su) gives them back


def mirror(status):
    """Leave as the worker left: the same exit code, or killed by the same signal (the supervisor reports a
    candidate's SIGSEGV as such); init passes a signal on as 128 + its number."""
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code if code >= 0 else 1)


def enter_pid_namespace(channel, proc):
    """A new PID namespace holds only the children made after unshare. The first is its init (pid 1): it
    reaps orphans, and when it exits the kernel kills everything left in the namespace. The worker is
    init's child, an ordinary process, so signals it sends itself behave as usual. Returns (in the worker)
    what /proc is: the namespace's own, or the host's and why."""
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
    return proc


def restrict_files():
    """Landlock (Linux 5.13+, unprivileged, inherited by every child): from here on the worker can create,
    change or delete files only below the folders and files the supervisor names (its scratch folder, the
    compile caches, the usual device files), and read nothing in the user's home folder, the folder kscout
    was started in (its kscout.toml) or the kscout config folder but what the supervisor names (Python, the
    import path, this package, the caches; `pool.readable_paths`). Running programs stays open (compilers).
    Without it a candidate could find the run directory and rewrite its SQLite files (forge a measurement,
    hand back budget), or read the user's keys from their files."""
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
        "; no reads in the home folder or the working folder but Python's, this package's and the caches" if read else "") + " (Landlock ABI " + str(abi) + (
        "; signals and abstract sockets scoped to the worker)" if scoped else ")")


def pin_cpus():
    """The cores this worker may run on, from KSCOUT_CPUS (set when `--workers N` splits the machine), before
    any candidate code: threads started later inherit the mask, and `seccomp_rules` then refuses to change
    it. Without a pin, a candidate that raised its thread count inside its call and lowered it again before
    returning would have had every core, the reference only its share."""
    wanted = os.environ.pop("KSCOUT_CPUS", "")
    if not wanted or not hasattr(os, "sched_setaffinity"):
        return "every core of the machine"
    cpus = {int(c) for c in wanted.split(",")}
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # cores outside the supervisor's own mask (a container changed under us)
        return "every core of the machine (pinning to " + wanted + " refused: " + exc.strerror + ")"
    return "cores " + wanted


# seccomp system call numbers: socket, sched_setaffinity, userfaultfd
_CALLS = {"x86_64": (0xC000003E, 41, 203, 323), "aarch64": (0xC00000B7, 198, 122, 282)}


def seccomp_rules():
    """seccomp, in the worker and all it starts, from here on:

    * socket(AF_UNIX, ...) fails with EACCES. The network namespace cuts TCP and abstract sockets, but a
      socket file on disk is reached by path: a review's candidate connected to the user's ssh-agent and
      had it sign data with the user's key; docker.sock or a Ray node's sockets would answer the same way.
      The worker talks over pipes. KSCOUT_SANDBOX_NETWORK=allow lifts this rule.
    * sched_setaffinity fails with EPERM: the cores a worker runs on are set before candidate code runs
      (`pin_cpus`), and neither side may change them. Pinning the reference's threads to one core between
      two calls made an unchanged softmax look 5.1x faster (caught after the call since the thirty-fourth
      session; now refused outright), and widening its own mask inside the call gave a candidate more cores
      than its worker's share.
    * userfaultfd fails with EPERM: a candidate could return outputs whose pages are filled only when read, by
      a thread of its own, so that only the rounds the output check reads would do the work, outside every
      timed call (the seventh red-team pass's lead; opened unprivileged with UFFD_USER_MODE_ONLY before this).
      No kernel needs it.

    Returns what the hello says of sockets and of the CPU mask."""
    import platform
    import struct
    arch, socket_nr, affinity_nr, userfaultfd_nr = _CALLS.get(platform.machine(), (None, None, None, None))
    if arch is None:
        return "open (no seccomp filter for " + platform.machine() + ")", "changeable (no seccomp filter)"
    # by now the variable holds what the namespaces made ("open (KSCOUT_SANDBOX_NETWORK=allow)"), not the wish
    sockets = "allow" not in os.environ.get("KSCOUT_SANDBOX_NETWORK", "")
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    eacces, eperm, allow = 0x00050000 | 13, 0x00050000 | 1, 0x7FFF0000  # SECCOMP_RET_ERRNO | errno; RET_ALLOW
    # (code, jump if true, jump if false, k), jumps to labels resolved below
    program = [
        (ld, 0, 0, 4),  # the architecture
        (jeq, 0, "allow", arch),  # another one (a 32-bit process): allow
        (ld, 0, 0, 0),  # the system call's number
        (jge, "eacces", 0, 0x40000000),  # x32 numbering: refuse
        (jeq, "eperm", 0, userfaultfd_nr),
        (jeq, "eperm", 0 if sockets else "allow", affinity_nr),
    ]
    if sockets:
        program += [
            (jeq, 0, "allow", socket_nr),  # not socket(): allow
            (ld, 0, 0, 16),  # its first argument, the address family
            (jeq, "eacces", "allow", 1),  # AF_UNIX: refuse
        ]
    labels = {"eacces": len(program), "eperm": len(program) + 1, "allow": len(program) + 2}
    program += [(ret, 0, 0, eacces), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    resolved = [(op, labels[jt] - i - 1 if isinstance(jt, str) else jt, labels[jf] - i - 1 if isinstance(jf, str) else jf, k)
                for i, (op, jt, jf, k) in enumerate(program)]
    code = b"".join(struct.pack("HBBI", *op) for op in resolved)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(resolved), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if prctl(22, 2, ctypes.c_void_p(ctypes.addressof(fbuf)), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        reason = os.strerror(ctypes.get_errno())
        return "open (seccomp refused: " + reason + ")", "changeable (seccomp refused: " + reason + ")"
    return ("UNIX sockets refused (seccomp)" if sockets else "open (KSCOUT_SANDBOX_NETWORK=allow)"), "fixed (seccomp)"


def enter_own_processes(channel, pids, proc):
    """Every worker, launched or forked: into its PID namespace where it has one, and a child subreaper
    (PR_SET_CHILD_SUBREAPER): a process the candidate orphans (double fork, daemon) is re-parented to the
    worker instead of init, so it stays in the worker's process tree, where the supervisor finds it."""
    os.environ["KSCOUT_SANDBOX_PROC"] = enter_pid_namespace(channel, proc) if pids == "isolated" else proc
    prctl(36, 1, 0, 0, 0)


def restrict_the_rest():
    """Every worker's last steps before its own code: its cores, files (Landlock), then UNIX sockets and the
    CPU mask (seccomp), and the rule lists out of the environment the candidate will see."""
    cores = pin_cpus()
    os.environ["KSCOUT_SANDBOX_FILES"] = restrict_files()
    sockets, mask = seccomp_rules()
    os.environ["KSCOUT_SANDBOX_SOCKETS"] = sockets
    os.environ["KSCOUT_SANDBOX_CPUS"] = cores + "; " + mask
    os.environ.pop("KSCOUT_SANDBOX_WRITABLE", None)
    os.environ.pop("KSCOUT_SANDBOX_READABLE", None)


def make_pid_namespace():
    """For a worker forked from the zygote: the PID and mount namespaces of its own that `make_namespaces`
    makes for a launched worker (the zygote's user namespace gives the capability to make them)."""
    if os.environ.get("KSCOUT_SANDBOX_PIDS") == "shared":
        return "shared (KSCOUT_SANDBOX_PIDS=shared)", "host"
    if libc.unshare(NEWPID | NEWNS) == 0:
        return "isolated", "private"
    reason = os.strerror(ctypes.get_errno())
    if libc.unshare(NEWPID) == 0:
        return "isolated", "host (no mount namespace: " + reason + ")"
    return "shared (no PID namespace: " + reason + ")", "host"


def drop_capabilities():
    """A forked worker is not exec'd, so it would keep the full capability set that making the zygote's user
    namespace handed it (scoped to that namespace, where the zygote and the other workers live): with
    CAP_SYS_PTRACE a candidate could write into the zygote and so into every later worker. capset() to
    none, as exec would have left a non-root user; a later exec (a compiler) gets no more than the bounding
    set allows."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice (64 capabilities): all empty
    return libc.capset(header, data) == 0


def confine_forked_worker(channel, network):
    """In a child of the zygote, before the worker's code runs: the same confinement as `main`, in the same
    order, but with torch already imported. Returns in the worker process (two forks down, as in `main`)."""
    os.setsid()  # a session of its own, as start_new_session gives a launched worker
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the zygote gone, this child goes too
    pids, proc = make_pid_namespace()
    os.environ["KSCOUT_SANDBOX_NETWORK"], os.environ["KSCOUT_SANDBOX_PIDS"] = network, pids
    enter_own_processes(channel, pids, proc)
    drop_capabilities()  # after the namespace: mounting its /proc needed CAP_SYS_ADMIN
    prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the zygote is not, its workers are (the supervisor reads their /proc)
    restrict_the_rest()


def forget_zygote_paths():
    """Paths that modules imported in the zygote computed from its TMPDIR, computed again from the worker's.
    Inductor fixes its precompiled-header folder at import ($TMPDIR/torchinductor_USER/precompiled_headers,
    whatever TORCHINDUCTOR_CACHE_DIR says): left as the zygote's, every cpp_wrapper build in a worker failed
    with PermissionError (Landlock lets a worker write only its own folder and the caches). Best effort:
    these are torch internals (2.13), and a torch without them has nothing to fix."""
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None or not hasattr(codecache, "_HEADER_DIR") or not hasattr(codecache, "default_cache_dir"):
        return
    try:
        codecache._HEADER_DIR = os.path.join(codecache.default_cache_dir(), "precompiled_headers")
        if hasattr(codecache, "_HEADER_LOCK_DIR"):
            codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
        precompile = getattr(codecache, "_precompile_header", None)
        if hasattr(precompile, "cache_clear"):
            precompile.cache_clear()
    except Exception:  # an Inductor laid out otherwise: its first compile says what is wrong
        pass


def run_forked_worker(control, request, fds, network):
    """The zygote's child: take on the worker's environment, folder and log, confine itself, run the worker.
    Never returns."""
    import json
    import traceback

    code = 1
    try:
        control.close()
        spec = json.loads(request)
        os.environ.clear()
        os.environ.update(spec["env"])
        os.chdir(spec["cwd"])
        null = os.open("/dev/null", os.O_RDONLY)
        log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        confine_forked_worker(fds, network)
        import tempfile

        tempfile.tempdir = None  # the worker's TMPDIR, not the zygote's
        forget_zygote_paths()
        from kernelscout.sandbox import worker

        worker.apply_limits()
        sys.argv = ["kernelscout.sandbox.worker", str(fds[0]), str(fds[1])]
        worker.main()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def warm_inductor(torch):
    """One tiny torch.compile of the zygote's own, so that its later workers inherit Inductor's modules and what it
    probes once per process (the C++ compiler, the CPU's vector ISA): a new process paid about 2 s for
    that before its first compiled candidate. With one thread, so that no OpenMP team exists at fork (its
    threads would not survive into the workers); Dynamo's caches are cleared afterwards, so no worker
    starts with a compiled function in them. A failure only costs the workers that time again."""
    import traceback

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.compile(lambda x: (x * 2).relu())(torch.ones(8))
    except Exception:
        traceback.print_exc()
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(threads)


def freeze_heap():
    """Collect, then move every object the zygote holds (torch's million or so) out of the collector's reach,
    as the worker does for itself at start: done here once, a fork inherits it, and the worker's own
    collect-and-freeze at start walks only what it made (it took a good part of a forked worker's 0.3 s
    hello). Fewer of the zygote's pages are then written by a worker's collections, so fewer are copied."""
    import gc

    gc.collect()
    gc.freeze()


def zygote_main(control_fd):
    """A process that imports torch and the worker's modules once and forks a fresh worker for each request,
    so a measurement does not wait for a new interpreter to import torch (2.5 s on a 2-core VM). It never
    loads a problem or a candidate: each worker is a new process that no candidate has run in, as with a
    launched one. Its own confinement is the user and network namespaces (made once, shared by its
    workers, whose loopback is down and whose UNIX sockets are refused); each worker makes the rest itself.

    Protocol on `control_fd` (a SOCK_SEQPACKET socket to the supervisor): a request is a JSON message
    {env, cwd, log} carrying the worker's two pipe ends; the answer is {"forked": pid}; when a child exits,
    {"exit": pid, "code": exit code as subprocess gives it}; once it has warmed Inductor, {"warmed": true}. End of file from the supervisor ends the zygote
    (and, through PR_SET_PDEATHSIG, its workers)."""
    import json
    import select
    import socket
    import warnings

    network, _, _ = make_namespaces(with_pid=False)
    # the bounding set and no_new_privs, for everything the zygote and its workers exec; the effective set
    # stays (CAP_SYS_ADMIN in its user namespace is what lets each worker make its own PID namespace) and
    # each worker drops it (drop_capabilities). No PR_SET_PDEATHSIG here: it fires when the supervisor's
    # thread that started the zygote ends, which may be a short-lived one; end of file on the control
    # socket ends the zygote instead.
    drop_privileges()
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: another process of the user cannot read or trace it
    control = socket.socket(fileno=control_fd)
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)  # torch's one idle thread
    import torch  # noqa: F401  (what every worker would import)
    import torch._dynamo  # noqa: F401
    from kernelscout.sandbox import worker  # noqa: F401  (the harness's modules)

    freeze_heap()
    # a child's exit wakes the loop at once (the supervisor waits for it when it retires a worker)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    control.sendall(json.dumps({"ready": os.getpid(), "network": network}).encode())
    live, forked, warmed = set(), 0, False
    while True:
        readable, _, _ = select.select([control, wake_r], [], [], 1.0)
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            live.discard(pid)
            control.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if not warmed and forked and not live:
            # once its first worker is done and none is running (so nothing being timed shares the CPU
            # with it): a one-off measurement never waits for this, a search's second worker does, once
            warm_inductor(torch)
            freeze_heap()
            warmed = True
            control.sendall(json.dumps({"warmed": True}).encode())  # a long-lived worker may now be forked (the referee)
            continue
        if control not in readable:
            continue
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
        if not message:
            os._exit(0)
        child = os.fork()
        if child == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_r)
            os.close(wake_w)
            run_forked_worker(control, message, fds, network)
        for fd in fds:
            os.close(fd)
        live.add(child)
        forked += 1
        control.sendall(json.dumps({"forked": child}).encode())


def main():
    if sys.argv[1] == "zygote":
        zygote_main(int(sys.argv[2]))
        return
    network, pids, proc = make_namespaces()
    os.environ["KSCOUT_SANDBOX_NETWORK"], os.environ["KSCOUT_SANDBOX_PIDS"], os.environ["KSCOUT_SANDBOX_PROC"] = network, pids, proc
    drop_privileges()
    enter_own_processes([int(fd) for fd in sys.argv[1:3]], pids, proc)
    restrict_the_rest()
    os.execv(sys.executable, [sys.executable, "-m", "kernelscout.sandbox.worker"] + sys.argv[1:])


if __name__ == "__main__":
    main()
