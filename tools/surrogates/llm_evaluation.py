"""Held-out evaluation of the LLM surrogate on a recorded space (`kscout eval-surrogate --surrogate llm`).

The learned surrogate is scored on 20,000 pairs; an LLM forecast costs two chat calls, so this
protocol asks for far fewer and makes each one count. Per space and seed:

* Training: random configurations are measured on the replay device until `train` have a time, as
  for the learned surrogate. The one with the median time becomes the anchor: the parent every
  held-out configuration is forecast against, so that about half of the children are faster.
  The LLM is shown the training configurations as measured examples (child/anchor speedups).
* Held-out: `configs` random configurations that ran on the hardware, each forecast once as a child
  of the anchor, exactly as `predict` would in a search: parameter values as the "code", the
  anchor's measured time, the device.
* With `--warm-start`, each forecast also shows the child's recorded speedup over the anchor on the
  same kernel's other devices (where both ran there), as `kscout optimize --space --warm-start` does.
* P(faster), the bins, the confidence and the risk-coverage curve are scored against the anchor;
  pairwise ranking accuracy, Spearman and top-10% recovery rank the held-out configurations by the
  forecast expected speedup over the anchor.

The forecasts are the LLM's own probabilities. In a run they are recalibrated (isotonic) from the
measured outcomes of earlier forecasts; a held-out evaluation reveals no outcomes, so none is applied.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from kernelscout.sandbox.replay import ReplaySpace
from kernelscout.tools.surrogates import metrics as M
from kernelscout.tools.surrogates.llm import SPACE_SOL, LLMSurrogate, describe_config, transfer_lines


class _Recorder:
    """Stands in for a surrogate while the training set is drawn: keeps what was measured."""

    def __init__(self) -> None:
        self.timed: list[tuple[dict[str, Any], float]] = []

    def update(self, config: dict[str, Any], m: Any) -> None:
        if m.runtime_ms and m.runtime_ms > 0:
            self.timed.append((dict(config), float(m.runtime_ms)))


def _line(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in config.items())


def evaluate_llm_once(space: ReplaySpace, settings: Any, model: Any, seed: int,
                      priors: Sequence[Any] = ()) -> tuple[dict[str, float], dict[str, np.ndarray], int]:
    """Scores, curves and failures met while training, in the shape `evaluation._evaluate_once` returns.
    `priors` (`--warm-start`): the same kernel on other devices; each forecast is shown the child's
    recorded speedup over the anchor there."""
    from kernelscout.tools.surrogates.evaluation import COVERAGE_GRID, seeded_rng, train_on_replay

    rng = seeded_rng(space, seed)
    recorder = _Recorder()
    pool, failed = train_on_replay(space, recorder, settings.train, rng)  # type: ignore[arg-type]
    if not recorder.timed:
        raise ValueError(f"{space.name}: no training configuration ran, so there is no parent to forecast against")
    by_time = sorted(recorder.timed, key=lambda ct: ct[1])
    anchor, anchor_ms = by_time[len(by_time) // 2]
    surrogate = LLMSurrogate(model, edges=settings.edges, examples=min(len(by_time), 12))
    for config, ms in recorder.timed:
        if config != anchor:
            surrogate.observe(None, anchor_ms / ms, label=_line(config))

    ran = pool[np.isfinite(space.median_times[pool])]
    chosen = rng.choice(ran, size=min(settings.llm_configs, ran.size), replace=False)
    truth = np.log(space.median_times[chosen])
    n_bins = len(settings.edges) + 1
    p_faster, bins, score, informative = (np.full(chosen.size, 0.5), np.full((chosen.size, n_bins), 1.0 / n_bins),
                                          np.zeros(chosen.size), np.zeros(chosen.size, dtype=bool))
    parent = describe_config(space, anchor)
    for k, idx in enumerate(chosen):
        child = space.config(int(idx))
        f = surrogate.forecast(child_source=describe_config(space, child), parent_source=parent, parent_ms=anchor_ms,
                               parent_speedup=1.0, incumbent_ratio=None, device=space.device_label, sol=SPACE_SOL,
                               related=transfer_lines(priors, anchor, child))
        if f.informative:
            p_faster[k], bins[k], informative[k] = f.p_faster, f.bin_probs, True
            score[k] = -math.log(max(f.expected_speedup or 1.0, 1e-9))  # lower = faster, as a predicted log time

    speedup = anchor_ms / np.exp(truth)
    faster = speedup > 1.0
    outcome_bin = np.searchsorted(np.asarray(settings.edges), speedup, side="right")
    confidence = np.abs(2 * p_faster - 1)
    correct = np.where(p_faster == 0.5, 0.5, ((p_faster > 0.5) == faster).astype(float))
    coverage, risk = M.risk_coverage(confidence, correct)
    i, j = M.sample_pairs(chosen.size, settings.pairs, rng)
    scores = {
        "pairwise_accuracy": M.pairwise_accuracy(score, truth, i, j),
        "direction_accuracy": M.direction_accuracy(p_faster, faster),
        "spearman": M.spearman(score, truth) if np.ptp(score) > 0 else 0.0,
        "brier": M.brier_multiclass(bins, outcome_bin),
        "rps": M.ranked_probability_score(bins, outcome_bin),
        "ece_p_faster": M.expected_calibration_error(p_faster, faster),
        "aurc": float(risk.mean()),
        "top10_recovery": M.top_fraction_recovery(score, np.exp(truth), settings.top_fraction),
        "informative": float(informative.mean()),
    }
    curves = {"risk": np.asarray(M.curve_at(coverage, risk, COVERAGE_GRID)), "p_faster": p_faster, "faster": faster.astype(float)}
    return scores, curves, failed

