"""Notice when candidate code tampers with the process it shares with the harness.

The worker imports this module, and so captures the original timer and sync functions,
before any candidate is loaded. Replacing ``time.perf_counter`` or ``torch.cuda.Event.elapsed_time``
afterwards changes a name, not the functions held here, and the snapshot diff names what changed.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

perf_counter_ns = time.perf_counter_ns
monotonic = time.monotonic
thread_count = threading.active_count
list_threads = threading.enumerate
_thread_clock = getattr(time, "pthread_getcpuclockid", None)
_clock_ns = getattr(time, "clock_gettime_ns", None)
cuda_synchronize = torch.cuda.synchronize
cuda_event = torch.cuda.Event
event_record = torch.cuda.Event.record
event_elapsed = torch.cuda.Event.elapsed_time
process_times = os.times
_listdir, _os_open, _os_read, _os_close = os.listdir, os.open, os.read, os.close
try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)  # the C library the process already has
except (OSError, TypeError):  # no such handle on this platform
    _libc = None
_getrusage = resource.getrusage
get_num_threads, set_num_threads = torch.get_num_threads, torch.set_num_threads
get_default_dtype, set_default_dtype = torch.get_default_dtype, torch.set_default_dtype
deterministic_enabled = torch.are_deterministic_algorithms_enabled
deterministic_warn_only = torch.is_deterministic_algorithms_warn_only_enabled
use_deterministic = torch.use_deterministic_algorithms


_HARNESS_PREFIX = "kernelscout.sandbox"
_PROBLEM_PREFIX = "kscout_problem_"


def _watched() -> list[tuple[str, Any]]:
    """Namespaces a cheat would patch: the timer's and the checker's own modules (and their classes),
    the problem module (its reference Model), torch's public functions and every nn layer class (a
    patched nn.Linear.forward slows the reference the candidate is compared with)."""
    spaces: list[tuple[str, Any]] = [
        ("time", time),
        ("torch", torch),
        ("torch.nn.functional", F),
        ("torch.Tensor", torch.Tensor),
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.testing", torch.testing),
        ("torch.backends.cuda.matmul", torch.backends.cuda.matmul),
        ("torch.nn.Module", torch.nn.Module),
    ]
    for label in ("torch.linalg", "torch.fft", "torch.special", "torch._C._nn", "torch._C._VariableFunctions"):
        module = _resolve(label)
        if module is not None:
            spaces.append((label, module))
    spaces += [(f"torch.nn.{name}", cls) for name, cls in sorted(vars(torch.nn).items())
               if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls is not torch.nn.Module]
    base = getattr(torch._C, "TensorBase", None) or getattr(torch._C, "_TensorBase", None)
    if base is not None:
        spaces.append(("torch._C.TensorBase", base))  # what torch.Tensor inherits most methods from
    flops = sys.modules.get("torch.utils.flop_counter")
    if flops is not None:  # imported before a candidate whose FLOPs are counted (sandbox/flop_count.py)
        spaces += [("torch.utils.flop_counter", flops)] + [(f"torch.utils.flop_counter.{name}", getattr(flops, name))
                                                           for name in ("FlopCounterMode", "_FlopCounterMode") if hasattr(flops, name)]
    modules = sorted(sys.modules.items())
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "Worker"):  # the worker runs as `python -m`, so it is __main__
        modules.append((_HARNESS_PREFIX + ".worker (__main__)", main))
    for name, module in modules:
        if module is None or not (name.startswith(_HARNESS_PREFIX) or name.startswith(_PROBLEM_PREFIX)):
            continue
        spaces.append((name, module))
        spaces += [(f"{name}.{cls_name}", cls) for cls_name, cls in sorted(vars(module).items())
                   if isinstance(cls, type) and getattr(cls, "__module__", None) == module.__name__]
    return spaces


def _resolve(dotted: str) -> Any:
    obj: Any = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


_INHERITED = "\0inherited"  # a class's entry: every name it resolved, its own or inherited, at the snapshot


def _entries(label: str, obj: Any) -> dict[str, Any]:
    """id of every callable or object in a namespace, and of a function's code: swapping a
    function's ``__code__`` in place keeps the function object. In the harness's and the problem's
    own namespaces plain values count too (a tolerance or a pool size is as good a target as a
    function). For a class, also the names it inherits: a new attribute that shadows an inherited
    method (``Tensor.resolve_conj`` lives on TensorBase) is a patch, not a new name."""
    try:
        items = list(vars(obj).items())
    except TypeError:
        return {}
    ours = label.startswith(_HARNESS_PREFIX) or label.startswith(_PROBLEM_PREFIX)
    out: dict[str, Any] = {}
    for name, value in items:
        if isinstance(value, types.ModuleType):
            continue
        if isinstance(value, (int, float, str, bool, type(None))):
            if ours:
                out[name] = ("value", repr(value))
            continue
        out[name] = (id(value), id(getattr(value, "__code__", None)))
    if isinstance(obj, type):
        out[_INHERITED] = frozenset(dir(obj))
    return out


_CUDA_STARTED = "\0cuda initialized"  # torch.cuda's entry: whether CUDA had been initialised at the snapshot
# What torch.cuda's own lazy initialisation replaces. On a GPU host a CPU measurement starts with CUDA
# uninitialised, and torch.compile (inductor queries the GPU) initialises it from inside a correct
# candidate: seen on an H200 on 2026-11-27, where every CPU torch.compile rewrite was judged tampering.
_LAZY_CUDA_STATE = ("default_generators",)


def _flop_formulas() -> dict[str, Any]:
    """torch's flop registry, operator by formula: a candidate whose FLOPs are counted could make a GEMM count as
    nothing by replacing its entry in place, which the namespaces' own entries do not show."""
    flops = sys.modules.get("torch.utils.flop_counter")
    registry = getattr(flops, "flop_registry", None) if flops is not None else None
    if not isinstance(registry, dict):
        return {}
    return {str(op): (id(fn), id(getattr(fn, "__code__", None))) for op, fn in registry.items()}


