"""The speed-of-light tool: the least time any kernel could take for a problem on a device.

``time_ms = max(flops / peak_flops, min_bytes / peak_bandwidth)``. FLOPs come from PyTorch's flop
counter run over the reference ``Model.forward``; ``min_bytes`` is the compulsory traffic (every input
and parameter read once, every output written once). Peaks come from the datasheet table in
tools/device_specs.py, or on a CPU are measured once and cached. The search uses the bound to judge
headroom, and a measured time below it as a sign the benchmark was gamed or the bound is wrong.

Counting FLOPs runs the problem's own code (``get_inputs``, ``Model``). Problem files are the user's,
not candidates, but a problem can still hang or crash, so `sol_bounds` does the counting in a child
process (``python -m kernelscout.tools.sol PROBLEM --cost-only``) with a timeout, a scrubbed environment
and the sandbox's memory limit. Where possible nothing real is computed: inputs and weights are built on
the meta device; only a forward the meta device cannot run (``.item()``, data-dependent shapes) is
rerun on real tensors of the actual shapes (CPU, then CUDA where there is one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

from kernelscout.sandbox.correctness import CheckFailed, flatten_outputs
from kernelscout.sandbox.problem import InputFileError, load_problem
from kernelscout.tools.atomic import write_text_atomic
from kernelscout.tools.device_specs import GIGA, TERA, DeviceSpec, UnknownDeviceError, lookup_device

_DTYPE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
_CPU_CACHE_FILE = "cpu_peaks.json"
DEFAULT_TIMEOUT_S = 180.0  # the child imports torch first, which alone can take 10 s on a busy machine


# -- boundary models ---------------------------------------------------------------------------------------


class SolRequest(BaseModel):
    problem: str = Field(description="path of a KernelBench problem file (class Model, get_inputs, get_init_inputs), or of a folder holding problem.py")
    device: str = Field(
        "auto",
        description="auto, cpu, cuda, cuda:N, or a GPU name as torch.cuda.get_device_name gives it or as the "
        "recorded spaces name it (H100, A100, A4000, MI250X, RTX_3090)",
    )
    tf32: bool = Field(False, description="TF32 allowed for fp32 matmuls; the harness pins it off, so normally False")
    isolate: bool = Field(True, description="count FLOPs in a child process, so a problem that hangs or crashes cannot take the caller down")
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="seconds the child process may take")


class ProblemCost(BaseModel):
    """What the problem asks for, independent of any device."""

    flops: int = Field(description="FLOPs of one reference forward, as torch.utils.flop_counter counts them")
    flops_by_dtype: dict[str, int] = Field(default_factory=dict, description="the same FLOPs split by the dtype of the operands")
    input_bytes: int
    output_bytes: int
    param_bytes: int = Field(description="parameters and buffers of the Model")
    min_bytes: int = Field(description="input + output + param bytes: the traffic no kernel can avoid")
    dtype: str = Field(description="the dtype that carries most FLOPs (or, without FLOPs, most bytes)")
    counted_on: Literal["meta", "cpu", "cuda"] = Field(description="meta: nothing computed; cpu or cuda: the forward ran on real tensors there")
    notes: list[str] = Field(default_factory=list)


class DevicePeaks(BaseModel):
    """Peak rates of one device, in FLOP/s and bytes/s, per precision."""

    device: str
    key: str
    kind: Literal["gpu", "cpu"]
    flops_per_s: dict[str, float] = Field(description="precision (fp32, tf32, fp16, bf16, fp64) -> peak FLOP/s")
    bandwidth: float = Field(description="peak memory bandwidth, bytes/s")
    cache_bytes: int = Field(description="last-level cache; a working set this small can beat the bandwidth")
    source: str

    def rate(self, dtype: str, tf32: bool) -> tuple[float, str, Optional[str]]:
        """Peak FLOP/s for operands of `dtype`, the precision it was taken as, and a note when it fell back.

        On a GPU every fallback picks a rate at least as high as the true one, so the bound stays a lower bound.
        """
        precision = _DTYPE_PRECISION.get(dtype)
        if precision == "fp32" and tf32:
            precision = "tf32"
        if precision is None:
            best = max(self.flops_per_s, key=lambda p: self.flops_per_s[p])
            return self.flops_per_s[best], best, f"no peak for {dtype} on {self.key}; used its highest rate ({best})"
        if precision in self.flops_per_s:
            return self.flops_per_s[precision], precision, None
        fp32 = self.flops_per_s["fp32"]
        if precision == "fp64":
            return fp32, "fp32", f"no fp64 peak listed for {self.key}; used fp32, which fp64 never beats"
        if self.kind == "cpu":
            return fp32, "fp32", f"the CPU peak is a measured fp32 rate; {dtype} may run faster (AMX, AVX512-FP16)"
        return fp32, "fp32", f"{self.key} has no {precision} tensor cores listed; used its fp32 rate"


class SolBounds(BaseModel):
    """The speed-of-light bound of one problem on one device."""

    problem: str
    device: str
    device_key: str
    precision: str = Field(description="precision of the dominant FLOPs, as the peak was taken")
    flops: int
    flops_by_dtype: dict[str, int] = Field(default_factory=dict)
    min_bytes: int
    input_bytes: int
    output_bytes: int
    param_bytes: int
    arithmetic_intensity: Optional[float] = Field(None, description="flops / min_bytes; None without bytes")
    peak_flops: float = Field(description="FLOP/s of the dominant precision")
    peak_bandwidth: float = Field(description="bytes/s")
    ridge_intensity: float = Field(description="peak_flops / peak_bandwidth: above it a problem is compute-bound")
    compute_ms: float
    memory_ms: float
    time_ms: float = Field(description="max(compute_ms, memory_ms): no kernel can be faster")
    bound: Literal["compute", "memory"]
    cache_resident: bool = Field(description="min_bytes fits in the last-level cache, so unflushed timings can beat memory_ms")
    floor_ms: float = Field(description="the time below which a measurement is impossible (time_ms, or compute_ms when cache-resident and unflushed)")
    counted_on: Literal["meta", "cpu", "cuda"]
    peaks_source: str
    notes: list[str] = Field(default_factory=list)


# -- the arithmetic ---------------------------------------------------------------------------------------


def bounds_for(cost: ProblemCost, peaks: DevicePeaks, tf32: bool = False, problem: str = "") -> SolBounds:
    """Combine a problem's cost with a device's peaks. Pure arithmetic; nothing runs."""
    notes = list(cost.notes)
    by_dtype = dict(cost.flops_by_dtype) or ({cost.dtype: cost.flops} if cost.flops else {})
    compute_s = 0.0
    for dtype, flops in by_dtype.items():
        rate, _, note = peaks.rate(dtype, tf32)
        compute_s += flops / rate
        if note and note not in notes:
            notes.append(note)
    peak_flops, precision, _ = peaks.rate(cost.dtype, tf32)
    memory_s = cost.min_bytes / peaks.bandwidth
    bound: Literal["compute", "memory"] = "compute" if compute_s > memory_s else "memory"
    time_s = max(compute_s, memory_s)
    cache_resident = cost.min_bytes <= peaks.cache_bytes
    # The harness flushes the L2 before every timed GPU call; CPU timings run with warm caches.
    floor_s = compute_s if cache_resident and peaks.kind == "cpu" else time_s
    if cache_resident and bound == "memory":
        notes.append(
            f"the working set ({_mib(cost.min_bytes)}) fits in the {_mib(peaks.cache_bytes)} last-level cache: "
            "timings without a cache flush between calls can beat the memory side"
        )
    return SolBounds(
        problem=problem,
        device=peaks.device,
        device_key=peaks.key,
        precision=precision,
        flops=cost.flops,
        flops_by_dtype=cost.flops_by_dtype,
        min_bytes=cost.min_bytes,
        input_bytes=cost.input_bytes,
        output_bytes=cost.output_bytes,
        param_bytes=cost.param_bytes,
        arithmetic_intensity=cost.flops / cost.min_bytes if cost.min_bytes else None,
        peak_flops=peak_flops,
        peak_bandwidth=peaks.bandwidth,
        ridge_intensity=peak_flops / peaks.bandwidth,
        compute_ms=compute_s * 1e3,
        memory_ms=memory_s * 1e3,
        time_ms=time_s * 1e3,
        bound=bound,
        cache_resident=cache_resident,
        floor_ms=floor_s * 1e3,
        counted_on=cost.counted_on,
        peaks_source=peaks.source,
        notes=notes,
    )


def with_flops(bounds: SolBounds, flops: int) -> SolBounds:
    """The same bound for a kernel that does `flops` FLOPs instead of the problem's (a candidate's own count, when
    it found a way to do less work), at the reference's mix of precisions. The memory side stays: the inputs must
    still be read and the outputs written."""
    compute_ms = bounds.compute_ms * flops / bounds.flops if bounds.flops else 0.0
    time_ms = max(compute_ms, bounds.memory_ms)
    floor_ms = compute_ms if bounds.cache_resident and bounds.device_key == "cpu" else time_ms  # as bounds_for decides
    return bounds.model_copy(update={
        "flops": int(flops), "flops_by_dtype": {}, "compute_ms": compute_ms, "time_ms": time_ms, "floor_ms": floor_ms,
        "bound": "compute" if compute_ms > bounds.memory_ms else "memory",
        "arithmetic_intensity": flops / bounds.min_bytes if bounds.min_bytes else None})


def headroom(measured_ms: float, bounds: SolBounds) -> float:
    """How many times slower than light a measured time is: 1.0 is perfect, 4.0 leaves 4x to gain.

    Below 1.0 only when the measurement or the bound is wrong; see `suspicious`.
    """
    if bounds.time_ms <= 0:
        return math.inf
    return measured_ms / bounds.time_ms


def suspicious(
    measured_ms: float, bounds: SolBounds, margin: float = 0.1, cache_flushed: Optional[bool] = None
) -> Optional[str]:
    """A reason the measured time cannot be honest, or None when it can.

    A time more than `margin` below the floor means work was skipped (a cached or partial result, a
    timer fooled) or the bound is wrong; the caller re-verifies before believing it. The margin absorbs
    clocks above the rated boost and timer noise. `cache_flushed` says whether the timing flushed caches
    between calls (the harness does on a GPU, replayed Kernel Tuner spaces do not); when it did not and the
    working set fits in cache, only the compute side is a floor.
    """
    if not math.isfinite(measured_ms) or measured_ms <= 0:
        return f"measured time {measured_ms!r} ms is not a positive number"
    floor_ms = bounds.floor_ms
    if cache_flushed is not None:
        floor_ms = bounds.compute_ms if (bounds.cache_resident and not cache_flushed) else bounds.time_ms
    if floor_ms <= 0 or measured_ms >= floor_ms * (1 - margin):
        return None
    if bounds.bound == "compute" or floor_ms < bounds.time_ms:
        side = f"compute: {format_si(bounds.flops, 'FLOP')} at {format_si(bounds.peak_flops, 'FLOP/s')}"
    else:
        side = f"memory: {format_si(bounds.min_bytes, 'B')} at {format_si(bounds.peak_bandwidth, 'B/s')}"
    return (
        f"measured {measured_ms:.4g} ms is {1 - measured_ms / floor_ms:.0%} below the speed-of-light floor "
        f"{floor_ms:.4g} ms on {bounds.device_key} ({side}): the timed call skipped work "
        "(cached, partial or deferred result) or the bound is wrong"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB"


def format_si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


# -- device peaks ---------------------------------------------------------------------------------------


def spec_peaks(spec: DeviceSpec) -> DevicePeaks:
    rates = {p: spec.tflops(p) for p in ("fp32", "tf32", "fp16", "bf16", "fp64")}
    return DevicePeaks(
        device=spec.name,
        key=spec.key,
        kind="gpu",
        flops_per_s={p: r * TERA for p, r in rates.items() if r is not None},
        bandwidth=spec.bandwidth_gbs * GIGA,
        cache_bytes=int(spec.last_level_cache_mb * 2**20),
        source=spec.source,
    )


def device_peaks(device: str) -> DevicePeaks:
    """Peaks for a device named the way SolRequest.device allows; an unknown GPU raises UnknownDeviceError."""
    if device == "auto" or device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            return spec_peaks(lookup_device(torch.cuda.get_device_name(index)))
        if device != "auto":
            raise UnknownDeviceError(f"{device}: no CUDA device is visible here; name the GPU as the device (e.g. H100) or use cpu")
        device = "cpu"
    if device == "cpu":
        return cpu_peaks()
    return spec_peaks(lookup_device(device))


def cache_dir() -> Path:
    """Read at call time, not import time, so KSCOUT_CACHE_DIR set later (tests, the CLI) is honoured."""
    return Path(os.environ.get("KSCOUT_CACHE_DIR") or Path.home() / ".cache" / "kernelscout")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _cpu_cache_bytes() -> int:
    """Largest cache level that sysfs reports (usually the L3); 32 MiB when it says nothing."""
    best = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return best or 32 << 20


def _sandbox_threads() -> int:
    from kernelscout.sandbox.pool import default_threads

    return default_threads()


def _cpu_key(threads: int) -> str:
    import torch

    return f"{_cpu_model()}|threads={threads}|torch={torch.__version__}"


def measure_cpu_peaks(threads: int, matmul_n: int = 2048, copy_bytes: int = 256 << 20, budget_s: float = 4.0) -> DevicePeaks:
    """Best-of-several fp32 matmul and large copy, with the thread count the sandbox workers use.

    A measured best is below the true peak, so on a CPU the bound is an estimate, not a guarantee.
    """
    import torch

    def best_of(fn: Any, seconds: float) -> float:
        fn()  # warm-up: first-touch pages, thread pool start
        deadline = time.perf_counter() + seconds
        times: list[float] = []
        while len(times) < 2 or (len(times) < 8 and time.perf_counter() < deadline):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def matmul() -> Any:
        a, b, c = torch.randn(matmul_n, matmul_n), torch.randn(matmul_n, matmul_n), torch.empty(matmul_n, matmul_n)
        return lambda: torch.mm(a, b, out=c)

    def copy() -> Any:
        src = torch.ones(copy_bytes // 4)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mm_s = best_of(matmul(), budget_s / 2)
        copy_s = best_of(copy(), budget_s / 2)
    finally:
        torch.set_num_threads(previous)
    model = _cpu_model()
    return DevicePeaks(
        device=f"{model} ({threads} threads)",
        key="cpu",
        kind="cpu",
        flops_per_s={"fp32": 2 * matmul_n**3 / mm_s},
        bandwidth=2 * copy_bytes / copy_s,
        cache_bytes=_cpu_cache_bytes(),
        source=f"measured: best torch.mm {matmul_n}^2 fp32 and {copy_bytes >> 20} MiB copy_ (read + write), torch {torch.__version__}",
    )


def _cached_peaks() -> tuple[Path, dict[str, Any]]:
    """The CPU peaks cache file and what it holds (empty when it is missing or unreadable)."""
    path = cache_dir() / _CPU_CACHE_FILE
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return path, {}
    return path, cached if isinstance(cached, dict) else {}


def cpu_peaks(threads: Optional[int] = None, refresh: bool = False) -> DevicePeaks:
    """This CPU's peaks, measured on first use and then read from the cache.

    Keyed by CPU model, thread count and torch version: any of them changes the rates.
    """
    threads = threads or _sandbox_threads()
    key = _cpu_key(threads)
    path, cached = _cached_peaks()
    if key in cached and not refresh:
        try:
            return DevicePeaks.model_validate(cached[key])
        except ValueError:
            pass
    peaks = measure_cpu_peaks(threads)
    cached[key] = peaks.model_dump()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(cached, indent=1))
    return peaks


def forget_cpu_peaks(threads: Optional[int] = None) -> bool:
    """Drop this CPU's cached peaks, so the next bound measures them again. For a cached rate that a trusted
    reference has been seen to beat: peaks measured while the machine was busy are low (100 GFLOP/s cached
    on a 2-core VM that does 205 idle), and every later bound, `kscout sol`'s included, would repeat them."""
    path, cached = _cached_peaks()
    key = _cpu_key(threads or _sandbox_threads())
    if key not in cached:
        return False
    del cached[key]
    write_text_atomic(path, json.dumps(cached, indent=1))
    return True


