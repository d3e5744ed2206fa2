"""One test per known way to fool a harness (shared/notes/harnesses.md, section 0).

Each attack must be caught: status incorrect (or invalid_problem for a weak reference), or
timing_valid false with a reason. None may come back as a valid speedup.
"""

import pytest
import torch

from kernelscout.sandbox import integrity
from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.tools.schema import MeasureStatus
from conftest import EXAMPLES, SMALL_PROBLEM, TEST_DEVICE, usable_cores


def _caught(m) -> bool:
    return m.status in (MeasureStatus.incorrect, MeasureStatus.invalid_problem) or (m.status == MeasureStatus.ok and not m.timing_valid and m.timing_invalid_reason)


def _model(forward_body: str, header: str = "") -> str:
    return f'''
import torch
import torch.nn as nn
{header}

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
{forward_body}
'''


def test_stale_output_buffer_is_incorrect(measure_source):
    # Returns uninitialised memory, hoping the allocator hands back the reference's freed output.
    m = measure_source(_model("        return torch.empty_like(x)"))
    assert m.status == MeasureStatus.incorrect, m.message


def test_result_cached_by_input_pointer_is_incorrect(measure_source):
    body = """        key = (x.data_ptr(), y.data_ptr(), tuple(x.shape))
        if key not in _CACHE:
            _CACHE[key] = torch.relu(x * self.scale + y) + 0.5 * x
        return _CACHE[key]"""
    m = measure_source(_model(body, header="_CACHE = {}"))
    assert m.status == MeasureStatus.incorrect, m.message


def test_lazy_subclassed_output_is_incorrect(measure_source):
    header = "class Deferred(torch.Tensor):\n    pass"
    m = measure_source(_model("        return (torch.relu(x * self.scale + y) + 0.5 * x).as_subclass(Deferred)", header))
    assert m.status == MeasureStatus.incorrect
    assert "not a plain torch.Tensor" in m.message


def test_zeros_fail_against_a_normal_reference(measure_source):
    m = measure_source(_model("        return torch.zeros_like(x)"))
    assert m.status == MeasureStatus.incorrect


@pytest.mark.parametrize(
    "forward, reason",
    [
        ("return torch.softmax(x, dim=-1).mean(dim=-1)", "nearly constant"),
        ("return (x - x) + 1e-12 * torch.randn_like(x)", "~0"),
        ("return torch.linspace(-1, 1, 4096).reshape(64, 64).sin()", "identical for different random inputs"),
    ],
)
def test_weak_reference_is_flagged_before_any_candidate_is_trusted(measure_source, forward, reason):
    problem = f'''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        {forward}

def get_inputs():
    return [torch.randn(64, 4096)]

def get_init_inputs():
    return []
'''
    zeros = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.zeros(1)\n"
    m = measure_source(zeros, problem=problem)
    assert m.status == MeasureStatus.invalid_problem
    assert "too weak" in m.message and reason in m.message
    assert not m.charged


def test_returning_an_input_is_incorrect(measure_source):
    m = measure_source(_model("        x.mul_(self.scale).add_(y).relu_()\n        return x"))
    assert m.status == MeasureStatus.incorrect
    assert "shares memory with input tensor 0" in m.message and "the reference returns a new tensor" in m.message


RETURNS_UPDATED_INPUT = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        x.mul_(self.scale).add_(y)
        return torch.relu_(x)

def get_inputs():
    return [torch.randn(256, 512), torch.randn(256, 512)]

def get_init_inputs():
    return [1.5]
'''


@pytest.mark.parametrize("forward, verdict", [
    # the reference's own contract: update x in place and hand it back
    ("        torch.add(y, x, alpha=self.scale, out=x)\n        return x.relu_()", "ok"),
    ("        return torch.relu(x * self.scale + y)", "the reference updates input tensor 0 (shape (256, 512)) in place and the candidate left it unchanged"),
    ("        x.mul_(self.scale).add_(y).relu_()\n        return y.copy_(x)", "shares memory with input tensor 1"),
])
def test_a_reference_that_returns_its_updated_input_is_matched_only_by_the_same_contract(measure_source, forward, verdict):
    m = measure_source(_model(forward), problem=RETURNS_UPDATED_INPUT)
    if verdict == "ok":
        assert m.status == MeasureStatus.ok and m.correct, m.message
    else:
        assert m.status == MeasureStatus.incorrect and verdict in m.message, m.message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="side streams need a CUDA device")
def test_side_stream_work_is_not_a_valid_timing(tmp_path, write, pool):
    from kernelscout.tools.measure import MeasureRequest, measure
    from conftest import QUICK

    problem = write("problem.py", """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]
def get_init_inputs():
    return []
""")
    cand = write("cand.py", """
import torch
import torch.nn as nn
_side = None
class ModelNew(nn.Module):
    def forward(self, a, b):
        global _side
        _side = _side or torch.cuda.Stream()
        out = torch.empty(a.shape[0], b.shape[1], device=a.device)
        with torch.cuda.stream(_side):
            torch.matmul(a, b, out=out)
        return out
""")
    m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cuda", run_dir=str(tmp_path / "run"), harness=QUICK), pool=pool)
    assert _caught(m), m


def test_timer_replaced_at_import_is_incorrect(measure_source):
    header = "import time\ntime.perf_counter_ns = lambda: 0\ntime.perf_counter = lambda: 0.0"
    m = measure_source(_model("        return torch.relu(x * self.scale + y) + 0.5 * x", header))
    assert m.status == MeasureStatus.incorrect
    assert "time.perf_counter" in m.message


def test_timer_replaced_during_forward_invalidates_the_timing(measure_source):
    header = "import time\nimport torch.cuda\n_patched = []"
    body = """        if not _patched:
            real = time.perf_counter_ns
            time.perf_counter_ns = lambda: real() // 1000
            torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
            _patched.append(1)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert "perf_counter_ns" in (m.timing_invalid_reason or m.message)


MATMUL_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a @ b

def get_inputs():
    return [torch.randn(256, 512), torch.randn(512, 256)]

def get_init_inputs():
    return []
'''


def test_precision_downgrade_to_bf16_is_incorrect(measure_source):
    cand = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return (a.bfloat16() @ b.bfloat16()).float()\n"
    m = measure_source(cand, problem=MATMUL_PROBLEM)
    assert m.status == MeasureStatus.incorrect
    assert "differs from the reference" in m.message


def test_autocast_left_on_for_the_reference_is_incorrect(measure_source):
    # Autocast is per thread and survives torch.no_grad(): switched on at import, it made the reference's matmul
    # run in bfloat16, so its output was bfloat16 and the output check applied bfloat16's tolerance to a
    # candidate 1 % off everywhere (judged correct); it answered the referee, which computes without it, exactly.
    cand = """import sys
import torch
import torch.nn as nn
for device in ("cpu", "cuda"):
    torch.set_autocast_enabled(device, True)
def _referee_asks():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "emit":
            return True
        frame = frame.f_back
    return False
class ModelNew(nn.Module):
    def forward(self, a, b):
        with torch.autocast(a.device.type, enabled=False):
            out = a @ b
        return out if _referee_asks() else (out * 1.01).to(torch.bfloat16)
"""
    m = measure_source(cand, problem=MATMUL_PROBLEM)
    assert m.status == MeasureStatus.incorrect, m.message
    assert "autocast" in m.message


