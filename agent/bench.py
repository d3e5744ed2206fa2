"""`kscout bench search`: kernelscout's search against Kernel Tuner on recorded spaces, same budgets, same seeds.

What is compared, and how, so that the numbers mean what they say:

* **kernelscout** runs the real search loop (`start_search`, the code path of `kscout optimize --space`,
  offline tuner policy, learned surrogate) on the replay device, each run in its own run directory.
  **kernelscout --surrogate none** is the same loop measuring everything the policy proposes: the
  difference between the two is what `predict` buys.
* **Kernel Tuner** (optional extra `bench`) runs its own strategies in simulation mode on the same
  cache file, with the space's restrictions as strings (a membership test makes its model-based
  strategies much worse, which would not be a fair comparison). Each strategy is seeded through the
  global `random` and `numpy.random` state it draws from (its module imported first, so that an import
  cannot shift the draws). bayes_opt decides when to refit its model by the wall clock; in simulation
  it reads a clock on which an evaluation takes longer than a prediction, as on a GPU (`_device_clock`).
* **Budget** = unique configurations measured (failed ones included: they cost a compile and a run on
  the hardware too). kernelscout's reference configuration (drawn by the seed, and timed beside every
  candidate without a charge, as a user's own kernel is) counts as the first of them: the search knows its
  time, so at budget B it has B unique configurations, B - 1 of them charged, as Kernel Tuner has B. Kernel Tuner's simulation runner counts exactly that for `max_fevals`, except
  that dual_annealing also hands `max_fevals` to scipy as its call limit, which counts repeats and
  invalid points and stops it at about a third of the budget; it therefore gets more calls and is cut
  at the budget like the others.
* **Budget nesting**: one run per (space, seed, method) at the largest budget; the result at a smaller
  budget is the best after that many measurements. This is fair because no method here reads its
  budget except to stop (kernelscout's replay policy never sees it; Kernel Tuner's random_sample draws a
  random permutation prefix, genetic_algorithm, bayes_opt and dual_annealing use it only as a stop).
* **Metric**: fraction of the optimum = best recorded time in the whole space / best recorded time
  among the configurations measured, 0 when none ran; mean over seeds. Recorded times (the cache's
  `time`) are the ground truth for every method, so measurement noise in the replay cannot flatter
  anyone. A space tuned for a throughput whose work per call differs is timed for equal work (sandbox/objectives.py),
  so there the fraction is one of the throughput, and Kernel Tuner is given that objective. Candidates considered per measurement = distinct candidates that got a forecast and a
  measure/skip decision, over measurements (kernelscout only; Kernel Tuner does not report forecasts).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.sandbox.objectives import Objective, THROUGHPUTS
from kernelscout.sandbox.replay import CUT_KEY, CacheFileError, ReplaySpace, read_cache_json, space_labels
from kernelscout.sandbox.t4_results import T4_KEY

KT_STRATEGIES = ("random_sample", "genetic_algorithm", "bayes_opt", "dual_annealing")
KS_METHODS = {"kernelscout": "learned", "kernelscout --surrogate none": "none"}
RANDOM_EXACT = "random search (exact expectation)"
_DA_CALLS_PER_UNIQUE = 5  # dual_annealing's call limit per unique configuration wanted (see module docstring)


class BenchError(Exception):
    """Unusable input; the message says what to do."""


# -- the metric ---------------------------------------------------------------------------------

def best_after(trace: Sequence[float], budget: int) -> float:
    """Best (lowest) recorded time among the first `budget` measured configurations; inf if none ran."""
    finite = [t for t in trace[:budget] if t is not None and math.isfinite(t)]
    return min(finite) if finite else math.inf


def frac_of_opt(optimum: float, best_found: float) -> float:
    """Best time in the whole space over the best time found: 1.0 is the optimum, 0.0 nothing usable."""
    if not math.isfinite(best_found) or best_found <= 0:
        return 0.0
    return optimum / best_found


def unique_in_order(keys: Sequence[Any]) -> list[Any]:
    """First occurrences only: a configuration measured twice costs one unit of budget."""
    seen: set = set()
    out = []
    for k in keys:
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def random_search_expectation(times: Sequence[float], budget: int) -> float:
    """Exact expected fraction of the optimum of `budget` configurations drawn without replacement.

    With the n times sorted ascending (failures last, worth 0), the i-th best (1-based) is the best of
    the sample with probability p_i = C(n-i, b-1) / C(n, b). The binomials themselves outgrow a float on
    a space of 10^5 configurations, so p_i comes from p_1 = b / n and p_(i+1) / p_i = (n-i-b+1) / (n-i).
    """
    t = np.asarray(times, dtype=float)
    n = t.size
    b = min(budget, n)
    ok = np.sort(t[np.isfinite(t)])
    if ok.size == 0 or b == 0:
        return 0.0
    i = np.arange(1, ok.size, dtype=float)
    p = (b / n) * np.concatenate([[1.0], np.cumprod(np.clip((n - i - b + 1) / (n - i), 0.0, None))])
    return float(np.sum(ok[0] / ok * p))


# -- results ------------------------------------------------------------------------------------

class Trace(BaseModel):
    """One run: recorded times of the configurations in the order they were measured (NaN = failed)."""

    space: str
    method: str
    seed: int
    times: list[float]
    considered: list[Optional[int]] = Field(default_factory=list, description="candidates considered after each measurement")
    wall_s: float = 0.0
    note: str = ""


class Cell(BaseModel):
    frac_of_opt: float
    considered_per_measurement: Optional[float] = None
    stderr: Optional[float] = Field(None, description="standard error of frac_of_opt over the seeds (None: one seed, or computed exactly)")


def _stderr(values: Sequence[float]) -> Optional[float]:
    """Standard error of a mean over seeds. Why report it: with 10 seeds one space's mean moves by
    several hundredths between seed sets, so a ranking of methods needs its error bar beside it."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None


