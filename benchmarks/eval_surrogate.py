"""Evaluate the surrogates on the provided tuning spaces and write the results to docs/surrogate.md.

    python benchmarks/eval_surrogate.py                      # 10 seeds, 50 training configs (~15 min on 2 shared cores)
    python benchmarks/eval_surrogate.py --seeds 2 --quick    # smoke run

Every number above the line `HAND_WRITTEN` in the written document comes from this run; nothing there is
copied in by hand. What is below that line (experiments this script does not run) is kept as it was. It runs the
same code as `kscout eval-surrogate` (tools/surrogates/evaluation.py) and prints the equivalent
commands, then replays the measure/skip gate over candidate streams (see `gate_replay`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernelscout.sandbox.replay import ReplaySpace, load_spaces, recorded_spaces_dir
from kernelscout.tools.predict import Forecast, SurrogateCost
from kernelscout.tools.surrogates.decision import RiskControlledGate
from kernelscout.tools.surrogates.distribution import LogTimeDistribution
from kernelscout.tools.surrogates.evaluation import (
    EvalReport,
    EvalSettings,
    evaluate,
    seeded_rng,
    train_on_replay,
    warm_start_priors,
)
from kernelscout.tools.surrogates.plots import write_plots
from kernelscout.tools.surrogates.registry import make_surrogate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = recorded_spaces_dir()
TARGETS = {"pairwise_accuracy": (">=", 0.85), "ece_p_faster": ("<=", 0.05), "top10_recovery": (">=", 0.95)}
COLUMNS = (
    ("pairwise_accuracy", "pair acc"),
    ("direction_accuracy", "dir acc"),
    ("spearman", "Spearman"),
    ("brier", "Brier"),
    ("rps", "RPS"),
    ("ece_p_faster", "ECE P(faster)"),
    ("aurc", "AURC"),
    ("top10_recovery", "top-10% rec."),
)


# --- gate replay ----------------------------------------------------------------------------


@dataclass
class StreamRecord:
    p_beats: list[float]
    won: list[bool]


@dataclass
class GateOutcome:
    candidates: int = 0
    measured: int = 0
    audits: int = 0
    winners: int = 0
    missed: int = 0
    best_ratio: float = 0.0  # best time in the stream (and training) over best time found


def _light_forecast(p: float) -> Forecast:
    return Forecast(
        surrogate="learned",
        informative=True,
        bin_edges=[],
        bin_labels=[],
        bin_probs=[],
        p_faster=p,
        p_beats_incumbent=p,
        confidence=abs(2 * p - 1),
        rationale="gate replay",
        cost=SurrogateCost(latency_ms=0.0),
    )


def _stream(
    space: ReplaySpace, seed: int, train: int, length: int, warm: Sequence[ReplaySpace]
) -> tuple[LogTimeDistribution, np.ndarray, float]:
    """Train the learned surrogate as in the evaluation, then a random stream of unseen candidates."""
    rng = seeded_rng(space, 1000 + seed)
    priors = warm_start_priors(space, warm) if warm else []
    surrogate = make_surrogate("learned", space.param_values, priors=priors, seed=seed, valid=space.configs)
    pool, _ = train_on_replay(space, surrogate, train, rng)
    seen = np.setdiff1d(np.arange(len(space)), pool)
    incumbent = float(np.nanmin(space.median_times[seen]))
    stream = pool[:length]
    dist = surrogate.predictive(np.asarray(space.configs, dtype=object)[stream])
    return dist, space.median_times[stream], incumbent


GATE_MODES = {
    "scratch": "from scratch",
    "same_space": "preloaded: earlier runs, same space",
    "other_spaces": "preloaded: other kernels/GPUs",
}


def _record(stream: tuple[LogTimeDistribution, np.ndarray, float]) -> StreamRecord:
    """(P(beats), won) of every candidate of a stream measured without a gate."""
    dist, times, inc = stream
    rec = StreamRecord([], [])
    for k in range(len(times)):
        rec.p_beats.append(float(dist.subset([k]).p_faster_than(np.log(inc))[0]))
        won = bool(np.isfinite(times[k]) and times[k] < inc)
        rec.won.append(won)
        if won:
            inc = float(times[k])
    return rec


def _run_gate(gate: RiskControlledGate, stream: tuple[LogTimeDistribution, np.ndarray, float], total: GateOutcome) -> float:
    dist, times, inc = stream
    best_possible = min(inc, float(np.nanmin(times)))
    for j in range(len(times)):
        f = _light_forecast(float(dist.subset([j]).p_faster_than(np.log(inc))[0]))
        d = gate.decide(f)
        won = bool(np.isfinite(times[j]) and times[j] < inc)
        total.candidates += 1
        total.winners += won
        if d.action == "skip":
            total.missed += won
            continue
        total.measured += 1
        total.audits += d.audit
        gate.observe(f, won, d)
        if won:
            inc = float(times[j])
    return best_possible / inc


def gate_replay(
    spaces: Sequence[ReplaySpace], seeds: int, train: int, length: int, target: float
) -> dict[str, dict[str, GateOutcome]]:
    """Replay the gate over random candidate streams against the running incumbent.

    Each stream is first measured in full to record (P(beats), won). Then the gate runs on it three
    ways: from scratch; preloaded with the records of the other streams of the same space (earlier
    runs of the same kernel on the same device, the exchangeable case the conformal bound assumes);
    and preloaded with the records of all other spaces (transfer across kernels and GPUs, where that
    assumption need not hold).
    """
    streams = {(s.name, k): _stream(s, k, train, length, ()) for s in spaces for k in range(seeds)}
    records = {key: _record(stream) for key, stream in streams.items()}
    out: dict[str, dict[str, GateOutcome]] = {mode: {} for mode in GATE_MODES}
    for s in spaces:
        for mode in GATE_MODES:
            total = GateOutcome()
            ratios = []
            for k in range(seeds):
                gate = RiskControlledGate(target_risk=target, seed=k)
                for (name, seed), rec in records.items():
                    same = name == s.name
                    if (mode == "same_space" and same and seed != k) or (mode == "other_spaces" and not same):
                        gate.preload(rec.p_beats, rec.won)
                ratios.append(_run_gate(gate, streams[(s.name, k)], total))
            total.best_ratio = float(np.mean(ratios))
            out[mode][s.name] = total
    return out


# --- markdown ---------------------------------------------------------------------------------


def _table(report: EvalReport, baseline: EvalReport | None = None) -> list[str]:
    head = "| space | " + " | ".join(h for _, h in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, res in report.spaces.items():
        cells = []
        for key, _ in COLUMNS:
            v = getattr(res, key)
            cell = f"{v:.3f}"
            if baseline is not None and key in ("pairwise_accuracy", "spearman", "top10_recovery"):
                cell += f" ({v - getattr(baseline.spaces[name], key):+.3f})"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    mean_cells = []
    for key, _ in COLUMNS:
        cell = f"**{report.mean[key]:.3f}**"
        if baseline is not None and key in ("pairwise_accuracy", "spearman", "top10_recovery"):
            cell += f" ({report.mean[key] - baseline.mean[key]:+.3f})"
        mean_cells.append(cell)
    lines.append("| **mean** | " + " | ".join(mean_cells) + " |")
    return lines


def _targets(report: EvalReport) -> list[str]:
    out = []
    for key, (op, bound) in TARGETS.items():
        v = report.mean[key]
        ok = v >= bound if op == ">=" else v <= bound
        out.append(f"- {key} {op} {bound}: **{v:.3f}** — {'met' if ok else 'NOT met'}")
    return out


def _std_line(report: EvalReport) -> str:
    parts = [f"{n}: ±{r.std['pairwise_accuracy']:.3f}" for n, r in report.spaces.items()]
    return "Seed-to-seed standard deviation of pairwise accuracy: " + ", ".join(parts) + "."


def render(
    reports: dict[str, EvalReport],
    seconds: dict[str, float],
    gate: dict[str, dict[str, GateOutcome]],
    args: argparse.Namespace,
    commands: dict[str, str],
) -> str:
    cold, warm, rf, none = reports["learned"], reports["learned-warm"], reports["plain-rf"], reports["none"]
    s = cold.settings
    lines = [
        "# Surrogate benchmark results",
        "",
        f"Produced by `python benchmarks/eval_surrogate.py --seeds {args.seeds} --train {args.train}"
        + (" --quick" if args.quick else "")
        + f"` on {platform.machine()} ({platform.python_version()}), "
        f"{time.strftime('%Y-%m-%d')}. Data: Kernel Tuner caches in `{args.data}` (8 brute-forced spaces).",
        "The script runs the same evaluation as these CLI commands:",
        "",
        "```",
        *commands.values(),
        "```",
        "",
        "## Protocol",
        "",
        f"- Per space and seed ({s.seeds} seeds): random configurations are measured on the replay device until "
        f"{s.train} have a time (failures met on the way are charged and shown to the surrogate); every other "
        "configuration is held out. Truth = median of the recorded repeats.",
        f"- {s.pairs} random (parent, child) pairs of held-out configurations per seed. *pair acc*: share of pairs whose "
        "order the forecasts of both agree with (the surrogate ranks the pool; no measured time used). *dir acc*: the "
        "child's P(faster) against the parent's measured time is on the right side of 1/2 (what a search asks).",
        "- Brier and RPS over the 8 speedup bins (edges 0.5, 0.8, 0.95, 1.05, 1.25, 1.5, 2.0; RPS normalised to [0, 1]); "
        "ECE of P(faster) with 10 equal-width bins; AURC of the faster/slower call ranked by confidence |2P-1|; "
        "top-10% recovery: measure the 10% of the held-out pool that the forecasts rank first (by P(beats the best "
        "training configuration) x P(does not fail), as the search loop ranks), best time in the pool over best found.",
        "- Warm start: the other spaces of the same kernel (other GPUs) are priors. gemm has no second GPU, so its warm "
        "and cold runs coincide.",
        "- No hyperparameter is set per space; the model (features, ensemble, calibration) is the same everywhere.",
        '- The LLM surrogate (`--surrogate llm`, not run here: no model provider can be reached from this machine; tested',
        '  with scripted models and a local OpenAI-compatible server) cannot afford 20000 pairs, two chat calls per',
        '  forecast. After the same training draw, the training configuration with the median time becomes the anchor',
        '  and every training configuration is shown as a measured example (its speedup over the anchor). `--configs`',
        '  (default 60) held-out configurations that ran are each forecast as a child of the anchor, with their',
        '  parameter values as the code. P(faster), the bins, ECE and AURC are scored against the anchor; pair acc,',
        "  Spearman and top-10% rank those configurations by the forecast expected speedup. The LLM's probabilities",
        '  are scored as given: in a run they are recalibrated from the outcomes of its earlier forecasts, which a',
        '  held-out evaluation does not reveal. The JSON adds `informative`, the share of forecasts that were not',
        '  deferrals. With `--warm-start` each forecast also shows, for every other GPU of the same kernel that timed both',
        "  the anchor and the child, the child's recorded speedup over the anchor there (a failure there shows nothing,",
        '  and no imputed value is shown). `kscout optimize --space FILE --surrogate llm --warm-start OTHER` puts the same',
        "  lines in the search's forecasts.",
        "",
        f"## Learned surrogate, cold start, {s.train} training configurations ({seconds['learned']:.0f} s)",
        "",
        *_table(cold),
        "",
        _std_line(cold),
        "",
        "Targets (mean over spaces):",
        "",
        *_targets(cold),
        "",
        f"## Learned surrogate, warm start from the same kernel on other GPUs ({seconds['learned-warm']:.0f} s)",
        "",
        "In brackets: gain over the cold start above (same seeds, same splits).",
        "",
        *_table(warm, cold),
        "",
        "Targets (mean over spaces):",
        "",
        *_targets(warm),
        "",
        "## Baselines",
        "",
        f"Plain random forest on raw parameter values (`--surrogate plain-rf`, same conformal/calibration wrapper; "
        f"{seconds['plain-rf']:.0f} s). In brackets: learned (cold) minus this baseline.",
        "",
        *_table_delta_vs(rf, cold),
        "",
        "No surrogate (`--surrogate none`): every forecast is a coin flip, so pairwise and direction accuracy are "
        f"{none.mean['pairwise_accuracy']:.3f} and {none.mean['direction_accuracy']:.3f}, Brier "
        f"{none.mean['brier']:.3f}, RPS {none.mean['rps']:.3f}, and top-10% recovery of a random 10% is "
        f"{none.mean['top10_recovery']:.3f}.",
        "",
    ]
    lines += _gate_section(gate, args)
    lines += [
        "## Figures",
        "",
        f"Written to `{_shown(args.plots)}/` (not committed): `cold-reliability.png`, `cold-risk-coverage.png`, "
        "`warm-reliability.png`, `warm-risk-coverage.png`, and the JSON reports.",
        "",
    ]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """A path under the repository as the reader's checkout has it, not as this machine does."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