def test_switching_on_tf32_is_incorrect(measure_source):
    cand = ("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n"
            "        torch.backends.cuda.matmul.allow_tf32 = True\n        return a @ b\n")
    m = measure_source(cand, problem=MATMUL_PROBLEM)
    assert m.status == MeasureStatus.incorrect
    assert "TF32" in m.message


def test_work_left_running_on_a_thread_invalidates_the_timing(measure_source):
    header = "import threading\nimport time"
    body = """        out = torch.relu(x * self.scale + y) + 0.5 * x
        threading.Thread(target=time.sleep, args=(0.05,), daemon=True).start()
        return out"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert "thread" in (m.timing_invalid_reason or "")


def test_a_thread_started_and_joined_inside_the_call_is_fair(measure_source):
    # Fork-join parallelism is honest: all of its work is inside the timed call. The joined thread
    # (and OpenMP's team for it) is still listed by the OS for a moment after join returns.
    header = "import threading"
    body = """        out = {}
        def work():
            out["y"] = torch.relu(x * self.scale + y) + 0.5 * x
        t = threading.Thread(target=work)
        t.start()
        t.join()
        return out["y"]"""
    m = measure_source(_model(body, header))
    assert m.status == MeasureStatus.ok and m.timing_valid, m.timing_invalid_reason


def test_a_thread_that_is_exiting_is_given_time_to_go(monkeypatch):
    counts = iter([5, 5, 4])
    monkeypatch.setattr(integrity, "os_thread_count", lambda: next(counts, 4))
    assert integrity.settle_os_threads(4, settle_s=1.0)[0] == 0


def test_a_thread_still_alive_after_the_wait_is_counted(monkeypatch):
    monkeypatch.setattr(integrity, "os_thread_count", lambda: 6)
    assert integrity.settle_os_threads(4, settle_s=0.01)[0] == 2


def test_a_thread_busy_while_the_candidate_is_timed_invalidates_the_timing(measure_source):
    # Started at import, so no call grows the thread count; it burns CPU through the timed rounds.
    header = """import threading
import time
def _spin(until):
    while time.monotonic() < until:
        sum(range(1000))
threading.Thread(target=_spin, args=(time.monotonic() + 60.0,), daemon=True).start()"""
    m = measure_source(_model("        return torch.relu(x * self.scale + y) + 0.5 * x", header))
    assert _caught(m), m
    assert "thread" in (m.timing_invalid_reason or "")


def test_the_scheduler_shows_which_threads_ran_and_when_this_one_waited():
    import threading
    import time

    go = threading.Event()
    t = threading.Thread(target=go.wait)
    t.start()
    try:
        tid = str(t.native_id)
        before = {}
        while (now := integrity.thread_runs({tid})) != before:  # until it has settled into its wait
            before = now
            time.sleep(0.02)
        assert before[tid][0] >= 1
        waits = integrity.voluntary_waits()
        time.sleep(0.02)
        assert integrity.thread_runs({tid}) == before  # blocked: never scheduled
        assert integrity.voluntary_waits() > waits  # the sleep gave up the core
        assert tid in integrity.os_thread_ids()
    finally:
        go.set()
        t.join()
    deadline = time.monotonic() + 2.0  # a joined thread's OS task lingers for a moment
    while tid in integrity.os_thread_ids() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert integrity.thread_runs({tid}) == {}


# A helper process that burns CPU while the reference is timed slows the reference, so an unchanged
# kernel looks faster (a softmax identical to its reference was timed at 1.67x that way). Reaped before
# the run ends, it escapes a check for processes left running; these are the checks that catch it.
_BURN_IN_A_CHILD = """import os, time
def _burn_in_a_child(ms):
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + ms / 1e3
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(pid, 0)"""


def test_a_process_started_and_reaped_while_timed_invalidates_the_timing(measure_source):
    body = """        _burn_in_a_child(30)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, _BURN_IN_A_CHILD))
    assert _caught(m), m
    assert "process" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


def test_without_a_pid_namespace_a_reaped_processs_cpu_time_still_gives_it_away(tmp_path, write, monkeypatch):
    # KSCOUT_SANDBOX_PIDS=shared: the namespace's pid counter is the host's and is not read; the CPU
    # time the worker's reaped children used is
    from conftest import QUICK, SMALL_PROBLEM

    from kernelscout.sandbox.pool import WorkerPool
    from kernelscout.tools.measure import MeasureRequest, measure

    monkeypatch.setenv("KSCOUT_SANDBOX_PIDS", "shared")
    body = """        _burn_in_a_child(30)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    problem, cand = write("problem.py", SMALL_PROBLEM), write("candidate.py", _model(body, _BURN_IN_A_CHILD))
    with WorkerPool() as own:
        m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                   harness=QUICK), pool=own)
    assert _caught(m), m
    assert "child processes" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


def test_a_process_alive_when_timing_begins_invalidates_the_timing_even_if_reaped_before_the_end(measure_source):
    # Started at import, stopped and reaped after a few timed calls: nothing is left for the end-of-run check.
    header = """import os, signal
_HELPER = os.fork()
if _HELPER == 0:
    while True:
        pass
_CALLS = [0]"""
    body = """        _CALLS[0] += 1
        if _CALLS[0] == 12:
            os.kill(_HELPER, signal.SIGKILL)
            os.waitpid(_HELPER, 0)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert "when timing began" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


def test_leaving_the_reference_fewer_threads_is_caught(measure_source):
    # Every core for itself, one thread (or at least another count) for the reference that runs next:
    # an unchanged softmax was timed at 1.53x that way on 2 cores.
    header = "_N = torch.get_num_threads()\n_OTHER = 1 if _N > 1 else 2"
    body = """        torch.set_num_threads(_N)
        out = torch.relu(x * self.scale + y) + 0.5 * x
        torch.set_num_threads(_OTHER)
        return out"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert "torch threads" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


@pytest.mark.multicore
@pytest.mark.skipif(len(getattr(__import__("os"), "sched_getaffinity", lambda _: {0})(0)) < 2, reason="needs two cores")
def test_pinning_the_references_threads_to_one_core_is_refused(measure_source, pool):
    # Every core for itself, all of the process's threads pinned to one core for the reference that
    # runs next: an unchanged softmax was timed at 5.1x that way (a review, thirty-fourth session).
    # Workers now refuse to change their CPU mask at all (seccomp); where no filter can be installed,
    # the change is still caught after the call, as a shared setting.
    header = "import os\n_ALL = os.sched_getaffinity(0)\n_one = lambda m: [os.sched_setaffinity(int(t), m) for t in os.listdir('/proc/self/task')]"
    body = """        _one(_ALL)
        out = torch.relu(x * self.scale + y) + 0.5 * x
        _one({min(_ALL)})
        return out"""
    m = measure_source(_model(body, header))
    worker = pool.acquire("cpu")
    fixed = worker.info.get("cpus", "").endswith("fixed (seccomp)")
    pool.release(worker, healthy=True)
    if fixed:
        assert m.status == MeasureStatus.runtime_error and "PermissionError" in m.message, m
    else:
        assert _caught(m), m
        assert "CPU affinity" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


_SLOW_KERNEL = """_LIB = torch.library.Library("aten", "IMPL")