# -- the problem's cost (runs problem code) --------------------------------------------------------------


def _unique(tensors: list[Any]) -> list[Any]:
    """The same tensor passed twice is still read once."""
    return list({id(t): t for t in tensors}.values())


def _nbytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 600 else text[:600] + " ..."


def _count(module: Any, device: Literal["meta", "cpu", "cuda"]) -> ProblemCost:
    import torch

    from kernelscout.sandbox.flop_count import DtypeFlopCounter, tensors_of

    with torch.device(device):
        init_inputs = module.get_init_inputs()
        torch.manual_seed(0)
        model = module.Model(*init_inputs)
        inputs = module.get_inputs()
        counter = DtypeFlopCounter()  # products only: the reference's count, as the bound has always used
        with torch.no_grad(), counter:
            out = model(*inputs)
    flatten_outputs(out, "reference", materialised=False)  # outputs the harness refuses: no bounds either
    in_tensors = _unique(tensors_of(list(inputs)))
    in_ids = {id(t) for t in in_tensors}
    # An output that is an input (or a view of one) needs no write of its own.
    out_tensors = [t for t in _unique(tensors_of(out)) if id(t) not in in_ids and id(t._base) not in in_ids]
    params = list(model.parameters()) + list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    flops = int(counter.get_total_flops())
    by_dtype = {k: int(v) for k, v in counter.by_dtype.items()}
    if by_dtype:
        dtype = max(by_dtype, key=lambda d: by_dtype[d])
    else:
        floating = [t for t in in_tensors + params + out_tensors if t.is_floating_point()]
        dtype = str(max(floating, key=lambda t: t.numel() * t.element_size()).dtype).removeprefix("torch.") if floating else "float32"
    sizes = _nbytes(in_tensors), _nbytes(out_tensors), _nbytes(params)
    return ProblemCost(
        flops=flops,
        flops_by_dtype=by_dtype,
        input_bytes=sizes[0],
        output_bytes=sizes[1],
        param_bytes=sizes[2],
        min_bytes=sum(sizes),
        dtype=dtype,
        counted_on=device,
    )