def snapshot() -> dict[str, dict[str, Any]]:
    snap = {label: _entries(label, obj) for label, obj in _watched()}
    if formulas := _flop_formulas():
        snap["torch.utils.flop_counter.flop_registry"] = formulas
    snap.setdefault("torch.cuda", {})[_CUDA_STARTED] = torch.cuda.is_initialized()
    return snap


def _lazily_set(entries: dict[str, Any]) -> frozenset[str]:
    """torch.cuda names that CUDA's first use replaced since the snapshot. They are let pass only when
    CUDA started after it: the device measured on is then the CPU, which neither the CUDA generators
    nor anything else set by the initialisation takes part in. On a CUDA device CUDA is running before
    the snapshot, so a candidate that swaps these is still caught."""
    if entries.get(_CUDA_STARTED, True) or not torch.cuda.is_initialized():
        return frozenset()
    return frozenset(_LAZY_CUDA_STATE)


def changed_since(before: dict[str, dict[str, Any]], after: Optional[dict[str, dict[str, Any]]] = None) -> list[str]:
    """Names whose object was replaced since the snapshot (new names, such as lazily imported
    submodules, are not tampering). The worker installs torch.compile's own patches before any
    snapshot (see `install_library_patches`), so every replacement seen here is the candidate's, bar what
    CUDA's own lazy start replaces during a CPU measurement (`_lazily_set`)."""
    after = snapshot() if after is None else after
    changes = []
    for label, entries in before.items():
        now = after.get(label, {})
        allowed = _lazily_set(entries) if label == "torch.cuda" else frozenset()
        for name, ident in entries.items():
            if name in (_INHERITED, _CUDA_STARTED) or name in allowed:
                continue
            if name in now and now[name] != ident:
                changes.append(f"{label}.{name}")
            elif name not in now:
                changes.append(f"{label}.{name} (deleted)")
        inherited = entries.get(_INHERITED, frozenset())
        changes += [f"{label}.{name} (shadows an inherited attribute)" for name in now
                    if name != _INHERITED and name not in entries and name in inherited]
    originals = {
        "time.perf_counter_ns": (time.perf_counter_ns, perf_counter_ns),
        "time.monotonic": (time.monotonic, monotonic),
        "torch.cuda.synchronize": (torch.cuda.synchronize, cuda_synchronize),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event.elapsed_time, event_elapsed),
        "torch.cuda.Event.record": (torch.cuda.Event.record, event_record),
    }
    for name, (now, orig) in originals.items():
        if now is not orig and name not in changes:
            changes.append(name)
    return sorted(set(changes))


def install_library_patches() -> None:
    """Let torch.compile make its process-wide patches now, before the first snapshot.

    Importing torch._dynamo replaces torch.manual_seed, and its first use rewraps nn.Module.__init__
    and __setstate__. Done here, they are part of the baseline, so an allowlist (which a candidate
    could imitate) is not needed. Costs about two seconds once per worker.
    """
    try:
        import torch._dynamo  # noqa: F401
        from torch._dynamo.mutation_guard import install_generation_tagging_init

        install_generation_tagging_init()
    except Exception:  # an older or stripped torch: nothing to pre-install
        pass