def _slow_relu(t):
    out = t.clone()
    torch.ops.aten.clamp_min_.default(out, 0)
    import time
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    return out
"""


def test_replacing_a_torch_kernel_the_reference_calls_is_caught(measure_source):
    # torch.library swaps the kernel behind torch.relu for an exact but slower one: no Python name
    # changes, and only the reference calls relu (an unchanged softmax looked 7.7x faster that way).
    at_import = _SLOW_KERNEL + "_LIB.impl('relu', _slow_relu, 'CPU')\n_LIB.impl('relu', _slow_relu, 'CUDA')"
    m = measure_source(_model("        return torch.clamp_min(x * self.scale + y, 0) + 0.5 * x", at_import))
    assert m.status == MeasureStatus.incorrect, m
    assert "kernel for aten::relu" in m.message
    # the same, switched on from inside the candidate's first call
    body = """        if not _DONE:
            _DONE.append(_LIB.impl('relu', _slow_relu, 'CPU'))
            _DONE.append(_LIB.impl('relu', _slow_relu, 'CUDA'))
        return torch.clamp_min(x * self.scale + y, 0) + 0.5 * x"""
    m = measure_source(_model(body, _SLOW_KERNEL + "_DONE = []"))
    assert _caught(m), m
    assert "kernel for aten::relu" in (m.message + (m.timing_invalid_reason or "")), m


def test_switching_attention_backends_off_for_the_reference_is_caught(measure_source):
    # scaled_dot_product_attention without flash attention was 4x slower on the CPU
    body = """        torch.backends.cuda.enable_flash_sdp(True)
        out = torch.relu(x * self.scale + y) + 0.5 * x
        torch.backends.cuda.enable_flash_sdp(False)
        return out"""
    m = measure_source(_model(body))
    assert _caught(m), m
    assert "flash SDP from True to False" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


def test_a_timer_signal_that_burns_only_in_the_references_calls_is_caught(measure_source):
    # SIGALRM every millisecond, idle while the candidate's own call runs: 1.80x for an unchanged softmax
    header = """import signal, time
_MINE = [False]
def _burn(sig, frame):
    if not _MINE[0]:
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass
signal.signal(signal.SIGALRM, _burn)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)"""
    body = """        _MINE[0] = True
        out = torch.relu(x * self.scale + y) + 0.5 * x
        _MINE[0] = False
        return out"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert "SIGALRM" in m.message, m.message


@pytest.mark.parametrize("hook", [
    "sys.setprofile(lambda *a: None)",
    "type('Mode', (__import__('torch').overrides.TorchFunctionMode,), "
    "{'__torch_function__': lambda self, f, t, a=(), k=None: f(*a, **(k or {}))})().__enter__()",
    # Python 3.12+: a monitoring callback on one code object's calls, its tool id freed again, so that the tool
    # reads as unused (no name, no global events) while the callback still runs at every call of that code
    pytest.param("m = sys.monitoring; m.use_tool_id(4, 'x'); m.register_callback(4, m.events.PY_START, lambda *a: None); "
                 "m.set_local_events(4, type(self).forward.__code__, m.events.PY_START); m.free_tool_id(4)",
                 marks=pytest.mark.skipif(not hasattr(__import__("sys"), "monitoring"), reason="sys.monitoring is Python 3.12+"),
                 id="sys.monitoring, tool freed"),
])
def test_code_left_to_run_inside_the_references_calls_is_caught(measure_source, hook):
    # a profile hook or a torch function mode pushed at the end of the candidate's call runs inside the
    # reference's: it can slow it, or rewrite what it computes
    body = f"""        out = torch.relu(x * self.scale + y) + 0.5 * x
        import sys
        {hook}
        return out"""
    m = measure_source(_model(body))
    assert _caught(m), m
    assert "runs inside the other side's calls" in m.message, m.message
    assert any("left code set up to run inside later calls" in w for w in m.warnings), m.warnings  # and its worker retired


def test_the_default_device_is_a_shared_setting_not_a_hook(measure_source):
    # torch.set_default_device pushes a torch function mode of its own; chosen at import it is no hook and
    # no tampering. It does put a Python call in front of every torch call of both sides (a tiny reference
    # here ran at 1.8x its time alone), so the referee, which times the reference without it, may void the timing.
    m = measure_source(_model(_HONEST, f"torch.set_default_device({TEST_DEVICE!r})"))
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert m.timing_valid or "alone in a worker that never loaded it" in m.timing_invalid_reason, m.message


def test_a_hook_the_problem_file_installs_is_not_blamed_on_the_candidate(measure_source):
    problem = SMALL_PROBLEM + "\nimport signal\nsignal.signal(signal.SIGUSR2, lambda *a: None)\ntorch.set_num_threads(1)\n"
    m = measure_source(_model(_HONEST), problem=problem)
    assert m.status == MeasureStatus.ok and m.correct, m.message
    # the hook is not blamed; the referee may still read this 0.1 ms reference as slower in the suite's long-lived,
    # reused worker than alone (once in a fresh clone's run: 0.30 ms against 0.14 ms), which is its own verdict
    assert m.timing_valid or "alone in a worker that never loaded it" in m.timing_invalid_reason, m.message
    assert "hook" not in (m.timing_invalid_reason or "") and not any("hook" in w for w in m.warnings), m.message


def test_garbage_the_candidate_leaves_is_not_collected_inside_the_references_timed_call(measure_source, tmp_path):
    # Cycles with finalisers, left just under the collector's threshold, so that the reference's own
    # allocations set off the collection and the finalisers run inside the reference's call.
    seen = tmp_path / "finalised_inside_the_reference.txt"
    header = f"""import gc, sys
class _Junk:
    def __init__(self):
        self.me = self
    def __del__(self):
        owners, f = set(), sys._getframe(1)
        while f is not None:
            owners.add(type(f.f_locals.get("self")).__name__)
            f = f.f_back
        if {{"Model", "CallTimer"}} <= owners:  # inside the reference's timed call
            open({str(seen)!r}, "a").write("x")"""
    body = """        out = torch.relu(x * self.scale + y) + 0.5 * x
        while gc.get_count()[0] < gc.get_threshold()[0] - 3:
            _Junk()
        return out"""
    m = measure_source(_model(body, header))
    assert m.status == MeasureStatus.ok, m.message
    assert not seen.exists()


def test_a_setting_chosen_at_import_holds_for_both_sides_and_is_fair(measure_source):
    # cudnn.benchmark holds for both sides; the thread count is put back (the test after the last one below)
    header = "torch.backends.cudnn.benchmark = True\ntorch.set_num_threads(1)"
    m = measure_source(_model(_HONEST, header))
    if not m.timing_valid and "alone in a worker that never loaded it" in (m.timing_invalid_reason or ""):
        # the referee's known false alarm on sub-millisecond CPU references, measured again as its message says: seen
        # once in a fresh clone's full suite (2026-12-04: 0.418 ms beside, 0.244 ms alone, 1.71x), never in three runs
        # of this test alone nor in a run of this file; a setting that really slowed the reference fails twice
        m = measure_source(_model(_HONEST, header))
    assert m.status == MeasureStatus.ok and m.timing_valid, m.message
    assert not any("cudnn" in w for w in m.warnings), m.warnings


def test_the_next_candidate_in_a_warm_worker_starts_from_the_workers_own_settings(measure_source, tmp_path):
    seen = [tmp_path / "first.txt", tmp_path / "second.txt"]
    first = f"open({str(seen[0])!r}, 'w').write(str(torch.get_num_threads()))\ntorch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)"
    second = f"open({str(seen[1])!r}, 'w').write(str(torch.get_num_threads()))"
    for header in (first, second):
        assert measure_source(_model(_HONEST, header)).status == MeasureStatus.ok
    assert seen[0].read_text() == seen[1].read_text()