def analyse_problem(path: str | Path) -> ProblemCost:
    """Count FLOPs and bytes of a problem in this process (it imports and runs the problem's code).

    Meta first, so a 16 GiB problem costs nothing; real tensors of the same shapes (CPU, then CUDA
    where there is one) only when the meta device cannot run the forward.
    """
    import importlib.util

    problem = load_problem(path)
    spec = importlib.util.spec_from_file_location(f"kscout_sol_{problem.sha[:16]}", problem.path)
    assert spec is not None and spec.loader is not None  # a .py path always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as the sandbox worker does: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(spec.name, None)
        raise InputFileError(problem.path, f"importing the problem failed: {_short(exc)}") from None
    import torch

    # A problem whose get_inputs() calls .cuda() can only run where CUDA is.
    fallbacks: list[Literal["cpu", "cuda"]] = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    refused = "the harness cannot check this problem's outputs, so it would measure nothing: "
    try:
        return _count(module, "meta")
    except CheckFailed as exc:
        raise InputFileError(problem.path, refused + str(exc)) from None
    except Exception as exc:
        meta_error = _short(exc)
    errors = []
    for device in fallbacks:
        try:
            cost = _count(module, device)
        except CheckFailed as exc:
            raise InputFileError(problem.path, refused + str(exc)) from None
        except Exception as exc:
            errors.append(_short(exc))
            continue
        cost.notes.append(f"the meta device could not run the forward ({meta_error}); counted on real {device} tensors")
        return cost
    raise InputFileError(problem.path, f"the reference Model could not run to count its FLOPs: {errors[0]}") from None


