"""A prior across problems: what earlier runs on this device measured, for a search that has little yet.

The learned surrogate of a code problem fits only that problem's own measurements and says nothing
until it has `min_points` of them, which at the budgets people give a code problem (10 or so) comes
with the last measurement or never. Rewrites behave alike across problems, though (compiling the
reference usually wins on a memory-bound chain of element-wise ops, CUDA graphs rarely pay off on a
kernel that takes milliseconds), so the runs already in the user's runs folder know something.

This module reads those runs (read-only), turns each measured candidate into one outcome: its
features as the policy described it and its measured speedup over its parent, and fits a small forest
on them. Its error is measured the only honest way for a new problem: leaving out one problem at a
time (one run at a time when every earlier run is of the same problem), and those held-out residuals
become the shape and width of every forecast it makes, as the cross-fit residuals do in learned.py.

It decides only what to measure: nothing it predicts is shown as a speedup.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.tools.rundir import reading

PRIOR_FEATURE = "prior.log_speedup"
"""The prior's forecast of log(speedup over the reference), added to every row of the in-problem fit."""

MIN_OUTCOMES = 8
MAX_RUNS = 200  # newest first: reading is cheap, but a folder of thousands of runs should not stall a start
_SKIP_FEATURES = {"parent_speedup"}  # enters as the target's offset, not as a feature


class Outcome(BaseModel):
    """One measured candidate of an earlier run."""

    run: str
    problem: str = Field(description="sha256 of the problem file, so runs of one problem group together")
    features: dict[str, Any]
    parent_speedup: float = Field(gt=0)
    speedup: float = Field(gt=0, description="measured speedup over that run's reference")

    @property
    def log_ratio(self) -> float:
        """log(child speedup over its parent): the scale on which problems are comparable."""
        return math.log(self.speedup) - math.log(self.parent_speedup)


def _meta(db: sqlite3.Connection, key: str) -> Optional[str]:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def device_class(device: str, bounds_json: Optional[str]) -> str:
    """What must match for an earlier run to count: cpu, or the GPU model the bounds were read for."""
    base = "cpu" if not device.startswith("cuda") else "cuda"
    if base == "cpu" or not bounds_json or bounds_json == "unavailable":
        return base
    try:
        key = json.loads(bounds_json).get("device_key")
    except (ValueError, AttributeError):
        key = None
    return f"cuda:{key}" if key else base


def run_spec(run_dir: str | Path) -> tuple[dict, Optional[str]]:
    """A run directory's stored search spec (as JSON) and speed-of-light bounds, read without writing;
    ({}, None) when it holds neither or cannot be read."""
    db_path = Path(run_dir) / "run.db"
    if not db_path.is_file():
        return {}, None
    try:
        with reading(db_path) as db:
            return json.loads(_meta(db, "search_spec") or "{}"), _meta(db, "sol_bounds")
    except (sqlite3.Error, ValueError):
        return {}, None


def run_device_class(run_dir: Path) -> Optional[str]:
    """The device class of a code-problem run directory, or None when it is not one."""
    spec, bounds = run_spec(run_dir)
    if spec.get("kind") != "problem":
        return None
    return device_class(str(spec.get("device", "cpu")), bounds)


def same_device(a: str, b: str) -> bool:
    """Classes match when equal; a GPU run whose model is unknown (no bounds) matches any GPU run."""
    if a == b:
        return True
    return a.split(":")[0] == b.split(":")[0] == "cuda" and "cuda" in (a, b)


def find_runs(roots: Iterable[str | Path], device: str, exclude: Optional[Path] = None) -> list[str]:
    """Code-problem runs of this device class (`device_class`) under `roots`: each root is a run
    directory, a folder of them, or a `kscout run` folder (its problems/NAME are two levels down).
    Newest first, at most MAX_RUNS."""
    seen: dict[Path, float] = {}
    skip = Path(exclude).resolve() if exclude else None
    for root in roots:
        root = Path(root).expanduser()
        if not root.is_dir():
            continue
        children = [p for p in sorted(root.iterdir()) if p.is_dir()]
        grandchildren = [g for c in children for g in sorted(c.iterdir()) if g.is_dir()]
        for candidate in [root, *children, *grandchildren]:
            db = candidate / "run.db"
            if not db.is_file() or candidate.resolve() == skip:
                continue
            cls = run_device_class(candidate)
            if cls is not None and same_device(cls, device):
                seen[candidate.resolve()] = db.stat().st_mtime
    return [str(p) for p, _ in sorted(seen.items(), key=lambda kv: -kv[1])[:MAX_RUNS]]


def read_outcomes(run_dirs: Iterable[str | Path]) -> list[Outcome]:
    """Every candidate of these runs that was measured correct with a valid timing, in the order each run
    measured them (suspect ones are
    left out: a time below speed-of-light is not something to learn from). A candidate that was
    re-measured counts at the median of all its measurements: the draw that made it the best was the
    luckiest of many."""
    out: list[Outcome] = []
    for run_dir in run_dirs:
        db_path = Path(run_dir) / "run.db"
        try:
            with reading(db_path) as db:
                rows = db.execute(
                    "SELECT c.id, c.features_json, c.speedup, m.problem_sha FROM candidates c JOIN measurements m"
                    " ON m.id = c.measurement_id WHERE c.state = 'measured' AND c.speedup > 0 ORDER BY m.id"
                ).fetchall()
                again: dict[int, list[float]] = {}
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'confirmations'").fetchone():
                    for cid, sp in db.execute("SELECT candidate_id, speedup FROM confirmations WHERE ok = 1 AND speedup > 0"):
                        again.setdefault(cid, []).append(sp)
        except sqlite3.Error:
            continue  # an unreadable or half-written run teaches nothing; the search goes on without it
        for cid, features_json, speedup, problem in rows:
            speedup = float(np.median([speedup, *again.get(cid, [])]))
            features = json.loads(features_json or "{}")
            parent = features.get("parent_speedup", 1.0)
            if not isinstance(parent, (int, float)) or parent <= 0:
                continue
            out.append(Outcome(run=str(run_dir), problem=problem or str(run_dir), features=features,
                               parent_speedup=float(parent), speedup=float(speedup)))
    return out