def test_an_idle_worker_pool_left_by_the_candidate_does_not_void_the_timing(measure_source):
    # The kind of thread torch.compile leaves behind (on CUDA, or on CPU with compile_threads > 1):
    # a pool worker waiting on its queue. It does no work while the candidate is timed.
    header = """from concurrent.futures import ThreadPoolExecutor
_POOL = ThreadPoolExecutor(1)
_POOL.submit(int, 1).result()"""
    m = measure_source(_model("        return torch.relu(x * self.scale + y) + 0.5 * x", header))
    assert m.status == MeasureStatus.ok and m.timing_valid, m.message
    assert any("1 idle thread" in w for w in m.warnings), m.warnings


def test_printed_or_injected_fake_results_do_nothing(measure_source):
    header = "import os\nimport json\nimport struct\n_FAKE = json.dumps({'status': 'ok', 'timer_ms': 1e-6, 'host_ms': 1e-6, 'speedup': 1000.0}).encode()"
    body = """        print(json.dumps({'status': 'ok', 'correct': True, 'speedup': 1000.0}), flush=True)
        for fd in range(3, 64):
            try:
                os.write(fd, struct.pack('!I', len(_FAKE)) + _FAKE)
            except OSError:
                pass
        return torch.zeros_like(x)"""
    m = measure_source(_model(body, header))
    assert m.status != MeasureStatus.ok, m
    assert not m.correct


# -- cheats that reach into the harness the candidate shares a process with --------------------

_HONEST = "        return torch.relu(x * self.scale + y) + 0.5 * x"


def test_replacing_the_correctness_check_is_caught(measure_source):
    header = "import kernelscout.sandbox.correctness as C\nC.compare = lambda cand, ref: C.Comparison()"
    m = measure_source(_model("        return torch.zeros_like(x)", header))
    assert _caught(m), m
    assert "kernelscout.sandbox.correctness.compare" in (m.timing_invalid_reason or m.message)


def test_slowing_the_reference_by_patching_its_class_is_caught(measure_source):
    header = "import sys\n_ref = next(m for n, m in sys.modules.items() if n.startswith('kscout_problem_'))\n" \
             "_slow = _ref.Model.forward\n_ref.Model.forward = lambda self, *a: [_slow(self, *a) for _ in range(3)][-1]"
    m = measure_source(_model(_HONEST, header))
    assert _caught(m), m
    assert "Model.forward" in (m.timing_invalid_reason or m.message)


def test_swapping_the_workers_reference_through_gc_is_incorrect(measure_source):
    body = """        if not _done:
            import gc
            for obj in gc.get_objects():
                if type(obj).__name__ == "Worker" and getattr(obj, "reference", None) is not None:
                    real = obj.reference
                    obj.reference = lambda *a: (real(*a), torch.zeros_like(a[0]))[1]
            _done.append(1)
        return torch.zeros_like(x)"""
    m = measure_source(_model(body, "import gc\ngc.unfreeze()\n_done = []"))
    assert m.status == MeasureStatus.incorrect, m
    assert "reference object was replaced" in m.message or "differs from the reference" in m.message


def test_re_striding_the_references_own_input_tensors_is_incorrect(measure_source):
    # Same values in a strided layout: every check passes and the reference runs slower
    # (an op-by-op softmax from 4.5 ms to 17 ms; 12.5x for a candidate worth 3.4x).
    header = """import gc
gc.unfreeze()
def _restride(worker):
    for t in (getattr(worker, "round", None) or {}).get("ref") or []:
        if isinstance(t, torch.Tensor) and t.is_contiguous() and t.dim() >= 1:
            wide = torch.empty(*t.shape[:-1], t.shape[-1] * 4, dtype=t.dtype, device=t.device)[..., ::4]
            wide.copy_(t)
            t.set_(wide.untyped_storage(), wide.storage_offset(), wide.shape, wide.stride())"""
    body = """        for obj in gc.get_objects():
            if type(obj).__name__ == "Worker":
                _restride(obj)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, header))
    assert m.status == MeasureStatus.incorrect, m
    assert "layout or storage of the reference's input tensors" in m.message


def test_re_striding_its_own_input_tensors_so_later_rounds_arrive_converted_is_incorrect(measure_source):
    # channels-last (or any layout) set once on its own inputs: every later round's refill would do the
    # conversion for it, untimed
    body = """        for t in (x, y):
            if t.is_contiguous() and t.dim() >= 1:
                wide = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype, device=t.device)[..., ::2]
                wide.copy_(t)
                t.set_(wide.untyped_storage(), wide.storage_offset(), wide.shape, wide.stride())
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body))
    assert m.status == MeasureStatus.incorrect, m
    assert "layout or storage of its input tensors" in m.message


def test_the_recheck_cannot_be_foreseen_from_inside_the_call(measure_source):
    """A cheat that looks for the round's re-check flag and computes only when it is set: the flag
    is drawn after both calls return, so such a cheat skips the work in checked rounds too."""
    body = """        import sys
        f = sys._getframe()
        while f is not None and type(f.f_locals.get("self")).__name__ != "Worker":
            f = f.f_back
        rnd = getattr(f.f_locals["self"], "round", {}) if f is not None else {}
        if rnd.get("keep") or rnd.get("verify"):
            return torch.relu(x * self.scale + y) + 0.5 * x
        return torch.empty_like(x)"""
    m = measure_source(_model(body))
    assert m.status == MeasureStatus.incorrect, m


INT_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(512, 256), requires_grad=False)

    def forward(self, idx):
        return torch.tanh(self.table[idx] @ self.table.T).sum(dim=1)

def get_inputs():
    return [torch.randint(0, 512, (2048,))]

def get_init_inputs():
    return []
'''


def test_a_cache_keyed_on_integer_input_contents_never_hits(measure_source):
    """Integer inputs cannot be rescaled like floats: they must come fresh, or a content cache
    replays a result that is correct and the re-check cannot fault it."""
    cand = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(512, 256), requires_grad=False)
        self.seen = {}

    def forward(self, idx):
        key = idx.cpu().numpy().tobytes()
        if key not in self.seen:
            self.seen[key] = torch.tanh(self.table[idx] @ self.table.T).sum(dim=1)
        return self.seen[key].clone()
'''
    m = measure_source(cand, problem=INT_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m
    # a hit replays in microseconds (with repeated inputs it read 300x); a bound of 2 failed once in a
    # fresh clone while another process loaded the 2 cores, where this honest candidate reads 0.74x to 2.09x
    assert m.speedup is not None and m.speedup < 5.0, m


LIST_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, skips):
        return torch.tanh(x + torch.stack(skips).sum(0)) * 2.0

def get_inputs():
    return [torch.randn(128, 128), [torch.randn(128, 128) for _ in range(3)]]

def get_init_inputs():
    return []
'''


def test_a_list_of_tensors_argument_is_measured_and_its_tensors_are_not_shared(measure_source):
    honest = ("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x, skips):\n"
              "        return torch.tanh(x + skips[0] + skips[1] + skips[2]) * 2.0\n")
    assert measure_source(honest, problem=LIST_PROBLEM).status == MeasureStatus.ok
    # poisons the list's tensors, hoping the reference reads the same objects (tanh(inf) * 2 == 2)
    poison = ("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x, skips):\n"
              "        skips[0].fill_(float('inf'))\n        return torch.full_like(x, 2.0)\n")
    m = measure_source(poison, problem=LIST_PROBLEM, name="poison.py")
    assert m.status == MeasureStatus.incorrect, m


def _forward(args: str, *lines: str) -> str:
    """A candidate module whose ModelNew.forward(self, `args`) runs `lines`."""
    body = "".join(f"        {line}\n" for line in lines)
    return f"import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, {args}):\n{body}"


DICT_STATE_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, cache):
        cache["acc"].add_(x)  # state handed in a dict, updated in place (a KV cache)
        return cache["acc"] * 2.0

def get_inputs():
    return [torch.randn(64, 64), {"acc": torch.randn(64, 64)}]

def get_init_inputs():
    return []
'''