def _cost_in_child(path: Path, timeout_s: float) -> ProblemCost:
    from kernelscout.sandbox.pool import clean_env, default_memory_bytes

    with tempfile.TemporaryDirectory(prefix="kscout-sol-") as work:
        result = Path(work) / "cost.json"
        env = clean_env("cpu", _sandbox_threads(), default_memory_bytes(), Path(work))
        cmd = [sys.executable, "-m", "kernelscout.tools.sol", str(path), "--cost-only", "--out", str(result)]
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, text=True, errors="replace",
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise InputFileError(
                path, f"counting its FLOPs did not finish within {timeout_s:g} s (the problem hangs, or is too slow to build); "
                "raise the timeout if it is just slow"
            ) from None
        if result.exists():
            data = json.loads(result.read_text())
            if "error" in data:
                raise InputFileError(path, data["error"])
            return ProblemCost.model_validate(data)
        tail = (log or "").strip()[-1500:]
        raise InputFileError(path, f"the process counting its FLOPs died (exit status {proc.returncode})" + (f":\n{tail}" if tail else ""))


def problem_cost(path: str | Path, isolate: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProblemCost:
    """FLOPs and compulsory bytes of a problem; `isolate` runs the problem's code in a child process."""
    problem = load_problem(path)  # a missing file or name fails here, before any process starts
    if isolate:
        return _cost_in_child(problem.path, timeout_s)
    return analyse_problem(problem.path)


def sol_bounds(request: SolRequest) -> SolBounds:
    """The speed-of-light bound of a problem on a device.

    Raises InputFileError for a problem that cannot be counted, UnknownDeviceError for a device the table
    lacks. The device is resolved first, so a bad name fails before any problem code runs.
    """
    peaks = device_peaks(request.device)
    cost = problem_cost(request.problem, isolate=request.isolate, timeout_s=request.timeout_s)
    return bounds_for(cost, peaks, tf32=request.tf32, problem=str(Path(request.problem).resolve()))


# -- python -m kernelscout.tools.sol ---------------------------------------------------------------------


def _limit_memory() -> None:
    """The sandbox's address-space limit, so a problem too big for memory fails instead of swapping the host."""
    import resource

    limit = int(os.environ.get("KSCOUT_WORKER_MEMORY_BYTES", "0"))
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelscout.tools.sol", description=__doc__.splitlines()[0])
    parser.add_argument("problem")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda[:N] or a GPU name (H100, A100, MI250X, ...)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 for fp32 matmuls")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cost-only", action="store_true", help="count FLOPs and bytes in this process; no device")
    parser.add_argument("--out", help="write the JSON result here instead of stdout (what the parent reads)")
    args = parser.parse_args(argv)

    def emit(payload: str) -> None:
        if args.out:
            Path(args.out).write_text(payload)
        else:
            print(payload)

    if args.cost_only:
        _limit_memory()
        try:
            emit(analyse_problem(args.problem).model_dump_json())
        except InputFileError as exc:
            message = str(exc)
            emit(json.dumps({"error": message[len(exc.path) + 2:] if message.startswith(exc.path + ": ") else message}))
            return 2
        return 0
    try:
        # This process exists only to answer, so the counting needs no second process.
        bounds = sol_bounds(SolRequest(problem=args.problem, device=args.device, tf32=args.tf32, isolate=False, timeout_s=DEFAULT_TIMEOUT_S))
    except (InputFileError, UnknownDeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    emit(bounds.model_dump_json(indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