def _row(features: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, bool) else v) for k, v in features.items() if k not in _SKIP_FEATURES and k != PRIOR_FEATURE}


class CrossProblemPrior:
    """Forecasts log(child speedup over its parent) for a code candidate from earlier runs' outcomes."""

    def __init__(self, outcomes: Sequence[Outcome], seed: int = 0, trees: int = 200):
        from sklearn.feature_extraction import DictVectorizer

        if len(outcomes) < MIN_OUTCOMES:
            raise ValueError(f"{len(outcomes)} measured candidates in earlier runs; a prior needs {MIN_OUTCOMES}")
        self.seed, self.trees = seed, trees
        self.outcomes = list(outcomes)
        self.problems = sorted({o.problem for o in self.outcomes})
        self.runs = sorted({o.run for o in self.outcomes})
        by = "problem" if len(self.problems) >= 2 else "run"
        groups = np.asarray([getattr(o, by) for o in self.outcomes])
        if len(set(groups)) < 2:
            raise ValueError("the earlier runs hold a single run of a single problem; a prior needs two to measure its own error")
        self.held_out_by = by
        self._vec = DictVectorizer(sparse=False)
        x = self._vec.fit_transform([_row(o.features) for o in self.outcomes])
        y = np.asarray([o.log_ratio for o in self.outcomes])
        self._model = self._forest(x, y)
        resid = np.empty_like(y)
        for g in sorted(set(groups)):
            test = groups == g
            resid[test] = y[test] - self._forest(x[~test], y[~test]).predict(x[test])
        self.scale = max(float(np.sqrt(np.mean(resid**2))), 0.02)  # RMS held-out error, floored at 2 %
        self.residuals = resid / self.scale
        self.bandwidth = 1.06 * float(self.residuals.std() or 1.0) * self.residuals.size ** (-0.2)

    def _forest(self, x: np.ndarray, y: np.ndarray):
        from sklearn.ensemble import ExtraTreesRegressor

        return ExtraTreesRegressor(n_estimators=self.trees, min_samples_leaf=2, max_features=0.5,
                                   random_state=self.seed, n_jobs=1).fit(x, y)

    def log_ratio(self, features: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Forecast log(speedup over the parent), one per candidate."""
        if not features:
            return np.zeros(0)
        return self._model.predict(self._vec.transform([_row(f) for f in features]))

    def log_speedup(self, features: Sequence[Mapping[str, Any]],
                    seen: Sequence[tuple[Mapping[str, Any], float]] = ()) -> np.ndarray:
        """Forecast log(speedup over the reference): the parent's measured speedup times the forecast ratio,
        corrected by what this problem measured so far (`seen`: features and measured log ratio)."""
        parents = np.asarray([max(float(f.get("parent_speedup", 1.0) or 1.0), 1e-9) for f in features])
        return np.log(parents) + self.log_ratio(features) + self.offsets(features, seen)

    def offsets(self, features: Sequence[Mapping[str, Any]], seen: Sequence[tuple[Mapping[str, Any], float]]) -> np.ndarray:
        """How far this problem has been from the prior, per candidate: the mean miss over everything it
        measured, plus the mean miss over the candidates of the same family (rewrite or tuning), each
        shrunk towards zero as a random effect with few observations should be (n / (n + k): k = 3 for
        the problem, 1 for a family). Other problems said compiling wins; if two compiled variants of this
        one measured 0.65x, the next compiled variant is forecast lower, from the first measurement on
        rather than from the eighth, when the problem's own fit takes over."""
        if not seen or not features:
            return np.zeros(len(features))
        miss = np.asarray([r for _, r in seen]) - self.log_ratio([f for f, _ in seen])
        overall = float(miss.sum() / (miss.size + 3.0))
        fams = [str(f.get("kind", "-")) for f, _ in seen]
        by_family: dict[str, float] = {}
        for fam in set(fams):
            rest = np.asarray([m - overall for m, g in zip(miss, fams) if g == fam])
            by_family[fam] = float(rest.sum() / (rest.size + 1.0))
        return np.asarray([overall + by_family.get(str(f.get("kind", "-")), 0.0) for f in features])

    def describe(self) -> str:
        return (f"{len(self.outcomes)} measured candidates of {len(self.problems)} problem(s) in {len(self.runs)} earlier run(s), "
                f"held-out error {self.scale:.2f} in log-speedup (by {self.held_out_by})")


def load_prior(run_dirs: Sequence[str | Path], seed: int = 0) -> tuple[Optional[CrossProblemPrior], str]:
    """The prior from these runs, or None and why not (too few outcomes, a single run)."""
    if not run_dirs:
        return None, "no earlier runs on this device"
    outcomes = read_outcomes(run_dirs)
    try:
        return CrossProblemPrior(outcomes, seed=seed), ""
    except ValueError as exc:
        return None, str(exc)