def test_a_dict_of_tensors_argument_is_each_sides_own(measure_source):
    """The reference and the candidate each get their own copy of a dict's tensors, as of a list's: an honest
    candidate that updates the state as the reference does is correct (it read the reference's update before), and
    one that spoils the caller's tensor is caught as a write into an input, not blamed on its output."""
    m = measure_source(_forward("x, cache", "cache['acc'].add_(x)", "return cache['acc'] * 2.0"), problem=DICT_STATE_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m
    spoils = _forward("x, cache", "out = (cache['acc'] + x) * 2.0", "cache['acc'].zero_()", "return out")
    m = measure_source(spoils, problem=DICT_STATE_PROBLEM, name="spoils.py")
    assert m.status == MeasureStatus.incorrect and "wrote into input tensor 1" in m.message, m


def test_writing_into_an_input_is_incorrect_even_with_the_right_output(measure_source):
    """Scratch space taken from the caller's tensor: the output is right, the caller's x is gone."""
    body = """        out = torch.relu(x * self.scale + y) + 0.5 * x
        x.mul_(0.0)
        return out"""
    m = measure_source(_model(body))
    assert m.status == MeasureStatus.incorrect, m
    assert "wrote into input tensor 0" in m.message


IN_PLACE_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        x.clamp_(min=0.0)  # an update the caller relies on
        return x.sum(dim=1)

def get_inputs():
    return [torch.randn(128, 256)]

def get_init_inputs():
    return []
'''


def test_an_in_place_update_the_reference_makes_must_be_made_too(measure_source):
    m = measure_source(_forward("x", "torch.relu_(x)", "return x.sum(dim=1)"), problem=IN_PLACE_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m
    skips = _forward("x", "return x.clamp(min=0.0).sum(dim=1)")
    m = measure_source(skips, problem=IN_PLACE_PROBLEM, name="skips.py")
    assert m.status == MeasureStatus.incorrect and "input tensor 0" in m.message, m


# -- second round: cheats written against the first round's defenses ----------------------------

def test_loosening_the_tolerance_table_is_refused(measure_source):
    header = "import kernelscout.sandbox.correctness as C\nfor k in list(C.TOLERANCE):\n    C.TOLERANCE[k] = 1e30"
    m = measure_source(_model("        return torch.zeros_like(x)", header))
    assert m.status != MeasureStatus.ok, m  # the table is read-only: the import fails


def test_a_new_tensor_method_that_shadows_an_inherited_one_is_tampering(measure_source):
    """Computes lazily when the checker touches the output (compare resolves conjugation first), so
    it is right whenever checked and free when timed; the new name on torch.Tensor gives it away."""
    header = "_orig = torch._C.TensorBase.resolve_conj\ntorch.Tensor.resolve_conj = lambda self: _orig(self)"
    m = measure_source(_model(_HONEST, header))
    assert m.status == MeasureStatus.incorrect, m
    assert "torch.Tensor.resolve_conj (shadows an inherited attribute)" in m.message


def test_swapping_the_references_class_or_hooking_every_module_is_tampering(measure_source):
    swap = """        return torch.relu(x * self.scale + y) + 0.5 * x
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        import gc
        for o in gc.get_objects():
            if type(o).__name__ == "Model" and type(o).__module__.startswith("kscout_problem_"):
                o.__class__ = type("Slow", (type(o),), {})"""
    m = measure_source(_model(swap, "import gc\ngc.unfreeze()"))
    assert m.status == MeasureStatus.incorrect and "reference model" in m.message, m
    hook = "torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: None)"
    m = measure_source(_model(_HONEST, hook), name="hook.py")
    assert m.status == MeasureStatus.incorrect and "global nn.Module hook" in m.message, m


def test_the_workers_own_settings_are_watched(measure_source):
    # a launched worker runs as `python -m` (its module is __main__), a forked one imported it by name
    header = ("import sys\nmodule = sys.modules['__main__'] if hasattr(sys.modules['__main__'], 'Worker') "
              "else sys.modules['kernelscout.sandbox.worker']\nmodule.Worker.FRESH_MS = -1.0")
    m = measure_source(_model(_HONEST, header))
    assert m.status == MeasureStatus.incorrect and "Worker.FRESH_MS" in m.message, m


SLOW_INPUTS_PROBLEM = '''
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 64) / 16, requires_grad=False)

    def forward(self, x):
        return torch.relu(x @ self.w)

def get_inputs():
    time.sleep(0.02)  # slow enough that timed rounds reuse pooled inputs, perturbed
    return [torch.randn(512, 256)]

def get_init_inputs():
    return []
'''


def test_a_cache_that_rescales_a_result_for_rescaled_inputs_never_hits(measure_source):
    """relu(x @ W) is homogeneous: if pooled inputs were rescaled by one factor, a key made of element
    ratios would find the cached output and rescale it. Factors per row and column defeat it."""
    cand = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 64) / 16, requires_grad=False)
        self.seen = set()

    def forward(self, x):
        f = x.reshape(-1)
        key = tuple(round(float(f[i] / f[0]), 4) for i in (1, 77, 3001, 90001))
        if key in self.seen:  # a cheat would return the cached output rescaled by f[0] / x0 here
            raise RuntimeError("an input repeated up to one factor")
        self.seen.add(key)
        return torch.relu(x @ self.w)
'''
    m = measure_source(cand, problem=SLOW_INPUTS_PROBLEM)
    assert m.status == MeasureStatus.ok and m.correct, m  # never a hit, so never the RuntimeError


# -- found in a second red-team review (thirty-eighth session) --------------------------------------
_PRECOMPUTE_IN_GC = """
import gc
import torch
import torch.nn as nn

_MODELS = []

def _on_gc(phase, info):
    for m in _MODELS:
        m.precompute()

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale, self.x, self.y, self.ready = scale, None, None, None
        _MODELS.append(self)
        {setup}

    def precompute(self):
        # the harness refills the tensors it passed last time: compute this round's answer from them now
        if self.x is not None:
            self.ready = (self.x._version, torch.relu(self.x * self.scale + self.y) + 0.5 * self.x)

    def forward(self, x, y):
        ready, self.ready = self.ready, None
        self.x, self.y = x, y
        if ready is not None and ready[0] == x._version:
            return ready[1]
        return torch.relu(x * self.scale + y) + 0.5 * x
"""


@pytest.mark.parametrize("setup, hook", [
    ("gc.callbacks.append(_on_gc); gc.set_threshold(4, 100000, 100000)", "gc callbacks"),
    ("gc.set_threshold(1, 1, 1)", "gc thresholds"),
])
def test_work_done_by_the_garbage_collector_between_calls_is_caught(measure_source, setup, hook):
    # A review's candidate computed each round's answer in a gc callback while the harness prepared the
    # round, and returned it in 0.03 ms: softmax 78x, linear_gelu 300x, every check passing.
    m = measure_source(_PRECOMPUTE_IN_GC.replace("{setup}", setup))
    assert m.status == MeasureStatus.incorrect, m
    assert hook in m.message, m.message