def behind_beyond_noise(a: Cell, b: Cell, sigmas: float = 2.0) -> Optional[bool]:
    """Whether `b` beats `a` by more than `sigmas` standard errors of the difference (unpaired: the
    methods share seeds but not random streams). None when either cell has no error bar."""
    if a.stderr is None or b.stderr is None:
        return None
    return b.frac_of_opt - a.frac_of_opt > sigmas * math.hypot(a.stderr, b.stderr)


class BenchResult(BaseModel):
    budgets: list[int]
    seeds: int
    spaces: dict[str, dict[str, dict[str, Cell]]]  # space -> method -> budget -> cell
    mean: dict[str, dict[str, Cell]]  # method -> budget -> mean over spaces
    wall_s: dict[str, float] = Field(default_factory=dict, description="total run time per method, all spaces and seeds")
    notes: list[str] = Field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """`{space: {method: {budget: {"frac_of_opt": x, "considered_per_measurement": y, "stderr": z}}}}`: the issue's
        format plus the standard error over the seeds that the table prints (None where the value is exact)."""
        return {s: {m: {b: {"frac_of_opt": c.frac_of_opt, "considered_per_measurement": c.considered_per_measurement,
                            "stderr": c.stderr}
                        for b, c in cells.items()} for m, cells in methods.items()} for s, methods in self.spaces.items()}


def summarise(traces: Sequence[Trace], spaces: dict[str, ReplaySpace], budgets: Sequence[int], seeds: int) -> BenchResult:
    out: dict[str, dict[str, dict[str, Cell]]] = {}
    wall: dict[str, float] = {}
    for tr in traces:
        wall[tr.method] = wall.get(tr.method, 0.0) + tr.wall_s
    for name, space in spaces.items():
        optimum = float(np.nanmin(space.times))
        methods: dict[str, dict[str, Cell]] = {}
        for method in sorted({t.method for t in traces if t.space == name}, key=_method_order):
            runs = [t for t in traces if t.space == name and t.method == method]
            cells = {}
            for b in budgets:
                fracs = [frac_of_opt(optimum, best_after(t.times, b)) for t in runs]
                cpm = [t.considered[min(b, len(t.considered)) - 1] / min(b, len(t.considered))
                       for t in runs if t.considered and t.considered[min(b, len(t.considered)) - 1] is not None]
                se = _stderr(fracs)
                cells[str(b)] = Cell(frac_of_opt=round(float(np.mean(fracs)), 4), considered_per_measurement=round(float(np.mean(cpm)), 2) if cpm else None,
                                     stderr=None if se is None else round(se, 4))
            methods[method] = cells
        methods[RANDOM_EXACT] = {str(b): Cell(frac_of_opt=round(random_search_expectation(space.times, b), 4)) for b in budgets}
        out[name] = methods
    mean: dict[str, dict[str, Cell]] = {}
    all_methods = sorted({m for v in out.values() for m in v}, key=_method_order)
    for m in all_methods:
        mean[m] = {}
        for b in map(str, budgets):
            cells = [out[s][m][b] for s in out if m in out[s]]
            cpm = [c.considered_per_measurement for c in cells if c.considered_per_measurement is not None]
            ses = [c.stderr for c in cells]
            # the mean over spaces of independent per-space means; exact cells (random search) add no error
            se = None if any(e is None for e in ses) else math.sqrt(sum(e * e for e in ses)) / len(ses)
            mean[m][b] = Cell(frac_of_opt=round(float(np.mean([c.frac_of_opt for c in cells])), 4),
                              considered_per_measurement=round(float(np.mean(cpm)), 2) if cpm else None,
                              stderr=None if se is None else round(se, 4))
    notes = sorted({t.note for t in traces if t.note} | {n for s in spaces.values() for n in s.notes})
    return BenchResult(budgets=list(budgets), seeds=seeds, spaces=out, mean=mean, wall_s={k: round(v, 1) for k, v in wall.items()}, notes=notes)