HAND_WRITTEN = "<!-- Written by hand below this line: benchmarks/eval_surrogate.py rewrites only what is above it. -->"


def keep_written_by_hand(old: str, generated: str) -> str:
    """The generated results, then whatever the previous document held below `HAND_WRITTEN`.

    Why: the document also records experiments this script does not run (the code problems' prior, the fit's
    scale), written up by hand; a rerun that refreshes the numbers must not delete them.
    """
    kept = old.split(HAND_WRITTEN, 1)[1].strip("\n") if HAND_WRITTEN in old else ""
    return generated.rstrip("\n") + "\n\n" + HAND_WRITTEN + "\n" + (f"\n{kept}\n" if kept else "")


def _table_delta_vs(baseline: EvalReport, better: EvalReport) -> list[str]:
    head = "| space | pair acc | Spearman | ECE P(faster) | top-10% rec. |"
    lines = [head, "|---|---|---|---|---|"]
    for name, res in baseline.spaces.items():
        b = better.spaces[name]
        lines.append(
            f"| {name} | {res.pairwise_accuracy:.3f} ({b.pairwise_accuracy - res.pairwise_accuracy:+.3f}) | "
            f"{res.spearman:.3f} ({b.spearman - res.spearman:+.3f}) | {res.ece_p_faster:.3f} | "
            f"{res.top10_recovery:.3f} ({b.top10_recovery - res.top10_recovery:+.3f}) |"
        )
    m, bm = baseline.mean, better.mean
    lines.append(
        f"| **mean** | {m['pairwise_accuracy']:.3f} ({bm['pairwise_accuracy'] - m['pairwise_accuracy']:+.3f}) | "
        f"{m['spearman']:.3f} ({bm['spearman'] - m['spearman']:+.3f}) | {m['ece_p_faster']:.3f} | "
        f"{m['top10_recovery']:.3f} ({bm['top10_recovery'] - m['top10_recovery']:+.3f}) |"
    )
    return lines