def thread_cpu_ms(ident: int) -> Optional[float]:
    """CPU time a Python thread has used, or None if it has ended or the platform cannot say."""
    if _thread_clock is None or _clock_ns is None:
        return None
    try:
        return _clock_ns(_thread_clock(ident)) / 1e6
    except (OSError, OverflowError, ValueError):
        return None


def children_cpu_s() -> float:
    """CPU seconds used by the worker's child processes that have exited and been waited for."""
    t = process_times()
    return t.children_user + t.children_system


def os_thread_count() -> int:
    try:
        return len(_listdir("/proc/self/task"))
    except OSError:
        return thread_count()


def os_thread_ids() -> set[str]:
    """The process's OS threads (their task ids), native ones included: a thread started with
    `_thread` or from C is invisible to `threading` but not here."""
    try:
        return set(_listdir("/proc/self/task"))
    except OSError:
        return set()


def _read_proc(path: str) -> Optional[bytes]:
    """A /proc file whole, through the functions captured at import, or None if it cannot be read."""
    try:
        fd = _os_open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = b""
        while chunk := _os_read(fd, 65536):
            data += chunk
        return data
    except OSError:
        return None
    finally:
        _os_close(fd)


def _schedstat(tid: str) -> Optional[tuple[int, int, int]]:
    """(nanoseconds on a CPU, nanoseconds runnable but waiting for one, times run) of one thread, or None
    when it has ended (or the kernel keeps no schedstat)."""
    fields = (_read_proc(f"/proc/self/task/{tid}/schedstat") or b"").split()
    try:
        return int(fields[0]), int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def thread_runs(tids: set[str]) -> dict[str, tuple[int, int]]:
    """(times the scheduler has run it, nanoseconds it has spent on a CPU) for each thread still alive,
    from its schedstat. A count that moved across a window means the thread ran in it, however
    briefly: unlike CPU time, the count has no resolution to hide under."""
    return {tid: (stat[2], stat[0]) for tid in tids if (stat := _schedstat(tid)) is not None}


def thread_schedstats() -> dict[str, tuple[int, int, int]]:
    """`_schedstat` of every thread of the process, read once: what the worker compares across a timed
    reference call, for the threads the candidate started (`Worker._disturbed`) and for the time all
    threads spent runnable but off a CPU. On an idle machine a timed call adds next to nothing to the
    second; when another process holds the cores the worker runs on, each of its threads queues behind
    it, and a multi-threaded operator waits at every barrier for the thread that was pushed off its core."""
    return {tid: stat for tid in os_thread_ids() if (stat := _schedstat(tid)) is not None}


def page_faults() -> int:
    """Minor page faults of the whole process so far: memory touched for the first time since the OS
    handed it over (or took it back)."""
    try:
        return _getrusage(resource.RUSAGE_SELF).ru_minflt
    except (OSError, ValueError):
        return 0


def voluntary_waits() -> int:
    """Times the calling thread has given up its core to wait (for a lock, the GIL, I/O): Linux counts
    them per thread."""
    try:
        return _getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (AttributeError, OSError, ValueError):
        return 0


def settle_os_threads(baseline: int, settle_s: float = 0.05) -> tuple[int, float]:
    """(OS threads above `baseline` still alive once exiting ones have had `settle_s` to go, milliseconds
    waited for them; 0.0 when none was exiting).

    A thread that a call started and joined is not gone when join returns: Python releases the join
    once the thread's Python state is done, and OpenMP's team for that thread is torn down after it,
    so /proc/self/task still lists them for a moment (0.1 ms on one VM, 0.2 ms on another). A thread
    still there after the wait was left running. The caller bills the wait to the call that started
    the threads: their teardown is that call's cost, and the supervisor's wall clock sees it there."""
    start = time.perf_counter_ns()
    if os_thread_count() <= baseline:
        return 0, 0.0
    deadline = time.monotonic() + settle_s
    while (extra := os_thread_count() - baseline) > 0 and time.monotonic() < deadline:
        time.sleep(5e-5)  # fine-grained: the whole wait is added to the candidate's time
    return max(extra, 0), (time.perf_counter_ns() - start) / 1e6


def precision_flags() -> dict[str, Any]:
    return {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }


def _flag(obj: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    return (lambda: getattr(obj, name)), (lambda value: setattr(obj, name, value))


def _deterministic() -> tuple[bool, bool]:
    return deterministic_enabled(), deterministic_warn_only()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    use_deterministic(value[0], warn_only=value[1])


_getaffinity, _setaffinity = getattr(os, "sched_getaffinity", None), getattr(os, "sched_setaffinity", None)


def _affinity() -> tuple:
    """The distinct CPU masks of the process's OS threads. Why a shared setting: a candidate that pins
    every thread to one core after its call and frees them at the start of its next makes the
    reference run on one core (found in a review: an unchanged softmax at 5.1x)."""
    if _getaffinity is None:
        return ()
    masks = set()
    for tid in os_thread_ids() or {"0"}:
        try:
            masks.add(tuple(sorted(_getaffinity(int(tid)))))
        except OSError:  # the thread exited meanwhile
            continue
    return tuple(sorted(masks))


def _set_affinity(masks: tuple) -> None:
    if _setaffinity is None or len(masks) != 1:  # several masks: no way to tell which thread had which
        return
    for tid in os_thread_ids():
        try:
            _setaffinity(int(tid), masks[0])
        except OSError:
            continue


def _loaded_libraries(pattern: str) -> list[tuple[str, ctypes.CDLL]]:
    """The shared libraries this process has mapped whose path matches `pattern`, opened (already loaded,
    so opening them again only hands back a handle)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if re.search(pattern, line)})
    except OSError:
        return []
    libraries = []
    for path in paths:
        try:
            libraries.append((path, ctypes.CDLL(path)))
        except OSError:
            continue
    return libraries


def _openmp_settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    """OpenMP's own switches in every OpenMP runtime the process has loaded (torch's bundled libgomp,
    an Intel or LLVM one). torch's thread count is OpenMP's max-threads and does not show these: a
    review's candidate set max-active-levels to 0 at the end of its call, so every parallel loop of the
    reference ran on one thread, and back at the start of its own (softmax 4.62x, linear_gelu 2.59x, with
    honest figures of 2.55x and 1.45x, timings valid)."""
    settings: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
    for path, lib in _loaded_libraries(r"/lib(g|i|)omp[^/]*\.so"):
        try:
            levels = (lib.omp_get_max_active_levels, lib.omp_set_max_active_levels)
            dynamic = (lib.omp_get_dynamic, lib.omp_set_dynamic)
        except AttributeError:
            continue
        name = os.path.basename(path)
        settings[f"OpenMP max active levels ({name})"] = levels
        settings[f"OpenMP dynamic threads ({name})"] = dynamic
    return settings


def _mkl_settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    """MKL's thread count as the calling thread sees it, in every loaded library that exports it (torch's
    CPU library links MKL in). MKL keeps a per-thread count that overrides the global one and that neither
    torch's thread count nor OpenMP shows: a review's candidate set it to 1 at the end of its call and back
    at the start, and the linear_gelu reference's matmul ran on one thread (2.13x against 1.36x honest,
    timing valid). Put back by clearing the per-thread count, then setting it if that is not enough."""
    settings: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
    for path, lib in _loaded_libraries(r"/lib(torch_cpu|mkl[^/]*)\.so"):
        try:
            get, local = lib.MKL_Get_Max_Threads, lib.MKL_Set_Num_Threads_Local
        except AttributeError:
            continue

        def put(value: Any, get: Callable[[], int] = get, local: Callable[[int], int] = local) -> None:
            local(0)
            if get() != value:
                local(int(value))

        settings[f"MKL threads ({os.path.basename(path)})"] = (get, put)
    return settings


_cuda = torch.backends.cuda
# name -> (getter, setter), captured before any candidate loads
_SHARED_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "torch threads": (get_num_threads, set_num_threads),
    "CPU affinity": (_affinity, _set_affinity),
    "default dtype": (get_default_dtype, set_default_dtype),
    "default device": (torch.get_default_device, torch.set_default_device),
    "deterministic algorithms": (_deterministic, _set_deterministic),
    "cudnn.benchmark": _flag(torch.backends.cudnn, "benchmark"),
    "cudnn.deterministic": _flag(torch.backends.cudnn, "deterministic"),
    "cudnn.enabled": _flag(torch.backends.cudnn, "enabled"),
    "mkldnn.enabled": _flag(torch.backends.mkldnn, "enabled"),
    # scaled_dot_product_attention's backends, on the CPU too: with flash attention switched off, a
    # 4x8x512x64 attention took 135 ms instead of 31 on this project's 2-core machine
    "flash SDP": (_cuda.flash_sdp_enabled, _cuda.enable_flash_sdp),
    "memory-efficient SDP": (_cuda.mem_efficient_sdp_enabled, _cuda.enable_mem_efficient_sdp),
    "math SDP": (_cuda.math_sdp_enabled, _cuda.enable_math_sdp),
    "cuDNN SDP": (_cuda.cudnn_sdp_enabled, _cuda.enable_cudnn_sdp),
    "preferred BLAS library": (_cuda.preferred_blas_library, _cuda.preferred_blas_library),
    "preferred linalg library": (_cuda.preferred_linalg_library, _cuda.preferred_linalg_library),
    **_openmp_settings(),
    **_mkl_settings(),
}


def shared_settings() -> dict[str, Any]:
    """Process-wide torch settings that both sides run under and that change how fast the reference
    runs: a candidate that sets them one way after its own call and back at the start of the next
    (one thread for the reference, every core for itself) makes an unchanged kernel look faster."""
    return {name: get() for name, (get, _) in _SHARED_SETTINGS.items()}


def restore_settings(settings: dict[str, Any]) -> None:
    """Put back what `shared_settings` returned, only what differs (setting the thread count is not free)."""
    for name, (get, put) in _SHARED_SETTINGS.items():
        if name in settings and get() != settings[name]:
            try:
                put(settings[name])
            except (RuntimeError, ValueError, TypeError):  # the candidate's call is flagged for the change anyway
                pass


def is_parallelism(name: str) -> bool:
    """The shared settings that decide how many cores the reference computes on. Unlike the others
    (cudnn.benchmark, a default dtype), a candidate's choice of these at import is not a choice both
    sides benefit from alike: the reference was written for the machine's cores, and a candidate that
    chose one thread for everyone at import ran the softmax example at 2.6x against 2.35x for the same
    kernel without the setting."""
    return name in ("torch threads", "CPU affinity") or name.startswith(("OpenMP", "MKL"))


_get_itimer, _get_signal = signal.getitimer, signal.getsignal
_gettrace, _getprofile, _settrace, _setprofile = sys.gettrace, sys.getprofile, sys.settrace, sys.setprofile
try:
    from torch.overrides import _get_current_function_mode_stack as _function_mode_stack
    from torch.utils._device import DeviceContext as _DeviceContext
except ImportError:  # an older torch: count every mode
    _function_mode_stack, _DeviceContext = None, ()


def _function_modes() -> int:
    """Torch function modes in force, bar the one `torch.set_default_device` pushes (a shared setting)."""
    if _function_mode_stack is None:
        return getattr(torch._C, "_len_torch_function_stack", lambda: 0)()
    return sum(1 for mode in _function_mode_stack() if not isinstance(mode, _DeviceContext))


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
# the events a callback can be registered for: the single-bit ones (composites such as 3.14's BRANCH are refused)
_MONITORING_EVENTS = tuple(sorted(
    (name, value) for name, value in vars(_monitoring.events).items()
    if isinstance(value, int) and value > 0 and value & (value - 1) == 0)) if _monitoring is not None else ()


def monitoring_callbacks() -> tuple[tuple[int, str, int], ...]:
    """(tool, event, callback id) for every sys.monitoring callback in the process. Asking `get_tool` is not
    enough: a tool id freed after its callback and a code object's local events were set reads as unused (no
    name, no global events) while the callback still runs at every call of that code, on Python 3.12 and 3.13,
    so a candidate could slow the reference's `forward` alone. sys.monitoring has no getter for callbacks, so each
    is swapped out and straight back in (`register_callback` returns the one it replaced)."""
    found = []
    for tool in range(6):
        for name, event in _MONITORING_EVENTS:
            try:
                callback = _monitoring.register_callback(tool, event, None)
            except ValueError:
                continue
            if callback is not None:
                _monitoring.register_callback(tool, event, callback)
                found.append((tool, name, id(callback)))
    return tuple(found)


def _readable_signals() -> tuple[int, ...]:
    out = []
    for sig in sorted(signal.valid_signals()):
        try:
            _get_signal(sig)
            out.append(int(sig))
        except (ValueError, OSError):
            pass
    return tuple(out)


_SIGNALS = _readable_signals()


def _handler_key(handler: Any) -> Any:
    return handler if handler is None or isinstance(handler, int) else id(handler)


_sigaction = getattr(_libc, "sigaction", None)
_SIGACTION_BUF = ctypes.create_string_buffer(256)  # larger than glibc's struct sigaction
_KERNEL_SIGNALS = tuple(s for s in range(1, 65) if s not in (signal.SIGKILL, signal.SIGSTOP))


def kernel_signal_handlers() -> tuple:
    """The handler address the kernel holds for every signal. `signal.getsignal` shows only what
    Python installed: a review's candidate installed libc's `usleep` as a C handler with `sigaction`
    through ctypes, fired it from a `timer_create` timer every 300 us, and disarmed the timer during
    its own call (softmax 5.2x, layernorm 6.2x, linear_gelu 2.8x, timings valid)."""
    if _sigaction is None:
        return ()
    handlers = []
    for sig in _KERNEL_SIGNALS:
        ok = _sigaction(sig, None, _SIGACTION_BUF) == 0  # glibc refuses its own reserved signals (32, 33)
        handlers.append(int.from_bytes(_SIGACTION_BUF.raw[:8], "little") if ok else None)
    return tuple(handlers)


def posix_timers() -> int:
    """How many timer_create timers the process has (interval timers are `getitimer`'s)."""
    return (_read_proc("/proc/self/timers") or b"").count(b"ID:")


def code_hooks() -> dict[str, Any]:
    """What makes code run in the worker's main thread without being called: a timer signal's
    handler, a trace or profile function, a torch function or dispatch mode, a monitoring tool. Set up
    by a candidate, any of these runs inside the reference's calls too, where it can burn time only
    there (a SIGALRM handler every millisecond, idle while the candidate's own call ran, made an
    unchanged softmax look 1.80x faster). Unlike the shared settings, none is fair at import: a kernel
    has no use for them, so they are compared with the worker's state before any candidate loaded (once
    the problem file is imported: what it sets up is not the candidate's doing)."""
    hooks: dict[str, Any] = {
        "interval timers": tuple(_get_itimer(t) != (0.0, 0.0) for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)),
        "signal handlers": tuple((sig, _handler_key(_get_signal(sig))) for sig in _SIGNALS),
        "C signal handlers": kernel_signal_handlers(),
        "POSIX timers": posix_timers(),
        "sys.settrace": id(_gettrace()),
        "sys.setprofile": id(_getprofile()),
        "torch function modes": _function_modes(),
        "torch dispatch modes": _dispatch_modes(),
    }
    if _monitoring is not None:
        hooks["sys.monitoring tools"] = tuple(_monitoring.get_tool(i) for i in range(6))
        hooks["sys.monitoring callbacks"] = monitoring_callbacks()
    # the collector's callbacks run at every collection, and collections run inside the harness's own
    # code between calls: a review's candidate computed each round's answer there, in the supervisor's
    # `prep`, from the input tensors it kept (refilled in place), and returned it in 0.03 ms (softmax 78x,
    # linear_gelu 300x). A low threshold is what made collections frequent enough for it.
    hooks["gc callbacks"] = tuple(id(cb) for cb in _GC_CALLBACKS)
    hooks["gc thresholds"] = _gc_get_threshold()
    hooks["autocast"] = autocast_state()
    return hooks