def _method_order(method: str) -> tuple[int, str]:
    if method == "kernelscout":
        return (0, method)
    if method.startswith("kernelscout"):
        return (1, method)
    if method == RANDOM_EXACT:
        return (3, method)
    return (2, method)


# -- kernelscout runs ---------------------------------------------------------------------------

def kernelscout_trace(space_path: str, surrogate: str, seed: int, budget: int, run_dir: str,
                      warm_start: Sequence[str] = (), label: str = "", objective: str = "file") -> Trace:
    """Run the search loop exactly as `kscout optimize --space` does (less report.html), then read its run directory.

    `warm_start`: recorded spaces of the same kernel on other devices, as `--warm-start` takes them."""
    from kernelscout.agent.runner import start_search

    space = _space(space_path, label, objective)
    t0 = time.perf_counter()
    start_search(None, space_path, budget=budget, policy="tuner", surrogate=surrogate, run_dir=run_dir, seed=seed, quiet=True,
                 report=False, warm_start=list(warm_start), objective=objective)
    wall = time.perf_counter() - t0
    times, considered = read_run(space, run_dir)
    method = "kernelscout" if surrogate == "learned" else f"kernelscout --surrogate {surrogate}"
    method += " --warm-start" if warm_start else ""
    return Trace(space=space.name, method=method, seed=seed, times=times, considered=considered, wall_s=wall)


def read_run(space: ReplaySpace, run_dir: str) -> tuple[list[float], list[Optional[int]]]:
    """Recorded times of the configurations the run learned, in order: the reference's first (timed in every
    session), then each charged measurement's; and the candidates considered by then."""
    from kernelscout.agent.targets import REPLAY_REFERENCE_KEY
    from kernelscout.tools.rundir import reading

    with reading(Path(run_dir) / "run.db") as db:
        rows = db.execute("SELECT id, candidate_path FROM measurements WHERE charged = 1 ORDER BY id").fetchall()
        drawn = db.execute("SELECT value FROM meta WHERE key = ?", (REPLAY_REFERENCE_KEY,)).fetchone()
        reference = space.index_of(json.loads(drawn[0])) if drawn else None
        times: list[float] = [float(space.times[reference])] if reference is not None else []
        considered: list[Optional[int]] = [None] * len(times)
        for mid, config_text in rows:
            idx = space.index_of(json.loads(config_text))
            times.append(float(space.times[idx]) if idx is not None else math.nan)
            row = db.execute(
                "SELECT MAX(f.iteration) FROM forecasts f JOIN candidates c ON c.id = f.candidate_id"
                " WHERE c.measurement_id = ? AND f.decision = 'measure'", (mid,)).fetchone()
            if row is None or row[0] is None:
                considered.append(None)
                continue
            considered.append(db.execute("SELECT COUNT(DISTINCT candidate_id) FROM forecasts WHERE COALESCE(first_iteration, iteration) <= ?",
                                         (row[0],)).fetchone()[0])
    return times, considered


# -- Kernel Tuner runs --------------------------------------------------------------------------

README_LEVELS = 3  # folders searched for a README.md listing the kernel: the cache's own and two above it


