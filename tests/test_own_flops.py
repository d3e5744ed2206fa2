"""A time under the reference's speed-of-light bound that the candidate's own FLOPs explain.

A GEMM followed by a sum over its columns is a matrix-vector product: a correct candidate that finds this is
many times faster than the reference's FLOPs allow, honestly. The harness counts the candidate's own FLOPs
when asked (in one more fresh-input call whose output is checked), and the search judges the time against
that count; what the counter cannot see (Triton, custom, native or array-library kernels) keeps the
reference's bound, and a candidate that tampers with the counter is caught.
"""

from typing import Optional

import pytest
import torch

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.tools.schema import Measurement, MeasureStatus
from conftest import QUICK, TEST_DEVICE

COUNTED = QUICK.model_copy(update={"count_flops": True})

GEMM_SUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, fin, fout):
        super().__init__()
        self.lin = nn.Linear(fin, fout)

    def forward(self, x):
        return self.lin(x).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256, 256]
"""

ALGEBRA = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    '''sum_j (x W^T + b)_j = x . (sum_j W_j) + sum_j b_j'''
    def __init__(self, fin, fout):
        super().__init__()
        self.lin = nn.Linear(fin, fout)

    def forward(self, x):
        w = self.lin.weight.sum(0, keepdim=True)
        return x @ w.t() + self.lin.bias.sum()
"""

SAME_WORK = ALGEBRA.replace("""        w = self.lin.weight.sum(0, keepdim=True)
        return x @ w.t() + self.lin.bias.sum()""", """        return self.lin(x).sum(dim=1, keepdim=True)""")


def test_a_candidate_that_does_less_work_has_its_own_flops_counted(measure_source):
    less = measure_source(ALGEBRA, problem=GEMM_SUM, config=COUNTED)
    same = measure_source(SAME_WORK, problem=GEMM_SUM, config=COUNTED)
    assert less.status == MeasureStatus.ok and less.correct and same.correct, (less.message, same.message)
    gemm = 2 * 64 * 256 * 256  # the reference's FLOPs, as the bound counts them
    assert gemm <= same.candidate_flops < 1.01 * gemm  # its GEMM, and an element each for the sum
    assert less.candidate_flops < gemm / 50  # a (64 x 256) by (256 x 1) product and the sums of W and b
    assert less.flops_uncounted is None and same.flops_uncounted is None
    # not asked, not counted: an ordinary measurement pays nothing for it
    plain = measure_source(ALGEBRA, problem=GEMM_SUM)
    assert plain.candidate_flops is None and plain.flops_uncounted is None


def test_the_count_comes_after_the_timed_rounds_so_it_cannot_slow_them(measure_source):
    """A torch.compile'd forward run once under the counter's dispatch mode ran at eager speed from then on (a
    confirmation read 0.92x for a kernel measured at 1.82x). This candidate turns slow the same way, for good."""
    slowed = SAME_WORK.replace("class ModelNew", """
import time


class ModelNew""", 1).replace("""        return self.lin(x).sum(dim=1, keepdim=True)""", """        if torch._C._len_torch_dispatch_stack() > 0:
            self.slowed = True
        if getattr(self, "slowed", False):
            time.sleep(0.05)
        return self.lin(x).sum(dim=1, keepdim=True)""")
    m = measure_source(slowed, problem=GEMM_SUM, config=COUNTED)
    assert m.correct and m.candidate_flops, m.message
    assert m.runtime_ms < 25, m.runtime_ms  # timed before it was counted


def test_work_out_of_the_counters_sight_is_not_counted(measure_source):
    numpy_side = ALGEBRA.replace("import torch\n", "import numpy\nimport torch\n", 1)
    m = measure_source(numpy_side, problem=GEMM_SUM, config=COUNTED)
    assert m.correct and m.candidate_flops is None and "imports numpy" in m.flops_uncounted


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the custom operator is registered for the CPU")
def test_a_custom_operator_is_work_the_count_does_not_cover(measure_source):
    custom = ALGEBRA.replace("class ModelNew", '''
_lib = torch.library.Library("kscout_test_flops", "DEF")
_lib.define("rowdot(Tensor x, Tensor w) -> Tensor")
_lib.impl("rowdot", lambda x, w: x @ w, "CPU")


class ModelNew''', 1).replace("return x @ w.t()", "return torch.ops.kscout_test_flops.rowdot(x, w.t())")
    m = measure_source(custom, problem=GEMM_SUM, config=COUNTED)
    assert m.correct, m.message
    assert m.candidate_flops is None and "operators from outside torch (kscout_test_flops::rowdot" in m.flops_uncounted


@pytest.mark.parametrize("forward", [
    # the GEMM as a broadcast multiply and a sum, only when a dispatch mode (the counter) is watching
    """if torch._C._len_torch_dispatch_stack() > 0:
            return (x[:, None, :] * self.lin.weight[None]).sum(-1, keepdim=False).sum(1, keepdim=True) + self.lin.bias.sum()
        return self.lin(x).sum(dim=1, keepdim=True)""",
    # through in-place and batched products, which torch's own counter has no formula for
    """out = self.lin.bias.expand(x.shape[0], -1).clone()
        out.addmm_(x, self.lin.weight.t())
        return out.sum(dim=1, keepdim=True)""",
    """out = self.lin.bias.expand(x.shape[0], -1).clone()
        return torch.addbmm(out, x[None], self.lin.weight.t()[None]).sum(dim=1, keepdim=True)""",
])
def test_a_gemm_run_any_other_torch_way_still_counts_as_a_gemm(measure_source, forward):
    m = measure_source(SAME_WORK.replace("return self.lin(x).sum(dim=1, keepdim=True)", forward), problem=GEMM_SUM, config=COUNTED)
    assert m.correct, m.message
    assert m.candidate_flops >= 2 * 64 * 256 * 256 or m.flops_uncounted, m