def autocast_state() -> tuple:
    """Autocast per device type (on or off, and to which dtype) and its weight cache, in this thread.

    Not a setting both sides may share: a red-team candidate switched CPU autocast on at import, so the
    reference's `nn.Linear` ran in bfloat16 in every check, timed call and re-check, its output became
    bfloat16, and the output check applied bfloat16's tolerance to a candidate 1 % off (judged correct);
    only the referee, in a worker without it, computed in float32. `torch.no_grad()` around each call
    does not reset it."""
    state: list[tuple] = []
    for device in ("cpu", "cuda"):
        try:
            state.append((device, torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device))))
        except (RuntimeError, TypeError, AttributeError):  # an older torch, or a device type it does not know
            continue
    state.append(("weight cache", torch.is_autocast_cache_enabled()))
    return tuple(state)


_AUDIT_VETO: list = []


def refuse_audit_hooks() -> None:
    """No audit hook may be added once a candidate loads. Audit hooks cannot be removed or listed, and
    they run on events the harness itself raises between calls (imports, file and directory access),
    so one would be a place for a candidate's code to run outside its timed call that no check could
    see. Python asks the hooks already there before adding one (the "sys.addaudithook" event); this
    one refuses, and the candidate's hook is silently not added. Installed once per worker."""
    if _AUDIT_VETO:
        return

    def veto(event: str, args: tuple) -> None:
        if event == "sys.addaudithook":
            raise RuntimeError("kernelscout's sandbox: no audit hooks in a worker")

    sys.addaudithook(veto)
    _AUDIT_VETO.append(veto)