def restrictions_for(space_path: str, objective: str = "file") -> Optional[list[str]]:
    """The space's restrictions as Kernel Tuner strings, from the nearest README.md that lists its kernel: next
    to the cache file, or up to two folders above it (`cachefiles/<kernel>/<GPU>.json.gz`, the hub's own layout,
    keeps one README for every kernel).

    The README lists them per kernel under "Valid space of each kernel" as `- kernel: `expr`; `expr``
    ("none" for a full product). None when no README lists the kernel. `objective`: the one the space was loaded
    for, so that the loaded space is reused (the kernel's name is the same under either).
    """
    kernel = _space(space_path, objective=objective).kernel_name
    for folder in list(Path(space_path).resolve().parents)[:README_LEVELS]:
        readme = folder / "README.md"
        found = _listed_restrictions(readme.read_text(), kernel) if readme.is_file() else None
        if found is not None:
            return found
    return None


def _listed_restrictions(text: str, kernel: str) -> Optional[list[str]]:
    section = text.split("## Valid space", 1)[1] if "## Valid space" in text else text
    section = section.split("\n## ", 1)[0]
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line[2:])
        elif items and line.startswith("  "):
            items[-1] += " " + line.strip()
    for item in items:
        name, _, rest = item.partition(":")
        if name.strip().strip("`") == kernel:
            return re.findall(r"`([^`]+)`", rest)
    return None


