"""The speed-of-light bound: FLOPs and bytes of a problem, device peaks, and what a bound says about a time."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from kernelscout.agent.cli_sol import register, render_bounds
from kernelscout.sandbox.problem import InputFileError
from kernelscout.sandbox.replay import recorded_spaces_dir
from kernelscout.tools import sol
from kernelscout.tools.device_specs import UnknownDeviceError, find_device, lookup_device
from kernelscout.tools.sol import (
    DevicePeaks,
    ProblemCost,
    SolRequest,
    bounds_for,
    cpu_peaks,
    headroom,
    problem_cost,
    sol_bounds,
    spec_peaks,
    suspicious,
)

REPO = Path(__file__).resolve().parents[1]
H100_FP32 = 67e12
H100_BW = 3.35e12


def matmul(m: int, k: int, n: int, dtype: str = "torch.float32") -> str:
    return f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)

def get_inputs():
    return [torch.randn({m}, {k}, dtype={dtype}), torch.randn({k}, {n}, dtype={dtype})]

def get_init_inputs():
    return []
"""


ELEMENTWISE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x) + y

def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]

def get_init_inputs():
    return []
"""


def bounds_of(path: Path, device: str = "H100", **kw) -> sol.SolBounds:
    return sol_bounds(SolRequest(problem=str(path), device=device, isolate=False, **kw))


# -- what a problem costs ---------------------------------------------------------------------------------


def test_flops_of_a_matmul_are_2mnk(write):
    bounds = bounds_of(write("mm.py", matmul(1024, 512, 256)))
    assert bounds.flops == 2 * 1024 * 512 * 256
    assert bounds.counted_on == "meta"  # nothing was computed


def test_min_bytes_of_an_elementwise_problem_are_its_inputs_and_output(write):
    bounds = bounds_of(write("ew.py", ELEMENTWISE))
    tensor = 4096 * 4096 * 4
    assert (bounds.input_bytes, bounds.output_bytes, bounds.param_bytes) == (2 * tensor, tensor, 0)
    assert bounds.min_bytes == 3 * tensor
    assert bounds.flops == 0
    assert bounds.bound == "memory"
    assert bounds.time_ms == pytest.approx(3 * tensor / H100_BW * 1e3)


def test_a_big_fp32_matmul_is_compute_bound_at_the_non_tensor_core_rate(write):
    bounds = bounds_of(write("mm.py", matmul(4096, 4096, 4096)))
    assert bounds.bound == "compute"
    assert bounds.precision == "fp32" and bounds.peak_flops == H100_FP32
    assert bounds.time_ms == pytest.approx(2 * 4096**3 / H100_FP32 * 1e3)


def test_the_peak_follows_the_problem_dtype_and_the_tf32_setting(write):
    half = bounds_of(write("mm16.py", matmul(4096, 4096, 4096, "torch.float16")))
    assert (half.precision, half.peak_flops) == ("fp16", 1979e12 / 2)  # datasheet figure is with sparsity
    tf32 = bounds_of(write("mm.py", matmul(4096, 4096, 4096)), tf32=True)
    assert (tf32.precision, tf32.peak_flops) == ("tf32", 989e12 / 2)


def test_flops_of_each_dtype_are_priced_at_that_dtype_rate(write):
    path = write("mixed.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                return (a.half() @ b.half()).float() + a @ b

        def get_inputs():
            return [torch.randn(2048, 2048), torch.randn(2048, 2048)]

        def get_init_inputs():
            return []
        """)
    bounds = bounds_of(path)
    one = 2 * 2048**3
    assert bounds.flops_by_dtype == {"float16": one, "float32": one}
    assert bounds.compute_ms == pytest.approx((one / (1979e12 / 2) + one / H100_FP32) * 1e3)


def test_parameters_are_read_once():
    bounds = bounds_of(REPO / "tests" / "data" / "kernelbench_format" / "1_Linear_Tanh_Scale.py")
    assert bounds.param_bytes == (256 * 512 + 512) * 4
    assert bounds.flops == 2 * 128 * 256 * 512