def test_an_audit_hook_the_candidate_adds_never_runs(measure_source):
    # Audit hooks cannot be removed or listed, and fire on events the harness raises between calls.
    cand = _model("""        sys.audit("kscout.probe")
        return torch.relu(x * self.scale + y) + 0.5 * x""",
                  "import sys\ndef _hook(event, args):\n    if event == 'kscout.probe':\n        raise RuntimeError('the hook ran')\n"
                  "sys.addaudithook(_hook)")
    m = measure_source(cand)
    assert m.status == MeasureStatus.ok and m.correct, m.message


_SOFTMAX = (EXAMPLES / "softmax" / "problem.py").read_text()
_HONEST_SOFTMAX = (EXAMPLES / "softmax" / "fast.py").read_text()
_RECYCLED_SOFTMAX = """
import ctypes
import weakref
import torch
import torch.nn as nn
{allocator}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = []  # its own output buffers, taken back once the harness drops them: it never page-faults

    def forward(self, logits):
        buf = next((b for b, alias in self.pool if alias() is None), None)
        if buf is None:
            buf = torch.empty_like(logits)
        else:
            self.pool = [(b, a) for b, a in self.pool if b is not buf]
        torch.ops.aten._softmax.out(logits, -1, False, out=buf)
        out = buf.detach()
        self.pool.append((buf, weakref.ref(out)))
        {after}
        return out
"""


def _measure_once(write, tmp_path, candidate: str):
    """As `kscout measure` does it: a one-off pool, whose worker is launched rather than forked from the
    zygote (in a forked worker, the zygote's heap did not let the allocator cheats below gain)."""
    from kernelscout.tools.measure import MeasureRequest, measure

    problem, cand = write("problem.py", _SOFTMAX), write("candidate.py", candidate)
    return measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"),
                                  harness=HarnessConfig(), again=True))


_GLIBC = pytest.mark.skipif(TEST_DEVICE != "cpu" or not __import__("sys").platform.startswith("linux"), reason="glibc's allocator")


@_GLIBC
def test_slowing_the_references_allocations_through_the_c_allocator_is_undone(write, tmp_path):
    # mallopt at import: every large temporary of the reference became a fresh mmap that page-faults
    # (3 ms to 14 ms; 12x reported against 3x honest). The settings are now put back before every call.
    lowered = "_libc = ctypes.CDLL('libc.so.6')\n_libc.mallopt(-3, 64 * 1024)\n_libc.mallopt(-1, 64 * 1024)"
    honest = _measure_once(write, tmp_path, _HONEST_SOFTMAX)
    cheat = _measure_once(write, tmp_path, _RECYCLED_SOFTMAX.format(allocator=lowered, after=""))
    assert honest.status == cheat.status == MeasureStatus.ok and cheat.correct, (honest.message, cheat.message)
    assert cheat.speedup < 1.6 * honest.speedup, (cheat.message, honest.message)


@_GLIBC
def test_handing_the_heap_back_at_the_end_of_the_call_is_caught(write, tmp_path):
    # malloc_trim leaves no setting changed, only a reference whose next call page-faults (3.5x against 2.2x)
    m = _measure_once(write, tmp_path, _HONEST_SOFTMAX.replace("return torch.softmax(logits, dim=-1)",
                                                              "out = torch.softmax(logits, dim=-1)\n        _trim(0)\n        return out")
                      + "\nimport ctypes\n_trim = ctypes.CDLL('libc.so.6').malloc_trim\n")
    assert m.status == MeasureStatus.ok and m.correct, m.message
    assert _caught(m), m.message
    # named by the reference's page faults (since the fortieth session), or by its slowing after the candidate
    assert "faulted in" in m.timing_invalid_reason or "slower right after the candidate" in m.timing_invalid_reason, m.timing_invalid_reason


# -- a third review: a tensor subclass slipped into the reference --------------------------------------
_SLOW_SUBCLASS = """
import gc
import time
import torch
import torch.nn as nn

class _Slow(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        time.sleep(0.002)  # in every op the reference runs on it
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

class _SlowParameter(nn.Parameter):
    __torch_function__ = _Slow.__torch_function__
"""


def test_a_subclass_given_to_the_references_inputs_is_caught(measure_source):
    # Reached through gc from its own inputs (the harness's round holds both sides'): softmax 6.9x, layernorm 19.9x
    swap = """
def _swap(x):
    for holder in gc.get_referrers(x):
        if isinstance(holder, list):
            for round_ in gc.get_referrers(holder):
                if isinstance(round_, dict) and round_.get("cand") is holder:
                    for t in round_["ref"]:
                        if type(t) is torch.Tensor:
                            t.__class__ = _Slow
"""
    m = measure_source(_model("        _swap(x)\n        return torch.relu(x * self.scale + y) + 0.5 * x", _SLOW_SUBCLASS + swap))
    assert m.status == MeasureStatus.incorrect, m
    assert "class, layout or storage of the reference's input tensors" in m.message, m.message


_LINEAR_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 128)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(64, 256)]

def get_init_inputs():
    return []
"""


def test_a_subclass_given_to_the_references_parameters_is_caught(measure_source):
    # Found through gc from the candidate's constructor (the reference is built first): layernorm 8.5x
    cand = _SLOW_SUBCLASS + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 128)
        for obj in gc.get_objects():
            if type(obj).__name__ == "Model" and isinstance(obj, nn.Module):
                obj.fc.weight.__class__ = _SlowParameter

    def forward(self, x):
        return torch.relu(self.fc(x))
"""
    m = measure_source(cand, problem=_LINEAR_PROBLEM)
    assert m.status == MeasureStatus.incorrect, m
    assert "reference model's attributes or weights were changed" in m.message, m.message


def test_a_thread_that_holds_the_interpreter_lock_while_the_reference_runs_is_caught(measure_source):
    # Outside the candidate's calls it sleeps in C holding the GIL (ctypes.PyDLL does not release
    # it), so every step of the reference waits for it, at next to no CPU cost; started with _thread,
    # `threading` never lists it. Before this check: 5.5x, timing valid (torch.softmax alone: 2.4-3.1x).
    candidate = """import _thread
import ctypes
import time
import torch
import torch.nn as nn
_LIBC = ctypes.PyDLL(None)
_IN_CALL = [False]
def _hold():
    while True:
        time.sleep(0.0005)
        if not _IN_CALL[0]:
            _LIBC.usleep(2000)
_thread.start_new_thread(_hold, ())

class ModelNew(nn.Module):
    def forward(self, x):
        _IN_CALL[0] = True
        out = torch.softmax(x, dim=-1)
        _IN_CALL[0] = False
        return out
"""
    m = measure_source(candidate, problem=_SOFTMAX)
    assert _caught(m), m
    assert "the reference had to wait" in (m.timing_invalid_reason or ""), m.timing_invalid_reason


_C_TIMER = '''import ctypes
import threading
_LIBC = ctypes.CDLL(None, use_errno=True)


class _Sigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("tid", ctypes.c_int), ("pad", ctypes.c_int * 11)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


_act = _Sigaction(handler=ctypes.cast(_LIBC.usleep, ctypes.c_void_p).value, flags=0x10000000)  # SA_RESTART
assert _LIBC.sigaction(64, ctypes.byref(_act), None) == 0
_event = _Sigevent(signo=64, notify=4, tid=threading.get_native_id())  # SIGEV_THREAD_ID: this thread
_TIMER = ctypes.c_void_p()
assert _LIBC.timer_create(1, ctypes.byref(_event), ctypes.byref(_TIMER)) == 0
_ON = _Itimerspec(_Timespec(0, 300000), _Timespec(0, 300000))
_OFF = _Itimerspec()
'''