def hooks_changed(initial: dict[str, Any]) -> list[str]:
    now = code_hooks()
    changed = [name for name, value in initial.items() if now.get(name) != value]
    if "signal handlers" in changed:  # name the signals
        before = dict(initial["signal handlers"])
        sigs = [_signal_name(s) for s, h in now["signal handlers"] if before.get(s) != h]
        changed[changed.index("signal handlers")] = "signal handlers (" + ", ".join(sigs) + ")"
    if "autocast" in changed:  # not code, but a switch that changes what the reference computes
        on = [f"{entry[0]} to {entry[2]}" for entry in now["autocast"] if len(entry) == 3 and entry[1]]
        changed[changed.index("autocast")] = "autocast" + (f" (switched on for {', '.join(on)}: the reference's matmuls and "
                                                           "convolutions ran in that precision)" if on else "")
    return changed


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {sig}"


def clear_trace_hooks() -> None:
    """No trace or profile function in the reference's calls (the worker itself sets none)."""
    if _gettrace() is not None:
        _settrace(None)
    if _getprofile() is not None:
        _setprofile(None)


_dispatch_dump, _all_op_names = torch._C._dispatch_dump, torch._C._dispatch_get_all_op_names
try:
    from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
except ImportError:  # an older torch: no recording, the import-time check still runs
    _TorchDispatchMode = None