def test_a_forward_the_meta_device_cannot_run_is_counted_on_real_cpu_tensors(write):
    path = write("item.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                scale = a.abs().max().item()  # data-dependent: no value on the meta device
                return (a @ b) * scale

        def get_inputs():
            return [torch.randn(64, 32), torch.randn(32, 16)]

        def get_init_inputs():
            return []
        """)
    bounds = bounds_of(path)
    assert bounds.counted_on == "cpu"
    assert bounds.flops == 2 * 64 * 32 * 16
    assert any("meta" in note for note in bounds.notes)


def test_a_problem_whose_model_raises_is_an_input_error(write):
    path = write("bad.py", matmul(8, 8, 8).replace("return torch.matmul(a, b)", "raise ValueError('shapes disagree')"))
    with pytest.raises(InputFileError, match="shapes disagree"):
        bounds_of(path)


@pytest.mark.parametrize("returned, said", [
    ("{'y': torch.matmul(a, b)}", "return value is a builtins.dict"),
    ("(torch.matmul(a, b), 2.0)", "output 1 is a builtins.float"),
])
def test_a_problem_whose_outputs_the_harness_refuses_gets_no_bounds(write, returned, said):
    """The bound is only of use for a problem that can be measured; the reason is the harness's own."""
    path = write("refused.py", matmul(8, 8, 8).replace("return torch.matmul(a, b)", f"return {returned}"))
    with pytest.raises(InputFileError, match=f"would measure nothing: reference.*{said}"):
        bounds_of(path)


def test_a_problem_that_hangs_cannot_hang_the_caller(write):
    path = write("hang.py", "import time\ntime.sleep(600)\n" + matmul(8, 8, 8))
    start = time.monotonic()
    with pytest.raises(InputFileError, match="did not finish"):
        problem_cost(path, isolate=True, timeout_s=3)
    assert time.monotonic() - start < 30


# -- devices ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, key",
    [
        # as torch.cuda.get_device_name reports them
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA RTX A4000", "RTX-A4000"),
        ("NVIDIA GeForce RTX 2080 Ti", "RTX-2080-Ti"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI250X", "MI250X-GCD"),
        # as the recorded spaces' file names spell them
        ("H100", "H100-SXM"),
        ("A100", "A100-40GB"),
        ("A4000", "RTX-A4000"),
        ("MI250X", "MI250X-GCD"),
        ("RTX_3090", "RTX-3090"),
        ("RTX_2080_Ti", "RTX-2080-Ti"),
        # the table's own keys
        ("MI250X-package", "MI250X-package"),
        ("h100-pcie", "H100-PCIe"),
    ],
)
def test_devices_are_found_by_every_name_form(name, key):
    assert lookup_device(name).key == key


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 3090 Ti", "NVIDIA L40", "NVIDIA GeForce RTX 2080", "Intel Arc A770", ""])
def test_a_variant_the_table_lacks_matches_nothing_rather_than_a_neighbour(name):
    assert find_device(name) is None
    with pytest.raises(UnknownDeviceError, match="known devices: H100-SXM"):
        lookup_device(name)


def test_an_unknown_device_fails_before_any_problem_code_runs(tmp_path):
    with pytest.raises(UnknownDeviceError):
        sol_bounds(SolRequest(problem=str(tmp_path / "not_even_there.py"), device="RTX 9090"))


def test_the_mi250x_of_the_recorded_spaces_is_one_gcd_of_the_package():
    gcd, package = lookup_device("MI250X"), lookup_device("MI250X-package")
    assert gcd.bandwidth_gbs * 2 == package.bandwidth_gbs
    assert gcd.fp32_tflops * 2 == package.fp32_tflops


def test_every_recorded_space_is_in_the_table():
    hub = recorded_spaces_dir()
    if not hub.is_dir():
        pytest.skip("no recorded spaces found (set KSCOUT_BENCHMARK_HUB)")
    for path in sorted(hub.glob("*.json.gz")):
        short = path.name.removesuffix(".json.gz").split("_", 1)[1]
        spec = lookup_device(short)
        with gzip.open(path, "rt") as fh:
            recorded = re.search(r'"device_name":\s*"([^"]*)"', fh.read(4096)).group(1)
        if recorded:  # the MI250X files leave it empty
            assert lookup_device(recorded) == spec, path.name


# -- what a bound says about a measured time -----------------------------------------------------------------


def cost(flops: int, nbytes: int) -> ProblemCost:
    return ProblemCost(
        flops=flops, input_bytes=nbytes, output_bytes=0, param_bytes=0, min_bytes=nbytes, dtype="float32", counted_on="meta"
    )


def test_headroom_is_how_many_times_slower_than_light():
    bounds = bounds_for(cost(2 * 4096**3, 3 * 4096**2 * 4), spec_peaks(lookup_device("H100")))
    assert headroom(2 * bounds.time_ms, bounds) == pytest.approx(2.0)
    assert headroom(bounds.time_ms, bounds) == pytest.approx(1.0)


def test_a_time_below_light_is_suspicious_and_one_above_is_not():
    bounds = bounds_for(cost(2 * 4096**3, 3 * 4096**2 * 4), spec_peaks(lookup_device("H100")))
    assert suspicious(1.5 * bounds.time_ms, bounds) is None
    assert suspicious(0.95 * bounds.time_ms, bounds, margin=0.1) is None  # within clock and timer slack
    reason = suspicious(0.5 * bounds.time_ms, bounds)
    assert reason and "50% below" in reason and "H100-SXM" in reason
    assert suspicious(0.0, bounds)


def test_a_cache_resident_problem_timed_without_a_flush_is_held_only_to_its_compute_side():
    bounds = bounds_for(cost(0, 1 << 20), spec_peaks(lookup_device("H100")))  # 1 MiB, far below the 50 MB L2
    assert bounds.bound == "memory" and bounds.cache_resident
    assert suspicious(0.5 * bounds.time_ms, bounds)  # the harness flushes L2 before each GPU call
    assert suspicious(0.5 * bounds.time_ms, bounds, cache_flushed=False) is None  # a replayed Kernel Tuner space does not


def test_on_a_cpu_warm_caches_make_only_compute_a_floor():
    peaks = DevicePeaks(
        device="test cpu", key="cpu", kind="cpu", flops_per_s={"fp32": 1e11}, bandwidth=1e10, cache_bytes=32 << 20, source="test"
    )
    bounds = bounds_for(cost(10**9, 1 << 20), peaks)
    assert bounds.floor_ms == bounds.compute_ms == pytest.approx(10.0)
    assert bounds_for(cost(10**9, 1 << 30), peaks).floor_ms == pytest.approx((1 << 30) / 1e10 * 1e3)


# -- the CPU's peaks ------------------------------------------------------------------------------------------


def test_cpu_peaks_are_measured_once_then_read_from_the_cache(tmp_path, monkeypatch, write):
    monkeypatch.setenv("KSCOUT_CACHE_DIR", str(tmp_path / "cache"))
    first = cpu_peaks(threads=1)
    assert first.flops_per_s["fp32"] > 1e8 and first.bandwidth > 1e8
    assert (tmp_path / "cache" / "cpu_peaks.json").exists()

    def no_measuring(*a, **kw):
        raise AssertionError("measured again")

    monkeypatch.setattr(sol, "measure_cpu_peaks", no_measuring)
    assert cpu_peaks(threads=1) == first
    with pytest.raises(AssertionError, match="measured again"):
        cpu_peaks(threads=2)  # another thread count is another machine as far as peaks go
    monkeypatch.setattr(sol, "_sandbox_threads", lambda: 1)
    assert bounds_of(write("mm.py", matmul(256, 256, 256)), device="cpu").peak_flops == first.flops_per_s["fp32"]


def test_a_cpu_peak_found_too_low_is_measured_again(tmp_path, monkeypatch, write):
    """Peaks cached from a busy machine would hold every later bound too low; a search whose reference beats its own
    floor forgets them, and `kscout sol --refresh-peaks` does so on request."""
    from typer.testing import CliRunner

    from kernelscout.agent.cli import app

    monkeypatch.setenv("KSCOUT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sol, "_sandbox_threads", lambda: 1)
    rates = iter([1e11, 2e11, 3e11])

    def measured(threads, **kw):
        return sol.DevicePeaks(device="test CPU", key="cpu", kind="cpu", flops_per_s={"fp32": next(rates)}, bandwidth=2e10,
                               cache_bytes=32 << 20, source="measured (test)")

    monkeypatch.setattr(sol, "measure_cpu_peaks", measured)
    assert cpu_peaks().flops_per_s["fp32"] == 1e11 == cpu_peaks().flops_per_s["fp32"]  # measured once, then cached
    assert sol.forget_cpu_peaks() and not sol.forget_cpu_peaks()
    assert cpu_peaks().flops_per_s["fp32"] == 2e11

    problem = write("mm.py", matmul(256, 256, 256))
    shown = CliRunner().invoke(app, ["sol", str(problem), "--device", "cpu", "--refresh-peaks", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["peak_flops"] == 3e11


# -- the command -----------------------------------------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def test_kscout_sol_prints_the_bound_of_a_problem_file_as_json(cli, write):
    path = write("mm.py", matmul(4096, 4096, 4096))
    result = CliRunner().invoke(cli, ["sol", str(path), "--device", "NVIDIA H100 80GB HBM3", "--json"])
    assert result.exit_code == 0, result.output
    bounds = json.loads(result.stdout)
    assert bounds["flops"] == 2 * 4096**3
    assert bounds["bound"] == "compute" and bounds["device_key"] == "H100-SXM"


def test_kscout_sol_says_where_its_peaks_come_from(cli, write):
    """A datasheet's peak and a micro-benchmark's read alike otherwise."""
    result = CliRunner().invoke(cli, ["sol", str(write("mm.py", matmul(64, 64, 64))), "--device", "NVIDIA H100 80GB HBM3"])
    assert result.exit_code == 0, result.output
    peaks = next(line for line in result.output.splitlines() if line.startswith("peaks"))
    assert "(NVIDIA H100 Tensor Core GPU datasheet" in peaks


def test_kscout_sol_takes_a_problem_folder_as_optimize_does(cli, write, tmp_path):
    (tmp_path / "mm").mkdir()
    path = write("mm/problem.py", matmul(64, 64, 64))
    result = CliRunner().invoke(cli, ["sol", str(path.parent), "--device", "NVIDIA H100 80GB HBM3", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["flops"] == 2 * 64**3


def test_kscout_sol_rejects_an_unknown_device_with_the_known_ones(cli, write):
    result = CliRunner().invoke(cli, ["sol", str(write("mm.py", matmul(8, 8, 8))), "--device", "RTX 9090"])
    assert result.exit_code == 2
    assert "known devices" in result.output


def test_the_human_rendering_names_the_binding_side(write):
    text = render_bounds(bounds_of(write("ew.py", ELEMENTWISE)))
    assert "memory-bound" in text and "3.35 TB/s" in text


def test_the_documented_table_is_the_table_in_the_code():
    from kernelscout.tools.device_specs import DEVICES

    doc = (REPO / "docs" / "sol.md").read_text()
    for d in DEVICES:
        cells = [d.fp32_tflops, d.tf32_tflops, d.fp16_tflops, d.bf16_tflops, d.fp64_tflops, d.bandwidth_gbs, d.last_level_cache_mb]
        row = " | ".join("–" if v is None else f"{v:g}" for v in cells)
        assert f"| {d.key} | " in doc and f" | {row} |" in doc, d.key


def test_a_bound_the_reference_itself_beats_is_dropped_not_held_against_candidates(tmp_path, monkeypatch):
    """bfloat16 on a CPU with bf16 units runs faster than the fp32 peak a CPU bound is measured at: the
    trusted reference then comes in under the floor, which shows the bound is wrong, not that every
    faster candidate skipped work."""
    from kernelscout.agent.targets import CodeTarget
    from kernelscout.tools.rundir import RunDir
    from kernelscout.tools.schema import Measurement, MeasureStatus
    from kernelscout.tools.sol import SolBounds

    bounds = SolBounds(problem="p.py", device="cpu", device_key="cpu", precision="fp32", flops=10**9, min_bytes=10**6,
                       input_bytes=10**6, output_bytes=0, param_bytes=0, peak_flops=1e11, peak_bandwidth=1e10,
                       ridge_intensity=10.0, compute_ms=10.0, memory_ms=0.1, time_ms=10.0, bound="compute",
                       cache_resident=False, floor_ms=10.0, counted_on="meta", peaks_source="measured")

    monkeypatch.setenv("KSCOUT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sol, "measure_cpu_peaks", lambda threads, **kw: sol.DevicePeaks(
        device="test CPU", key="cpu", kind="cpu", flops_per_s={"fp32": 1e11}, bandwidth=1e10, cache_bytes=32 << 20, source="test"))
    cpu_peaks()  # the cached rate the bound was made from

    def cached() -> bool:
        return bool(json.loads((tmp_path / "cache" / "cpu_peaks.json").read_text()))

    def target(name: str) -> CodeTarget:
        run = RunDir(tmp_path / name)
        run.set_meta("sol_bounds", bounds.model_dump_json())
        return CodeTarget(tmp_path / "p.py", "cpu", run)

    def timed(candidate_ms: float, reference_ms: float, alone_ms: Optional[float] = None) -> Measurement:
        return Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, runtime_ms=candidate_ms,
                           ref_runtime_ms=reference_ms, speedup=reference_ms / candidate_ms,
                           reference_alone_ms=reference_ms if alone_ms is None else alone_ms)

    honest_floor = target("a")
    assert "below the speed-of-light floor" in honest_floor.below_speed_of_light(timed(2.0, 12.0))  # reference above it
    # 6 ms is under the measured CPU bound yet believed (the margin is half of it): a forecast may not rule it out
    assert honest_floor.below_speed_of_light(timed(6.0, 12.0)) is None and honest_floor.forecast_floor_ms == 5.0
    from kernelscout.agent.factory import make_predictor
    from kernelscout.agent.search_spec import SearchSpec

    spec = SearchSpec(kind="problem", path=str(tmp_path / "p.py"))
    assert make_predictor(spec, honest_floor).sol_ms == 5.0  # what the search's forecasts are floored at

    # what the candidate's worker reports of the reference, the candidate could have written: a reference time
    # under the floor that the referee's own timing alone does not confirm leaves the bound in force
    forged = target("c")
    assert "below the speed-of-light floor" in forged.below_speed_of_light(timed(2.0, 3.0, alone_ms=12.0))
    assert forged.bounds is not None and not forged.run.get_meta("sol_dropped") and cached()

    wrong = target("b")
    assert wrong.below_speed_of_light(timed(2.0, 3.0)) is None  # the reference itself at 3 ms, under the 10 ms floor
    assert wrong.bounds is None and wrong.headroom(None) is None
    assert "the reference itself" in wrong.run.get_meta("sol_dropped")
    assert not cached()  # the CPU's cached peak was too low: the next bound measures it again
    assert CodeTarget(tmp_path / "p.py", "cpu", RunDir(tmp_path / "b")).bounds is None  # and after a resume
