"""Checks the CUDA measurement path on a real GPU: ceilings, L2 flush, harness timing, correctness, SOL.

Run on a machine with a CUDA device: python benchmarks/gpu_validation.py [--out DIR]
It prints markdown sections (the source of docs/gpu-validation.md) and writes them, with the raw
numbers as JSON, under --out. Nothing here is a test: the suite never needs a GPU. What each section
shows, and what would count as a failure, is printed beside its numbers.

- ceilings: a device-to-device copy and fp32/bf16 matrix products, against the datasheet peaks that
  `sol` uses, so a reader can see how far the speed-of-light bounds are from what the card does;
- L2 flush: the harness's CallTimer on a read that fits in L2, with and without its flush. Flushed
  calls must run at DRAM speed; unflushed ones may run faster (that is the gap the flush closes);
- harness against triton.testing.do_bench on the same kernels (both median, both flushing L2);
- every example candidate measured through `measure` on the GPU (sandboxed workers, correctness on
  fresh inputs, same-session speedup), each time checked against its speed-of-light floor.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernelscout.sandbox.pool import WorkerPool
from kernelscout.sandbox.timing import CallTimer
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.sol import SolRequest, sol_bounds

REPO = Path(__file__).resolve().parents[1]


def _median_ms(fn, timer: CallTimer, n: int) -> float:
    for _ in range(3):
        timer(fn)
    return statistics.median(timer(fn)[1] for _ in range(n))


def environment() -> dict:
    p = torch.cuda.get_device_properties(0)
    import triton

    return {"device": torch.cuda.get_device_name(0), "sms": p.multi_processor_count,
            "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1), "memory_gib": round(p.total_memory / 2**30, 1),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def ceilings(timer: CallTimer) -> dict:
    """Measured peaks, for comparison with the datasheet numbers in tools/device_specs.py."""
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.randn(2**28, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), timer, 20)
    out = {"copy_tb_s": 2 * src.numel() * 4 / copy_ms / 1e9}
    n = 8192
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ms = _median_ms(lambda: a @ b, timer, 10)
        out[f"{name}_matmul_tflop_s"] = 2 * n**3 / ms / 1e9
    return out


class _NoFlush(CallTimer):
    """The harness's timer with its L2-evicting fills swapped for a spin of the same length.

    Dropping them outright would also drop the busy time that hides launch latency and keeps the
    clocks up, and the comparison would measure that instead of the cache.
    """

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._fill_cycles = int(self.fill_ms * 2e6)  # cycles at about 2 GHz, a boost clock of current GPUs

    def flush(self) -> None:
        torch.cuda._sleep(self._fill_cycles)

    def keep_busy(self) -> None:
        torch.cuda._sleep(self._fill_cycles * self._warm_fills)


def l2_flush(flushed: CallTimer) -> dict:
    """A 16 MiB read fits in any Hopper L2: without a flush it is served from cache, with one it is not."""
    unflushed = _NoFlush(torch.device("cuda"))
    rows = {}
    for mib in (16, 1024):
        x = torch.randn(mib * 2**20 // 4, device="cuda")
        fn = lambda: x.sum()  # noqa: E731
        f_ms, u_ms = _median_ms(fn, flushed, 200), _median_ms(fn, unflushed, 200)
        rows[f"{mib} MiB"] = {"flushed_ms": f_ms, "unflushed_ms": u_ms,
                              "flushed_tb_s": mib * 2**20 / f_ms / 1e9, "unflushed_tb_s": mib * 2**20 / u_ms / 1e9}
    return rows


def _load_model(path: Path, cls: str):
    spec = importlib.util.spec_from_file_location(f"_v_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod, getattr(mod, cls)


def against_do_bench(timer: CallTimer) -> list[dict]:
    """The harness's per-call median against Triton's own benchmark helper (trusted example code, in process)."""
    import triton.testing

    rows = []
    for problem_dir, name in (("softmax", "triton_rows.py"), ("gated_gelu", "triton_fused.py"), ("softmax", "fast.py"),
                              ("layernorm", "fast.py")):
        problem, _ = _load_model(REPO / "examples" / problem_dir / "problem.py", "Model")
        _, cls = _load_model(REPO / "examples" / problem_dir / name, "ModelNew")
        torch.manual_seed(0)
        model = cls(*problem.get_init_inputs()).cuda()
        inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.get_inputs()]
        with torch.no_grad():
            ours = _median_ms(lambda: model(*inputs), timer, 100)
            theirs = triton.testing.do_bench(lambda: model(*inputs), warmup=25, rep=200, return_mode="median")
        rows.append({"candidate": f"{problem_dir}/{name}", "harness_ms": ours, "do_bench_ms": theirs, "ratio": ours / theirs})
    return rows


def examples(run_dir: str) -> list[dict]:
    rows = []
    with WorkerPool() as pool:
        for problem in sorted((REPO / "examples").glob("*/problem.py")):
            floor = sol_bounds(SolRequest(problem=str(problem), device="cuda"))
            for cand in sorted(problem.parent.glob("*.py")):
                if cand.name == "problem.py":
                    continue
                t0 = time.monotonic()
                m = measure(MeasureRequest(problem=str(problem), candidate=str(cand), device="cuda", run_dir=run_dir), pool=pool)
                ct = m.candidate_timing
                rows.append({"candidate": f"{problem.parent.name}/{cand.name}", "status": m.status.value, "correct": m.correct,
                             "timing_valid": m.timing_valid, "speedup": m.speedup, "runtime_ms": m.runtime_ms,
                             "ref_ms": m.ref_runtime_ms, "iqr_pct": 100 * ct.iqr_ms / ct.median_ms if ct else None,
                             "repeats": ct.repeats if ct else None, "sol_floor_ms": floor.floor_ms, "bound": floor.bound,
                             "above_floor": None if m.runtime_ms is None else m.runtime_ms >= floor.floor_ms,
                             "message": m.message[:160], "warnings": m.warnings[:2], "wall_s": time.monotonic() - t0})
                print(rows[-1], flush=True)
    return rows


def _f(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def render(r: dict) -> str:
    e = r["environment"]
    lines = [f"Device: **{e['device']}** ({e['sms']} SMs, {e['l2_mib']} MiB L2, {e['memory_gib']} GiB), "
             f"torch {e['torch']} (CUDA {e['cuda']}), Triton {e['triton']}; run {e['date']}.", ""]
    c = r["ceilings"]
    lines += ["| ceiling | measured |", "|---|---|", f"| device-to-device copy (read + write) | {c['copy_tb_s']:.2f} TB/s |",
              f"| fp32 matmul 8192³ (TF32 off) | {c['fp32_matmul_tflop_s']:.1f} TFLOP/s |",
              f"| bf16 matmul 8192³ | {c['bf16_matmul_tflop_s']:.1f} TFLOP/s |", ""]
    lines += ["| L2 flush: x.sum() over | flushed (harness) | unflushed | flushed TB/s | unflushed TB/s |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v['flushed_ms']:.4f} ms | {v['unflushed_ms']:.4f} ms | {v['flushed_tb_s']:.2f} | {v['unflushed_tb_s']:.2f} |"
              for k, v in r["l2_flush"].items()] + [""]
    lines += ["| candidate (in process) | harness median | do_bench median | ratio |", "|---|---|---|---|"]
    lines += [f"| {x['candidate']} | {x['harness_ms']:.4f} ms | {x['do_bench_ms']:.4f} ms | {x['ratio']:.3f} |" for x in r["do_bench"]] + [""]
    lines += ["| candidate (via `measure`) | status | correct | timing valid | speedup | candidate ms | reference ms | IQR % | rounds | SOL floor ms | above floor |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in r["examples"]:
        lines.append(f"| {x['candidate']} | {x['status']} | {x['correct']} | {x['timing_valid']} | {_f(x['speedup'], '.2f')} | "
                     f"{_f(x['runtime_ms'], '.4f')} | {_f(x['ref_ms'], '.4f')} | {_f(x['iqr_pct'], '.1f')} | {x['repeats'] or '-'} | "
                     f"{x['sol_floor_ms']:.4f} | {x['above_floor']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_validation")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_validation: no CUDA device is visible; run this on a GPU machine")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = CallTimer(torch.device("cuda"))
    r = {"environment": environment()}
    for name, fn in (("ceilings", lambda: ceilings(timer)), ("l2_flush", lambda: l2_flush(timer)),
                     ("do_bench", lambda: against_do_bench(timer))):
        r[name] = fn()
        print(name, json.dumps(r[name], indent=1), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        r["examples"] = examples(f"{tmp}/run")
    (out / "gpu_validation.json").write_text(json.dumps(r, indent=1))
    text = render(r)
    (out / "gpu_validation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