def kernel_tables(ops: Optional[list[str]] = None) -> dict[str, int]:
    """A fingerprint of torch's dispatch table for each operator (all of aten and prims by default).

    Why: `torch.library.Library("aten", "IMPL").impl("exp", ...)` replaces the kernel every caller
    of `torch.exp` gets, the reference included, and none of the function or namespace checks sees
    it, because no Python name changes (found in a review: an exact but 5 ms slower exp made an
    unchanged softmax look 7.7x faster). The table names where each kernel was registered, so a
    replaced one shows. Meta kernels are left out: torch registers those lazily (shape inference,
    never run on data), and a candidate's torch.compile imports modules that add some."""
    names = ops if ops is not None else [n for n in _all_op_names() if n.startswith(("aten::", "prims::"))]
    tables = {}
    for name in names:
        try:
            text = _dispatch_dump(name)
        except RuntimeError:  # not registered (any more)
            text = ""
        tables[name] = hash(tuple(line for line in text.splitlines() if not line.startswith("Meta")))
    return tables


def kernel_subset(ops: set[str], known: dict[str, int]) -> dict[str, int]:
    """`kernel_tables` of `ops`, taken from `known` (a fingerprint of all of aten and prims read at the same
    moment) where it has them: only the others are read again."""
    tables = {op: known[op] for op in ops if op in known}
    tables.update(kernel_tables(sorted(set(ops) - tables.keys())))
    return tables


def kernels_replaced(before: dict[str, int]) -> list[str]:
    now = kernel_tables(list(before))
    return sorted(name for name, fingerprint in before.items() if now[name] != fingerprint)