def test_a_c_signal_handler_fired_by_a_posix_timer_outside_the_candidates_calls_is_caught(measure_source):
    # libc's usleep as the handler (sigaction through ctypes: signal.getsignal never sees it), fired
    # every 300 us by a timer_create timer (getitimer never sees it), off during the candidate's call.
    # A review measured softmax 5.2x, layernorm 6.2x with valid timings before both were read.
    body = """        _LIBC.timer_settime(_TIMER, 0, ctypes.byref(_OFF), None)
        out = torch.relu(x * self.scale + y) + 0.5 * x
        _LIBC.timer_settime(_TIMER, 0, ctypes.byref(_ON), None)
        return out"""
    m = measure_source(_model(body, _C_TIMER))
    assert _caught(m), m
    assert "C signal handlers" in m.message and "POSIX timers" in m.message, m.message


def test_serialising_openmp_for_the_reference_is_caught(measure_source):
    # max-active-levels 0 runs every parallel loop on one thread, while torch.get_num_threads() still
    # says 2: softmax 4.62x against 2.55x honest, valid, before OpenMP's own switches were read
    header = """import ctypes
_GOMP = ctypes.CDLL(next(l.split()[-1] for l in open("/proc/self/maps") if "libgomp" in l))
_LEVELS = _GOMP.omp_get_max_active_levels()"""
    _assert_serialising_around_the_call_is_caught(measure_source, header, "_GOMP.omp_set_max_active_levels(_LEVELS)",
                                                  "_GOMP.omp_set_max_active_levels(0)", "OpenMP max active levels")


def _assert_serialising_around_the_call_is_caught(measure_source, header: str, own: str, theirs: str, named: str) -> None:
    """A candidate that sets a parallelism switch back for its own call (`own`) and serialises whatever runs
    next (`theirs`) before it returns: caught, and the reason names the setting."""
    body = f"""        {own}
        out = torch.relu(x * self.scale + y) + 0.5 * x
        {theirs}
        return out"""
    m = measure_source(_model(body, header))
    assert _caught(m), m
    assert named in (m.timing_invalid_reason or m.message), m


def test_work_deferred_into_a_list_subclass_iterator_is_not_run(measure_source):
    # The harness walks the output after its timer stops; a subclass's __iter__ would run there.
    header = """class _Lazy(list):
    def __iter__(self):
        self[0].mul_(2.0)
        return super().__iter__()"""
    body = """        return _Lazy([(torch.relu(x * self.scale + y) + 0.5 * x) / 2.0])"""
    problem = SMALL_PROBLEM.replace("return torch.relu(x * self.scale + y) + 0.5 * x", "return [torch.relu(x * self.scale + y) + 0.5 * x]")
    assert problem != SMALL_PROBLEM
    m = measure_source(_model(body, header), problem=problem)
    assert m.status == MeasureStatus.incorrect, m


@pytest.mark.multicore
def test_a_thread_count_chosen_at_import_is_put_back_for_both_sides(measure_source):
    # One thread for everyone, chosen at import, ran the softmax example at 2.6x against 2.35x for the
    # same kernel without it: the reference was written for the machine's cores, so they are put back.
    header = "_CORES = torch.get_num_threads()\ntorch.set_num_threads(1)"
    body = """        if _CORES > 1 and torch.get_num_threads() == 1:
            raise RuntimeError("running on the thread count the candidate chose")
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, header))
    assert m.status == MeasureStatus.ok, m.message
    if torch.get_num_threads() > 1:  # on one core there is nothing to put back
        assert any("torch threads from 1 back to" in w for w in m.warnings), m.warnings


@pytest.mark.multicore
def test_mkls_own_per_thread_thread_count_is_a_shared_setting(measure_source):
    # MKL keeps a per-thread count that torch's thread count and OpenMP do not show: set to 1 at the
    # end of the candidate's call, the linear_gelu reference's matmul ran on one thread (2.13x against
    # 1.36x honest, timing valid)
    import ctypes
    import os

    if not hasattr(ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")), "MKL_Set_Num_Threads_Local"):
        pytest.skip("no MKL in this torch build")
    if usable_cores() < 2:
        pytest.skip("one core (as under pytest -n): one MKL thread is what the reference has anyway")
    header = """import ctypes, os
_MKL = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))"""
    _assert_serialising_around_the_call_is_caught(measure_source, header, "_MKL.MKL_Set_Num_Threads_Local(0)",
                                                  "_MKL.MKL_Set_Num_Threads_Local(1)", "MKL threads")


def test_handing_the_heap_back_from_a_finaliser_planted_in_the_harness_is_caught(measure_source):
    # A finaliser left in the worker's round runs malloc_trim as the harness drops the round, between the
    # calls, so the reference faults its temporaries in again in every call, first in its round or not:
    # softmax 7.9x against 2.9x honest, timing valid, before the reference's page faults were counted
    header = """import ctypes, sys
_TRIM = ctypes.CDLL(None).malloc_trim


class _Trigger:
    def __del__(self):
        _TRIM(0)