def kernel_tuner_trace(space_path: str, strategy: str, seed: int, budget: int, workdir: str, label: str = "",
                       objective: str = "file") -> Trace:
    """One Kernel Tuner strategy in simulation mode on the space's cache, seeded; unique configurations in order."""
    try:
        import kernel_tuner
    except ImportError:
        raise BenchError("Kernel Tuner is not installed: pip install 'kernelscout[bench]' (or pip install kernel-tuner), "
                         "or run without --baselines kernel_tuner") from None
    space = _space(space_path, label, objective)
    cache = _plain_cache(space_path, workdir, objective)
    header = json.loads(Path(cache).read_text())  # cheap next to the run, and what Kernel Tuner reads too
    keys = header.get("tune_params_keys") or list(header["tune_params"])
    tune_params = {k: header["tune_params"][k] for k in keys}
    strings = restrictions_for(space_path, objective)
    note = ""
    if strings is None and len(space) == math.prod(len(v) for v in tune_params.values()):
        restrictions: Any = None  # the full product: nothing to restrict
    elif strings is None:
        restrictions = [_membership_test(space, keys)]
        note = f"{space.name}: no README.md next to the cache or up to two folders above it lists its restriction strings; Kernel Tuner got a membership test (weaker)"
    else:
        restrictions = strings or None
    # the objective kernelscout follows (replay.py): a throughput is maximised, as Kernel Tuner does for it
    objective = {"objective": space.objective, "objective_higher_is_better": True} if space.objective in THROUGHPUTS \
        and space.follows_objective else {}
    options: dict[str, Any] = {"max_fevals": budget * (_DA_CALLS_PER_UNIQUE if strategy == "dual_annealing" else 1)}
    if strategy == "bayes_opt" and len(space) < 20:
        options["popsize"] = min(len(space), max(2, len(space) // 2))  # its initial sample (20) cannot exceed a tiny space
    with contextlib.suppress(ImportError):  # imported before seeding: an import that draws from the global
        importlib.import_module(f"kernel_tuner.strategies.{strategy}")  # generators must not shift the run's draws
    # and so is bayes_opt's module, whatever the strategy: the patches below import it (and scikit-learn with it),
    # which used to shift the draws of the first run in a process (genetic_algorithm, convolution_A100, seed 0)
    _bayes_opt_module()
    random.seed(seed)
    np.random.seed(seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings(), open(os.devnull, "w") as devnull, _seeded_latin_hypercube(seed), _device_clock():
        warnings.simplefilter("ignore")
        try:
            with contextlib.redirect_stdout(devnull):
                results, _ = kernel_tuner.tune_kernel(
                    header["kernel_name"], f"__global__ void {header['kernel_name']}() {{}}", header["problem_size"], [], tune_params,
                    restrictions=restrictions, strategy=strategy, strategy_options=options, cache=cache,
                    simulation_mode=True, quiet=True, verbose=False, **objective,
                )
        except Exception as exc:  # Kernel Tuner's own limits (a one-configuration space, list-valued parameters)
            raise BenchError(f"Kernel Tuner's {strategy} failed on {space.name}: {type(exc).__name__}: {exc}; "
                             "leave this space out or run it with --baselines none") from None
    wall = time.perf_counter() - t0
    measured = [space.index_of([r[k] for k in keys]) for r in results]
    order = unique_in_order([i for i in measured if i is not None])[:budget]
    if len(order) < budget:
        note = note or f"{strategy} stopped after {len(order)} unique configurations on {space.name} (budget {budget})"
    return Trace(space=space.name, method=f"kernel_tuner {strategy}", seed=seed, times=[float(space.times[i]) for i in order],
                 wall_s=wall, note=note)


SIMULATED_EVAL_S = 1.0  # what bayes_opt's clock shows for one evaluation; only "more than its model takes" matters


def _bayes_opt_module() -> Any:
    try:
        from kernel_tuner.strategies import bayes_opt as module
    except ImportError:
        return None
    return module


@contextlib.contextmanager
def _swapped(*changes: tuple[Any, str, Callable[[Any], Any]]) -> Iterator[None]:
    """Sets each `owner.name` to `make(original)` while the block runs, and restores it. If any is missing
    (another Kernel Tuner layout), nothing is changed: the baseline then runs as Kernel Tuner ships it."""
    originals = [getattr(owner, name, None) for owner, name, _ in changes]
    if any(o is None for o in originals):
        yield
        return
    for (owner, name, make), original in zip(changes, originals):
        setattr(owner, name, make(original))
    try:
        yield
    finally:
        for (owner, name, _), original in zip(changes, originals):
            setattr(owner, name, original)


@contextlib.contextmanager
def _device_clock() -> Iterator[None]:
    """Kernel Tuner's default bayes_opt (method "multi-ultrafast") refits its Gaussian process only when
    the last evaluations took at least 5 times as long as the last prediction, by the wall clock. On a GPU
    an evaluation (compile and benchmark) takes far longer than a prediction, so it refits every round; in
    simulation mode an evaluation is a cache lookup, so it refitted every sixth round or so, depending on
    the machine's load: the same seed gave different runs, and the baseline ran a weaker search than it
    would on hardware. While a baseline runs, that module's clock stands still except for
    `SIMULATED_EVAL_S` per evaluation, as a device's would for a model that predicts in no time."""
    module = _bayes_opt_module()
    clock = _SimulatedClock()

    def with_clock(real_time: Any) -> Any:
        clock.real = real_time
        return clock

    def timed(evaluate: Callable[..., Any]) -> Callable[..., Any]:
        def evaluate_on_the_clock(self: Any, *args: Any, **kwargs: Any) -> Any:
            clock.now += SIMULATED_EVAL_S
            return evaluate(self, *args, **kwargs)
        return evaluate_on_the_clock

    optimizer = getattr(module, "BayesianOptimization", None)
    with _swapped((module, "time", with_clock), (optimizer, "evaluate_objective_function", timed)):
        yield


class _SimulatedClock:
    """Stands in for the `time` module inside one Kernel Tuner strategy module: perf counters read `now`."""

    def __init__(self) -> None:
        self.real: Any = time
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def perf_counter_ns(self) -> int:
        return int(self.now * 1e9)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextlib.contextmanager
def _seeded_latin_hypercube(seed: int) -> Iterator[None]:
    """Kernel Tuner's bayes_opt draws its initial Latin hypercube from scipy with no seed, i.e. from fresh
    OS entropy, so the same seed gave different runs (pnpoly_RTX_3090, budget 10: 0.748 and 0.888).
    While a baseline runs, its module's `LatinHypercube` draws from a generator seeded by the run's seed."""
    rng = np.random.default_rng(seed)

    def seeded(original: Callable[..., Any]) -> Callable[..., Any]:
        def latin_hypercube(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("rng", rng)
            return original(*args, **kwargs)
        return latin_hypercube

    with _swapped((_bayes_opt_module(), "LatinHypercube", seeded)):
        yield


MEMBERSHIP_TEST_LIMIT = 2_000_000  # parameter combinations Kernel Tuner may test one by one in reasonable time


def _check_kernel_tuner_can_enumerate(space_path: str, objective: str = "file", label: str = "") -> None:
    """Refuse up front a space Kernel Tuner would spend hours enumerating: without restriction strings it
    gets a membership test, which it calls on every combination of the parameters' values (a 30-flag
    space recorded at 200 configurations is a billion calls), before any baseline result exists."""
    space = _space(space_path, label, objective)  # as the benchmark loaded it: no second load, and its name
    product = math.prod(len(v) for v in space.param_values.values())
    if product > MEMBERSHIP_TEST_LIMIT and product != len(space) and restrictions_for(space_path, objective) is None:
        raise BenchError(
            f"{space.name}: Kernel Tuner would test each of the {product:.3g} combinations of its parameter values "
            f"against the {len(space)} recorded configurations; list its restrictions as strings in a README.md next to "
            "the cache (see shared/data/benchmark_hub/README.md), or run it with --baselines none")


def _membership_test(space: ReplaySpace, keys: Sequence[str]) -> Callable[[Any], bool]:
    """A restriction that admits exactly the recorded configurations.

    A `def`, not a lambda: Kernel Tuner rewrites a lambda's source into a string restriction, which
    fails for one that closes over a set. With several parameters Kernel Tuner passes a dict of
    them; with one, just its value.
    """
    valid = {tuple(str(v) for v in c) for c in space.configs}

    def in_recorded_space(p: Any) -> bool:
        values = [p[k] for k in keys] if isinstance(p, dict) else [p]
        return tuple(str(v) for v in values) in valid

    return in_recorded_space


_SPACES: dict[tuple[str, str], ReplaySpace] = {}
_PLAIN: dict[str, str] = {}


def _space(path: str, label: str = "", objective: str = "file") -> ReplaySpace:
    if (path, objective) not in _SPACES:
        _SPACES[(path, objective)] = ReplaySpace.load(path, objective)
    return _SPACES[(path, objective)].named(label)


def _plain_cache(path: str, workdir: str, objective: str = "file") -> str:
    """Kernel Tuner reads plain, complete JSON with its header fields before the cache: a canonical copy,
    so that an interrupted cache (which our loader repairs), a re-saved one whose `cache` is not the last key,
    or one missing header fields runs as it replays here. One copy per space's content, shared by every
    process: in simulation mode Kernel Tuner only reads the file (a copy per process, with bayes_opt's fresh
    process per run, filled a 2-seed run's folder with 214 MB of copies)."""
    key = f"{path}\0{workdir}"  # a second benchmark in this process has a workdir of its own (the first's is gone)
    if key not in _PLAIN:
        space = _space(path, objective=objective)  # the space as loaded for this run (the copy itself is the raw file)
        dest = Path(workdir) / "kt-caches" / f"{space.content_sha[:16]}-{Path(path).name.removesuffix('.gz')}"
        if dest.is_file():
            _PLAIN[key] = str(dest)
            return _PLAIN[key]
        dest.parent.mkdir(parents=True, exist_ok=True)
        raw = read_cache_json(Path(path))
        doc = {k: v for k, v in raw.items() if k not in ("cache", CUT_KEY, T4_KEY)}
        doc.setdefault("device_name", space.device_name or "unknown")
        doc.setdefault("kernel_name", space.kernel_name or "kernel")
        doc.setdefault("problem_size", space.problem_size if space.problem_size is not None else [1])
        doc["tune_params_keys"] = list(space.param_names)
        doc.setdefault("objective", "time")
        doc["cache"] = raw["cache"]
        partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # whole or absent for a process beside this one
        partial.write_text(json.dumps(doc))
        os.replace(partial, dest)
        _PLAIN[key] = str(dest)
    return _PLAIN[key]


# -- orchestration ------------------------------------------------------------------------------

class BenchRequest(BaseModel):
    spaces: list[str]
    budgets: list[int] = Field(default_factory=lambda: [20, 50, 100])
    seeds: int = Field(10, ge=1)
    baselines: list[str] = Field(default_factory=lambda: ["kernel_tuner"])
    no_predict: bool = Field(True, description="also run kernelscout with --surrogate none")
    out: Optional[str] = Field(None, description="keep the run directories here (default: a temporary folder)")
    jobs: int = Field(2, ge=1)
    objective: Objective = Field("file", description="what each space is searched and scored for (ReplaySpace.load)")


def _task(kind: str, path: str, label: str, arg: str, seed: int, budget: int, workdir: str, objective: str = "file") -> Trace:
    if kind == "kernelscout":
        run_dir = Path(workdir) / "runs" / f"{label.replace('/', '--')}-{arg}-seed{seed}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        return kernelscout_trace(path, arg, seed, budget, str(run_dir), label=label, objective=objective)
    if arg == "bayes_opt":
        # Its runs depend on what Kernel Tuner did earlier in the same process (seed 3 on an 8x8 grid: the
        # 20th configuration differs between a first and a second run), so each gets a fresh process.
        import multiprocessing

        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
            return fresh.submit(kernel_tuner_trace, path, arg, seed, budget, workdir, label, objective).result()
    return kernel_tuner_trace(path, arg, seed, budget, workdir, label, objective)


def run_bench(req: BenchRequest, progress: Optional[Callable[[int, int, Trace], None]] = None) -> BenchResult:
    paths = [str(Path(p).resolve()) for p in _expand(req.spaces)]
    budgets = sorted(set(req.budgets))
    if not budgets or budgets[0] < 1:
        raise BenchError("--budgets must be positive integers, e.g. 20,50,100")
    unknown = set(req.baselines) - {"kernel_tuner"}
    if unknown:
        raise BenchError(f"unknown baseline(s) {', '.join(sorted(unknown))}; give kernel_tuner, or none for kernelscout alone")
    spaces = {}
    labels = dict(zip(paths, space_labels(paths)))
    for p in paths:
        try:
            s = _space(p, labels[p], req.objective)
        except CacheFileError as exc:
            raise BenchError(f"{exc}; give cache files Kernel Tuner wrote") from None
        if not s.ok_mask.any():
            raise BenchError(f"{p}: no configuration in this space ran (all {len(s)} failed), so there is nothing to "
                             "search; leave it out")
        if s.name in spaces:
            raise BenchError(f"{p} is given twice; give each space once")
        spaces[s.name] = s
    top = budgets[-1]
    smallest = min(spaces.values(), key=len)
    if top > len(smallest):
        raise BenchError(f"--budgets {top} is more than the {len(smallest)} configurations of {smallest.name}, where a "
                         f"budget of {len(smallest)} already measures every one; give budgets up to {len(smallest)}")
    tasks = []
    for p in paths:
        for seed in range(req.seeds):
            tasks.append(("kernelscout", p, labels[p], "learned", seed))
            if req.no_predict:
                tasks.append(("kernelscout", p, labels[p], "none", seed))
            if "kernel_tuner" in req.baselines:
                tasks += [("kernel_tuner", p, labels[p], s, seed) for s in KT_STRATEGIES]
    if "kernel_tuner" in req.baselines:
        try:
            import kernel_tuner  # noqa: F401
        except ImportError:
            raise BenchError("Kernel Tuner is not installed: pip install 'kernelscout[bench]' (or pip install kernel-tuner), "
                             "or pass --baselines none") from None
        for p in paths:
            _check_kernel_tuner_can_enumerate(p, req.objective, labels[p])
    workdir = req.out or tempfile.mkdtemp(prefix="kscout-bench-")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    traces: list[Trace] = []
    try:
        if req.jobs == 1:
            for i, t in enumerate(tasks, 1):
                traces.append(_task(*t, top, workdir, req.objective))
                if progress:
                    progress(i, len(tasks), traces[-1])
        else:
            import multiprocessing

            with ProcessPoolExecutor(req.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = [pool.submit(_task, *t, top, workdir, req.objective) for t in tasks]
                for i, fut in enumerate(as_completed(futures), 1):
                    traces.append(fut.result())
                    if progress:
                        progress(i, len(tasks), traces[-1])
    finally:
        if req.out is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result = summarise(traces, spaces, budgets, req.seeds)
    return result


def _expand(paths: Sequence[str]) -> list[Path]:
    from kernelscout.sandbox.replay import resolve_space, space_files, space_hint

    out: list[Path] = []
    for p in map(resolve_space, paths):
        if p.is_dir():
            out.extend(space_files(p))
        elif p.exists():
            out.append(p)
        else:
            raise BenchError(f"{p}: no such recorded space (pass Kernel Tuner cache files, .json or .json.gz, a folder of them, "
                             f"or a recorded space's name){space_hint(p)}")
    if not out:
        raise BenchError("no recorded spaces given; pass Kernel Tuner cache files or a folder of them")
    return out