def composite_ops() -> list[str]:
    """aten and prims operators with a CompositeImplicitAutograd kernel. A recorder (below) never sees them:
    they decompose before the dispatcher reaches it. But a backend kernel registered for one (`aten::to.dtype`
    on CPU, behind `.double()`) takes over from the decomposition, so a check of what some code calls must
    include them."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [n for n in _all_op_names() if n.startswith(("aten::", "prims::")) and has(n, "CompositeImplicitAutograd")]


def _judge_spaces() -> list[tuple[str, Any]]:
    """The Python namespaces the output check calls through: its own module, torch, torch.linalg and the
    tensor classes (the narrow part of `_watched`, cheap enough to read before every comparison)."""
    base = getattr(torch._C, "TensorBase", None) or getattr(torch._C, "_TensorBase", None)
    spaces = [("torch", torch), ("torch.linalg", torch.linalg), ("torch.Tensor", torch.Tensor)]
    if base is not None:
        spaces.append(("torch._C.TensorBase", base))
    spaces += [(name, module) for name, module in sorted(sys.modules.items())
               if name == _HARNESS_PREFIX + ".correctness" and module is not None]
    return spaces


class Judge:
    """What decides whether an output is right, as it was before any candidate loaded: the kernels of the
    operators the comparison reaches (`ops`, recorded from a comparison of the reference's output with
    itself, plus every composite operator), the Python names it calls, and torch's function and dispatch
    modes. A sixth review's candidate registered a kernel for `aten::_to_copy` in its first call, kept alive
    only by its own model: the `.double()` in the comparison then finished the round's work into the
    output it had returned empty (softmax 54x, valid), or a zero `linalg_vector_norm` made zeros correct.
    The kernel was gone by the time the candidate was dropped, so the check at unload saw nothing; read
    before every comparison, it costs about 10 ms."""

    def __init__(self, ops: set[str], known: dict[str, int]) -> None:
        """`known`: the kernel fingerprints of all of aten and prims, read just before (`kernel_tables()`)."""
        self.ops = sorted(ops)
        self.kernels = kernel_subset(set(ops) | set(composite_ops()), known)
        self.names = {label: _entries(label, obj) for label, obj in _judge_spaces()}
        self.modes = (_function_modes(), _dispatch_modes())

    def changes(self, deep: bool = True) -> list[str]:
        """deep=False reads only the recorded operators (well under a millisecond) and skips the ~770 composite
        ones (~9 ms); the supervisor picks which re-checks go deep after the candidate's call has returned."""
        kernels = self.kernels if deep else {op: self.kernels[op] for op in self.ops}
        found = [f"torch's kernel for {op} was replaced" for op in kernels_replaced(kernels)]
        found += [f"{name} was replaced" for name in
                  changed_since(self.names, {label: _entries(label, obj) for label, obj in _judge_spaces()})
                  if not name.startswith(("time.", "torch.cuda."))]
        if (_function_modes(), _dispatch_modes()) != self.modes:
            found.append("a torch function or dispatch mode is in force")
        return found


if _TorchDispatchMode is not None:
    class OpRecorder(_TorchDispatchMode):
        """The operators a model's call reaches, so that their kernels can be checked after every
        candidate call (all of aten takes ~0.1 s; a reference's few take well under a millisecond)."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func._schema.name)
            return func(*args, **(kwargs or {}))
else:
    OpRecorder = None


gc_isenabled, gc_enable, gc_disable, gc_collect = gc.isenabled, gc.enable, gc.disable, gc.collect
_GC_CALLBACKS, _gc_get_threshold = gc.callbacks, gc.get_threshold  # the collector's own list, whatever gc.callbacks is rebound to


def pin_precision() -> None:
    """TF32 off on both sides: a candidate must not win by computing an fp32 problem in TF32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


# -- the C allocator's settings ----------------------------------------------------------------------
# glibc's mallopt parameters (malloc.h) and the values every timed call starts from. The worker's
# environment sets the mmap and trim thresholds (sandbox/pool.py, clean_env: freed blocks kept for
# reuse, so a call does not page-fault its temporaries in again); the rest are glibc's defaults on a
# 64-bit machine. glibc has no getter for them, so they are set again before every timed call, on
# both sides: a review's candidate lowered the thresholds through ctypes at import, so every large
# temporary of the reference became a fresh mmap that page-faults (softmax reference 3 ms to 14 ms,
# 12x reported), while it wrote into buffers of its own.
_M_MXFAST, _M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_PERTURB, _M_ARENA_MAX = 1, -1, -2, -3, -4, -6, -8


def _mallopt() -> Optional[Callable[[int, int], int]]:
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        return None
    try:
        fn = _libc.mallopt
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _libc.gnu_get_libc_version  # glibc's mallopt; musl has none of these parameters
        return fn
    except AttributeError:
        return None


def _allocator_settings() -> list[tuple[int, int]]:
    keep = int(os.environ.get("MALLOC_MMAP_THRESHOLD_", "0") or 0)
    trim = int(os.environ.get("MALLOC_TRIM_THRESHOLD_", "0") or 0)
    arenas = int(os.environ.get("MALLOC_ARENA_MAX", "0") or 0)
    settings = [(_M_MXFAST, 128), (_M_TOP_PAD, 128 * 1024), (_M_MMAP_MAX, 65536), (_M_PERTURB, 0)]
    settings += [(_M_MMAP_THRESHOLD, keep)] if keep else []
    settings += [(_M_TRIM_THRESHOLD, trim)] if trim else []
    settings += [(_M_ARENA_MAX, arenas)] if arenas else []
    return settings


_MALLOPT, _ALLOCATOR = _mallopt(), _allocator_settings()


def pin_allocator() -> None:
    """The C allocator's settings back to the worker's own, before a timed call (a few microseconds)."""
    if _MALLOPT is not None:
        for param, value in _ALLOCATOR:
            _MALLOPT(param, value)