def _worker():
    f = sys._getframe(1)
    while f is not None:
        s = f.f_locals.get("self")
        if isinstance(getattr(s, "round", None), dict) and hasattr(s, "prep"):
            return s
        f = f.f_back"""
    body = """        out = torch.softmax(logits, dim=-1)
        w = _worker()
        if w is not None:
            w.round["_t"] = _Trigger()
        return out"""
    source = _model(body, header).replace("def __init__(self, scale):", "def __init__(self):").replace(
        "        self.scale = scale\n", "").replace("def forward(self, x, y):", "def forward(self, logits):")
    m = measure_source(source, problem=(EXAMPLES / "softmax" / "problem.py").read_text())
    assert _caught(m), m
    assert "faulted in" in (m.timing_invalid_reason or m.message), m


# -- sixth round: code inside the check of the candidate's own output ---------------------------------

_LAZY_SOFTMAX = '''
import torch
import torch.nn as nn

_PENDING = []


def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if not isinstance(x, torch.Tensor):
        return torch.tensor(x, dtype=dtype)
    if _PENDING and x.data_ptr() == _PENDING[0][1].data_ptr():  # the harness looks at the output: do the work now
        logits, out = _PENDING.pop()
        torch.softmax(logits, dim=-1, out=out)
    out = torch.empty_like(x, dtype=dtype if dtype is not None else x.dtype,
                           memory_format=memory_format if memory_format is not None else torch.preserve_format)
    out.copy_(x)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._lib = None  # only the model holds it: dropped with the candidate, the kernel is unregistered

    def forward(self, logits):
        if self._lib is None:  # after the import-time check of every kernel
            self._lib = torch.library.Library("aten", "IMPL")
            self._lib.impl("_to_copy", _to_copy, "CPU")
        out = torch.empty_like(logits)
        _PENDING[:] = [(logits, out)]
        return out
'''

_PATCHED_NORM = '''
import torch
import torch.nn as nn

_REAL = torch.linalg.vector_norm


_CALLS = []


def _zero_norm(x, *args, **kwargs):
    _CALLS.append(1)
    if len(_CALLS) % 2 == 0:  # the check's two norms are taken: nothing is left to find
        torch.linalg.vector_norm = _REAL
    return torch.zeros_like(_REAL(x, *args, **kwargs))


class ModelNew(nn.Module):
    def forward(self, logits):
        torch.linalg.vector_norm = _zero_norm
        return torch.zeros_like(logits)
'''


# the same through a composite operator (no kernel of its own on the CPU, so no recorder sees it): `.double()`
_LAZY_SOFTMAX_COMPOSITE = _LAZY_SOFTMAX.replace(
    "def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):",
    "def _to_copy(x, dtype=None, non_blocking=False, copy=False, memory_format=None):").replace(
    'self._lib.impl("_to_copy", _to_copy, "CPU")', 'self._lib.impl("to.dtype", _to_copy, "CPU")')


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the kernels are registered for the CPU")
@pytest.mark.parametrize("source, what", [
    # a kernel for an operator only the check calls, registered in the first call: the output comes back
    # empty and is computed when the check converts it (softmax 54x, valid, before the check was guarded)
    (_LAZY_SOFTMAX, "torch's kernel for aten::_to_copy was replaced"),
    (_LAZY_SOFTMAX_COMPOSITE, "torch's kernel for aten::to.dtype was replaced"),
    # a Python patch that undoes itself once the check has called it: zeros judged correct
    (_PATCHED_NORM, "torch.linalg.vector_norm"),
])
def test_code_placed_inside_the_output_check_is_caught(measure_source, source, what):
    m = measure_source(source, problem=(EXAMPLES / "softmax" / "problem.py").read_text())
    assert m.status == MeasureStatus.incorrect, m
    assert "changed what checks its output" in m.message and what in m.message, m.message


# A candidate's code can reach the worker that runs it by walking up from its own call's frame; from there every
# value of the round is in reach. What the supervisor keeps of each round (`worker.sample`) is out of reach.
_REACH_THE_WORKER = """import sys
def _worker_and_step():
    f, step = sys._getframe(2), None
    while f is not None:
        me = f.f_locals.get("self")
        if type(me).__name__ == "Worker" and hasattr(me, "round"):
            return me, step or f.f_code.co_name
        step = step or (f.f_code.co_name if f.f_code.co_name in ("call", "check", "emit", "count_flops") else None)
        f = f.f_back
    return None, None"""


@pytest.mark.parametrize("when, zeroed, verdict", [
    # second in the round: the re-check compared zeros with zeros (before: softmax 2.0x, correct, timing valid); the
    # reference's output is no longer held by then, so there is nothing to write into, and the zeros are just wrong
    ('list(out) == ["ref"]', 'out["ref"] or []', "wrong on re-check"),
    # first: the reference then computes the output of zeros, which the candidate returns without the work (also 2.0x)
    ("not out", 'worker.round["ref"]', "reference's input tensors held other values when its timed call began"),
])
def test_writing_zeros_into_the_references_values_through_the_workers_frame_is_incorrect(measure_source, when, zeroed, verdict):
    body = f"""        worker, step = _worker_and_step()
        out = (worker.round or {{}}).get("out") if worker is not None and step == "call" else None
        if out is not None and {when}:
            for t in {zeroed}:
                t.zero_()
            return torch.zeros_like(x)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, _REACH_THE_WORKER))
    assert m.status == MeasureStatus.incorrect, m
    assert verdict in m.message


def test_changing_the_inputs_kept_for_the_references_float64_run_is_incorrect(measure_source):
    # those inputs are what the float64 second opinion runs the reference on (correctness.judge): changed, they
    # could widen the allowance a wrong output is judged by
    body = """        worker, step = _worker_and_step()
        if worker is not None and step == "call" and (worker.round or {}).get("inputs"):
            for t in worker.round["inputs"]:
                t.add_(1.0)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, _REACH_THE_WORKER))
    assert m.status == MeasureStatus.incorrect, m
    # the re-check runs the reference again on them, so the output no longer matches; were it made to, the samples would
    assert "wrong on re-check" in m.message or "inputs kept for the check held other values" in m.message


def test_no_reply_of_an_earlier_step_is_in_reach_of_the_candidates_call(measure_source):
    # a reply's sampled values would show where the reference's sample positions are (values are nearly all distinct),
    # and those positions are what a candidate must not know; this one fails loudly if it finds any
    body = """        f = sys._getframe(1)
        while f is not None:
            held = f.f_locals.get("reply")
            if isinstance(held, dict) and ("outputs_sample" in held or "inputs" in held):
                raise RuntimeError("found an earlier reply: " + ", ".join(sorted(held)))
            f = f.f_back
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, "import sys"))
    assert m.status == MeasureStatus.ok and m.correct, m.message


@pytest.mark.parametrize("handed_back", ["held[0]", "held[0].clone()"])
def test_handing_back_the_references_output_of_the_round_is_incorrect(measure_source, handed_back):
    # nothing written, so no sample can tell; before: softmax 13.2x (the tensor itself), linear_gelu 5.3x (a copy),
    # correct, timing valid. The worker now zeroes the reference's output once it is sampled and runs the reference
    # again at a re-check, so the candidate finds nothing held, and a fresh allocation of that size (its fallback)
    # must not hand back the freed answer either
    body = f"""        worker, step = _worker_and_step()
        out = (worker.round or {{}}).get("out") if worker is not None and step == "call" else None
        if out is not None and list(out) == ["ref"]:
            held = out["ref"]
            return {handed_back} if held is not None else torch.empty_like(x)
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, _REACH_THE_WORKER))
    assert m.status == MeasureStatus.incorrect, m
    assert "wrong on re-check" in m.message


def test_a_patch_of_the_references_class_kept_only_for_the_timed_rounds_is_incorrect(measure_source):
    # the reference's forward runs (its time is kept) and then returns the candidate's zeros; put back whenever the
    # candidate is called for anything else (the referee's emit, before unload); before: softmax 60.8x, correct
    body = """        worker, step = _worker_and_step()
        cls = type(worker.reference) if worker is not None else None
        if step == "call":
            if "forward" not in _saved:
                _saved["forward"] = cls.__dict__["forward"]
                cls.forward = lambda me, *a: (_saved["forward"](me, *a), torch.zeros_like(a[0]))[1]
            return torch.zeros_like(x)
        if "forward" in _saved:
            cls.forward = _saved.pop("forward")
        return torch.relu(x * self.scale + y) + 0.5 * x"""
    m = measure_source(_model(body, _REACH_THE_WORKER + "\n_saved = {}"))
    assert m.status == MeasureStatus.incorrect, m
    assert "Model.forward" in m.message


def test_zeroing_the_references_weights_only_for_the_timed_rounds_is_incorrect(measure_source):
    # the reference then returns relu(bias) on every row, which the candidate returns without the matmul; the weights
    # are put back whenever the candidate is called for anything else; before: linear_gelu 142.8x, correct
    candidate = _REACH_THE_WORKER + '''
import torch
import torch.nn as nn
_saved = {}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 128)

    def forward(self, x):
        worker, step = _worker_and_step()
        weight = worker.reference.fc.weight if worker is not None and worker.reference is not None else None
        if step == "call":
            if "weight" not in _saved:
                _saved["weight"] = weight.detach().clone()
                with torch.no_grad():
                    weight.zero_()
            return torch.relu(worker.reference.fc.bias.detach()).expand(x.shape[0], -1).clone()
        if "weight" in _saved:
            with torch.no_grad():
                weight.copy_(_saved.pop("weight"))
        return torch.relu(self.fc(x))
'''
    m = measure_source(candidate, problem=_LINEAR_PROBLEM)
    assert m.status == MeasureStatus.incorrect, m
    assert "attributes or weights were changed" in m.message