def _gate_section(gate: dict[str, dict[str, GateOutcome]], args: argparse.Namespace) -> list[str]:
    lines = [
        f"## Measure/skip gate replay (target: at most {args.gate_target:.0%} of would-be winners skipped)",
        "",
        f"Per space, {args.gate_seeds} streams of {args.gate_length} random unseen candidates after the {args.train} "
        "training measurements (cold learned surrogate, fixed); a would-be winner beats the incumbent (best measured "
        "so far) at its turn. Three starts: *from scratch*; *preloaded: earlier runs, same space* (the outcomes of the "
        "other streams of this space, measured without a gate); *preloaded: other kernels/GPUs* (the outcomes of all "
        "other spaces' streams). Per cell: share measured / would-be winners missed of all would-be winners.",
        "",
        "| space | " + " | ".join(GATE_MODES.values()) + " |",
        "|---|" + "---|" * len(GATE_MODES),
    ]
    names = list(next(iter(gate.values())))
    totals = {mode: GateOutcome() for mode in GATE_MODES}

    def cell(g: GateOutcome) -> str:
        return f"{g.measured / max(g.candidates, 1):.0%} / {g.missed} of {g.winners}"

    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(gate[mode][name]) for mode in GATE_MODES) + " |")
        for mode in GATE_MODES:
            g, t = gate[mode][name], totals[mode]
            t.candidates += g.candidates
            t.measured += g.measured
            t.winners += g.winners
            t.missed += g.missed
    lines.append("| **all** | " + " | ".join(f"**{cell(totals[m])}**" for m in GATE_MODES) + " |")
    rates = {m: totals[m].missed / max(totals[m].winners, 1) for m in GATE_MODES}
    lines += [
        "",
        "Miss rate over all would-be winners: "
        + ", ".join(f"{GATE_MODES[m]} {rates[m]:.1%}" for m in GATE_MODES)
        + ". Best found over best of the stream, preloaded from the same space: "
        + ", ".join(f"{n} {gate['same_space'][n].best_ratio:.3f}" for n in names)
        + ".",
        "",
        "A random stream yields few winners (records in a random sequence grow like its logarithm), so from "
        "scratch the gate rarely sees the 19 winners a 5% conformal bound needs and measures everything, saying so. "
        "Inside the searches of the published search table (80 runs of 100 measurements with the learned surrogate, "
        "2026-11-26, twenty-third session) the gate never skipped a candidate: a search meets a handful of new bests, "
        "not 19. What the forecasts save there comes from ranking instead: the space is screened (then by expected "
        "improvement; by max-value entropy search since the seventy-fourth session), the loop measures, of the "
        "candidates pending, the one most likely to beat the best by more than 2 % (since the twenty-fifth session; "
        "before, by any margin), and the rest wait in a queue of 32 (those that lose their place are shelved and may "
        "be proposed again). So on those spaces the candidates considered per measurement are the ranking's work, "
        "not confident skips. The bound assumes that earlier outcomes are exchangeable with the new ones; the last "
        "column shows what happens when they come from other kernels and devices.",
        "",
        "Since the twenty-seventh session a search's surrogate (not the one these replays and eval-surrogate build) "
        "fits the slowest quarter of what it has measured as equally slow once 50 configurations are timed "
        "(`focus_after`), to rank among the good configurations late in a run; docs/search_experiments.md has the "
        "paired runs.",
        "",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--train", type=int, default=50)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "surrogate.md")
    ap.add_argument("--plots", type=Path, default=ROOT / "runs" / "eval-surrogate")
    ap.add_argument("--gate-seeds", type=int, default=5)
    ap.add_argument("--gate-length", type=int, default=1000)
    ap.add_argument("--gate-target", type=float, default=0.05)
    ap.add_argument("--quick", action="store_true", help="fewer pairs, for a smoke run")
    args = ap.parse_args()

    spaces = load_spaces([args.data])
    pairs = 2000 if args.quick else 20000
    runs = {
        "learned": EvalSettings(surrogate="learned", train=args.train, seeds=args.seeds, pairs=pairs),
        "learned-warm": EvalSettings(
            surrogate="learned", train=args.train, seeds=args.seeds, pairs=pairs, warm_start=True
        ),
        "plain-rf": EvalSettings(surrogate="plain-rf", train=args.train, seeds=args.seeds, pairs=pairs),
        "none": EvalSettings(surrogate="none", train=args.train, seeds=args.seeds, pairs=pairs),
    }
    commands = {
        name: f"kscout eval-surrogate {args.data} --train {s.train} --seeds {s.seeds} --surrogate {s.surrogate}"
        + (" --warm-start" if s.warm_start else "")
        + (f" --pairs {pairs}" if pairs != 20000 else "")
        + " --json"
        for name, s in runs.items()
    }
    reports: dict[str, EvalReport] = {}
    seconds: dict[str, float] = {}
    args.plots.mkdir(parents=True, exist_ok=True)
    for name, settings in runs.items():
        print(f"== {commands[name]}", flush=True)
        start = time.perf_counter()
        reports[name] = evaluate(
            spaces,
            settings,
            progress=lambda r: print(
                f"   {r.space}: pair acc {r.pairwise_accuracy:.3f} ECE {r.ece_p_faster:.3f} "
                f"top10 {r.top10_recovery:.3f} ({r.seconds:.0f}s)",
                flush=True,
            ),
        )
        seconds[name] = time.perf_counter() - start
        print("   mean " + json.dumps({k: round(v, 4) for k, v in reports[name].mean.items()}), flush=True)
        (args.plots / f"{name}.json").write_text(reports[name].model_dump_json(indent=2))
    write_plots(reports["learned"], args.plots, prefix="cold")
    write_plots(reports["learned-warm"], args.plots, prefix="warm")
    print("== gate replay", flush=True)
    gate = gate_replay(spaces, args.gate_seeds, args.train, args.gate_length, args.gate_target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = args.out.read_text() if args.out.exists() else ""
    if old and HAND_WRITTEN not in old:
        backup = args.out.with_name(args.out.name + ".bak")
        backup.write_text(old)
        print(f"{args.out} had no line {HAND_WRITTEN!r}: it is rewritten whole; the old text is in {backup}")
    args.out.write_text(keep_written_by_hand(old, render(reports, seconds, gate, args, commands)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