def test_a_candidate_that_makes_its_gemm_count_as_nothing_is_caught(measure_source):
    tamper = SAME_WORK.replace("class ModelNew", '''
import torch.utils.flop_counter as _fc
_fc.flop_registry[torch.ops.aten.addmm] = lambda *args, **kwargs: 0


class ModelNew''', 1)
    m = measure_source(tamper, problem=GEMM_SUM, config=COUNTED)
    assert not m.usable, m
    assert "flop_registry" in m.message, m.message


# -- the search's judgement, on a bound given outright -------------------------------------------------------


@pytest.fixture
def target(tmp_path):
    from kernelscout.agent.targets import CodeTarget
    from kernelscout.tools.rundir import RunDir
    from kernelscout.tools.sol import SolBounds

    bounds = SolBounds(problem="p.py", device="cpu", device_key="cpu", precision="fp32", flops=10**9, min_bytes=10**6,
                       input_bytes=10**6, output_bytes=0, param_bytes=0, peak_flops=1e11, peak_bandwidth=1e10,
                       ridge_intensity=10.0, compute_ms=10.0, memory_ms=0.1, time_ms=10.0, bound="compute",
                       cache_resident=False, floor_ms=10.0, counted_on="meta", peaks_source="measured")
    run = RunDir(tmp_path / "run")
    run.set_meta("sol_bounds", bounds.model_dump_json())
    return CodeTarget(tmp_path / "p.py", "cpu", run)


def timed(candidate_ms: float, flops: Optional[int] = None, uncounted: Optional[str] = None) -> Measurement:
    return Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, runtime_ms=candidate_ms, ref_runtime_ms=20.0,
                       speedup=20.0 / candidate_ms, reference_alone_ms=20.0, candidate_flops=flops, flops_uncounted=uncounted)


def test_a_time_under_the_references_bound_counts_when_the_candidates_own_flops_explain_it(target):
    assert "below the speed-of-light floor" in target.below_speed_of_light(timed(2.0))  # 1 GFLOP at 100 GFLOP/s is 10 ms
    assert target.below_speed_of_light(timed(2.0, flops=10**8)) is None  # its own 0.1 GFLOP: 1 ms, and it took 2
    assert "less work than the reference" in target.less_work(timed(2.0, flops=10**8))
    # its own count does not excuse a time under its own floor, nor does a count it was never given
    assert "even at the candidate's own FLOP count" in target.below_speed_of_light(timed(0.2, flops=10**8))
    assert "not counted: it launches Triton kernels" in target.below_speed_of_light(
        timed(2.0, uncounted="it launches Triton kernels, whose FLOPs torch's counter does not see"))
    assert "below the speed-of-light floor" in target.below_speed_of_light(timed(2.0, flops=2 * 10**9))  # more work is no excuse
    assert target.less_work(timed(12.0, flops=10**8)) is None  # above the reference's floor: nothing to explain


def test_the_harness_setting_is_off_unless_a_search_asks():
    assert HarnessConfig().count_flops is False


def test_the_progress_line_says_a_time_under_the_bound_was_explained_by_less_work():
    from kernelscout.agent.progress import SearchProgress

    line = SearchProgress(4, "gemm_sum", live=False)._describe("measure", {
        "candidate": 1, "status": "ok", "speedup": 14.7, "timing_valid": True, "used": 2, "cap": 4, "best": 14.7,
        "less_work": "0.17 ms is under the reference's speed-of-light floor ..."})
    assert "14.700x (under the reference's speed-of-light bound; its own FLOPs explain it: it does less work, counted)" in line


@pytest.mark.parametrize("work, covered", [
    (lambda x, w: torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(x, w)), 2), True),
    (lambda x, w: torch.nn.functional.layer_norm(x, x.shape[-1:]).softmax(-1).topk(2, -1).values, True),
    (lambda x, w: torch.nn.functional.scaled_dot_product_attention(x, x, x), True),
    (lambda x, w: torch.linalg.solve(x[0, 0, :4, :4] + 4 * torch.eye(4), x[0, 0, :4, :1]), False),  # no price: uncovered
])
def test_the_strict_count_prices_common_torch_work_and_names_what_it_cannot(work, covered):
    from kernelscout.sandbox.flop_count import DtypeFlopCounter

    x, w = torch.randn(2, 4, 16, 16), torch.randn(8, 4, 3, 3)
    counter = DtypeFlopCounter(strict=True)
    with torch.no_grad(), counter:
        work(x, w)
    assert (counter.uncovered() is None) == covered, counter.uncovered()
    assert counter.total() > 0


def test_a_candidate_that_breaks_after_a_call_under_the_counter_is_counted_after_its_second_opinion(measure_source):
    """torch.compile(fullgraph=True) raises in every call after one under the counter's dispatch mode ("found no
    compiled frames"): counted before the second worker's check, a re-measured best of the tuner's came out as a
    runtime error (the README's main job, 2026-12-06). This candidate breaks the same way."""
    breaks = SAME_WORK.replace("""        return self.lin(x).sum(dim=1, keepdim=True)""", """        if torch._C._len_torch_dispatch_stack() > 0:
            self.counted = True
        elif getattr(self, "counted", False):
            raise RuntimeError("called again after the flop counter")
        return self.lin(x).sum(dim=1, keepdim=True)""")
    m = measure_source(breaks, problem=GEMM_SUM, config=COUNTED)
    assert m.status == MeasureStatus.ok and m.correct and m.candidate_flops, m.message
    assert any("judged by a second worker" in c for c in m.checks), m.checks
