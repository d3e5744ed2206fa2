"""Wall time of a replay search at 1, 2 and 4 measurement workers, and the scaling efficiency.

Run: python benchmarks/workers_scaling.py [--space FILE] [--budget 40] [--delay 1.0] [--workers 1,2,4] [--ray] [--out FILE]

The replay device answers from a recorded space in microseconds, so each measurement also sleeps
`--delay` seconds in the worker, standing in for device time (a real GPU measurement with compile
and timing takes seconds). Everything else is the real search: proposals, surrogate fits, the
ledger, the dispatcher. Efficiency at N workers is T(1) / (N * T(N)); "device busy" is the
simulated device time over N * wall time, the share of worker time spent measuring.
With --ray the same searches also run on a local Ray instance (N CPU actors).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kernelscout.agent.runner import start_search
from kernelscout.sandbox.replay import recorded_spaces_dir

HUB = recorded_spaces_dir()


def one(space: str, budget: int, delay: float, workers: int, run_dir: str, ray: bool) -> dict:
    t0 = time.monotonic()
    r = start_search(problem=None, space=space, budget=budget, run_dir=run_dir, quiet=True, workers=workers,
                     ray="auto" if ray else None, replay_delay_s=delay)
    wall = time.monotonic() - t0
    lines = [json.loads(x) for x in (Path(run_dir) / "events.jsonl").read_text().splitlines()]
    iterations = sum(e["event"] == "predict" and bool(e.get("measure")) for e in lines)
    level = peak = 0
    for e in lines:
        level += {"measure_start": 1, "measure_end": -1}.get(e["event"], 0)
        peak = max(peak, level)
    charged = sum(e["event"] == "measure_end" and e.get("charged") for e in lines)
    return {"backend": "ray" if ray else "local", "workers": workers, "wall_s": wall, "measurements": r.measurements_used,
            "iterations": iterations, "peak_in_flight": peak, "best_speedup": r.best_speedup, "device_s": charged * delay}


def render(rows: list[dict], space: str, budget: int, delay: float) -> str:
    """The markdown table. "agent s / iteration" is the wall time not covered by device time, per iteration:
    (wall - device time / N) / iterations, i.e. proposing, forecasting, learning and bookkeeping."""
    lines = [f"Space `{space}`, budget {budget}, simulated device time {delay:g} s per measurement, learned surrogate, seed 0.", "",
             "| backend | workers | wall | speedup vs 1 worker | efficiency | device busy | agent s / iteration | iterations "
             "| peak in flight | best found |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = min((b for b in rows if b["backend"] == r["backend"]), key=lambda b: b["workers"])
        speed = base["wall_s"] / r["wall_s"]
        eff = speed * base["workers"] / r["workers"]
        busy = r["device_s"] / (r["workers"] * r["wall_s"])
        agent = (r["wall_s"] - r["device_s"] / r["workers"]) / max(1, r["iterations"])
        lines.append(f"| {r['backend']} | {r['workers']} | {r['wall_s']:.1f} s | {speed:.2f}x | {eff:.0%} | {busy:.0%} | {agent:.2f} s | "
                     f"{r['iterations']} | {r['peak_in_flight']} | {r['best_speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--space", default=str(HUB / "convolution_A100.json.gz"))
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--delay", type=float, default=1.0, help="simulated device seconds per measurement")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--ray", action="store_true", help="also run on a local Ray instance")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            rows.append(one(args.space, args.budget, args.delay, n, f"{tmp}/local-{n}", ray=False))
            print(json.dumps(rows[-1]), flush=True)
        if args.ray:
            import ray

            ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
            try:
                for n in counts:
                    rows.append(one(args.space, args.budget, args.delay, n, f"{tmp}/ray-{n}", ray=True))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                ray.shutdown()
    text = render(rows, Path(args.space).name, args.budget, args.delay)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
