"""A device that answers `measure` from a recorded brute-forced tuning space.

Kernel Tuner cache files record every configuration of a search space as it was compiled and timed on
real hardware. Replaying them lets the search and the surrogate be developed and evaluated without a
GPU, with the same noise (times are resampled from the recorded repeats) and the same failures (a
configuration that failed on the hardware fails here too and costs a measurement).

Decisions, so that callers can rely on them:

* A configuration absent from the file is outside the valid space. `ReplayDevice.measure` answers it
  with ``status=invalid_problem`` and ``charged=False``: Kernel Tuner never compiles a configuration
  that violates the restrictions, so no hardware time would have been spent on it.
* ``CompilationFailedConfig`` maps to ``compile_error``, ``RuntimeFailedConfig`` (and any other
  unknown marker string, or a non-finite/1e20 time as older caches wrote) to ``runtime_error``; both
  are charged. ``InvalidConfig`` records are treated as outside the space. A time of 0 or less cannot be
  a kernel's and is replayed as a failure too, which the space's notes say.
* A record without a numeric ``time`` but with numeric ``times`` (or a ``time`` written as a list of them)
  is replayed from their mean, as Kernel Tuner computes ``time``.
* A parameter whose values are lists (a shape) is read with tuples, so configurations can be keys.
* ``runtime_ms`` is the median of a bootstrap resample of the recorded repeats, because a real harness
  reports the median of its own repeats; a single drawn repeat would be noisier than any real measure.
* The device keeps no budget: the harness's ledger decides what may be measured.
* A T4 results file (as Kernel Tuner's `store_output_file` writes it) is read as the cache it describes
  (sandbox/t4_results.py).
* A space tuned for a throughput (GFLOP/s, ...) whose work per call differs is replayed with each configuration's
  time for equal work, so that minimising time follows the objective (sandbox/objectives.py).
"""

from __future__ import annotations

import hashlib
import gzip
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kernelscout.sandbox.objectives import OBJECTIVE_CHOICES, THROUGHPUTS, equal_work_factors, objective_named
from kernelscout.sandbox.t4_results import T4_KEY, T4_METADATA, is_t4_metadata, is_t4_results, starts_as_t4_metadata, t4_as_cache
from kernelscout.tools.schema import Measurement, MeasureStatus, TimingStats
from kernelscout.tools.surrogates.features import as_hashable, value_text

ParamValue = Any
Config = Mapping[str, ParamValue]

_FAILURE_STATUS = {
    "CompilationFailedConfig": MeasureStatus.compile_error,
    "RuntimeFailedConfig": MeasureStatus.runtime_error,
}
_OUTSIDE_MARKERS = {"InvalidConfig"}
_FAILED_TIME = 1e20  # what Kernel Tuner wrote for failures before it used marker strings


CUT_KEY = "__kscout_cut_records__"  # set by read_cache_json: how many partly written last lines it dropped
_MAX_CUT_LINES = 3


def _opener(path: Path) -> Any:
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"  # by content: a gzip file named .json is still gzip
    return gzip.open if gzipped else open


def space_files(folder: Path) -> list[Path]:
    """The recorded spaces a folder stands for: its .json and .json.gz files, less the T4 metadata files that
    Kernel Tuner writes beside its results. A folder with none of its own stands for those of its subfolders:
    the benchmark hub's own layout is `cachefiles/<kernel>/<GPU>.json.gz`."""
    out = _own_space_files(folder)
    if not out:  # one level down only: a folder of anything else (a repository, a home folder) is not walked
        for sub in sorted(q for q in folder.iterdir() if q.is_dir() and not q.name.startswith((".", "_"))):
            out.extend(kernel_folder_spaces(sub))
    return out


def kernel_folder_spaces(folder: Path) -> list[Path]:
    """The recorded spaces in one kernel's folder of the hub's layout. Any other JSON there (an earlier run's, a
    tool's output) is not taken for one: a plain .json counts only when its opening names Kernel Tuner's
    `tune_params` or T4's `results`."""
    return _own_space_files(folder, in_kernel_folder=True)


def _own_space_files(folder: Path, in_kernel_folder: bool = False) -> list[Path]:
    out = []
    for q in sorted(folder.iterdir()):
        if not (q.is_file() and q.name.endswith((".json", ".json.gz"))):
            continue
        if in_kernel_folder and q.name.startswith((".", "_")):
            continue
        head = read_head(q, 4096)
        if starts_as_t4_metadata(head) and _is_t4_metadata_file(q):
            continue
        if in_kernel_folder and q.name.endswith(".json") and not any(k in head for k in ('"tune_params"', '"results"')):
            continue
        out.append(q)
    return out


def read_head(path: Path, chars: int) -> str:
    """A file's first characters, gzipped or not; "" where it cannot be read (loading it says why)."""
    try:
        with _opener(path)(path, "rt", encoding="utf-8") as fh:
            return fh.read(chars)
    except (OSError, EOFError, UnicodeDecodeError):
        return ""


def _is_t4_metadata_file(path: Path) -> bool:
    """Parsed whole to be sure: a results file may also begin with its metadata (Kernel Tuner's does not)."""
    try:
        with _opener(path)(path, "rt", encoding="utf-8") as fh:
            return is_t4_metadata(json.load(fh))
    except (OSError, EOFError, UnicodeDecodeError, ValueError):
        return False  # not metadata for sure: loading it says what it is


def read_cache_json(path: Path) -> dict[str, Any]:
    """Parse a cache, also one left unterminated by an interrupted Kernel Tuner run, even one cut off in the
    middle of its last record (which is then dropped, and counted under CUT_KEY); a T4 results file comes back
    as the cache it describes."""
    with _opener(path)(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        first_error = exc
    else:
        if is_t4_metadata(doc):
            raise ValueError(f"{T4_METADATA}; give the results file written beside it")
        return t4_as_cache(doc) if is_t4_results(doc) else doc
    # Kernel Tuner appends records as it goes, one per line, and only closes the braces at the end.
    lines = text.rstrip().splitlines()
    for cut in range(min(_MAX_CUT_LINES, len(lines) - 1) + 1):
        kept = "\n".join(lines[: len(lines) - cut]).rstrip().rstrip(",")
        try:
            raw = json.loads(kept + "}}")
        except json.JSONDecodeError:
            continue
        if cut and isinstance(raw, dict):
            raw[CUT_KEY] = cut
        return raw
    raise first_error


def _mean_of_numbers(values: Any) -> Optional[float]:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)] if isinstance(values, list) else []
    return sum(numbers) / len(numbers) if numbers else None


def _number_or_marker(t: Any) -> Any:
    """A record's time as written: numbers as they are, a number written as text ("1.25", "NaN") as
    that number, anything else (a failure marker, a missing time) unchanged."""
    if isinstance(t, str) and t not in _FAILURE_STATUS:
        try:
            return float(t)
        except ValueError:
            return t
    return t


class CacheFileError(ValueError):
    """A file given as a recorded space that is not a usable Kernel Tuner cache; `reason` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: not a usable Kernel Tuner cache ({reason})")
        self.path, self.reason = path, reason

    def __reduce__(self):  # raised in a benchmark's worker process, it must unpickle in the parent
        return type(self), (self.path, self.reason)


@dataclass(frozen=True, eq=False)
class ReplaySpace:
    """One kernel's brute-forced space on one device, as recorded in a Kernel Tuner cache."""

    path: Path
    kernel_name: str
    device_name: str
    param_names: tuple[str, ...]
    param_values: dict[str, tuple[ParamValue, ...]]
    configs: tuple[tuple[ParamValue, ...], ...]
    times: np.ndarray  # the file's `time` (mean of repeats, ms) per config; NaN where it failed
    repeats: tuple[np.ndarray, ...]
    failures: dict[int, MeasureStatus]  # config index -> how it failed
    problem_size: Any = None
    objective: str = "time"  # the header's; followed where it is a throughput every timed record gives (objectives.py)
    work_spread: float = 1.0  # where followed: the largest work per call over the smallest; above 1, times are for equal work
    lacking_objective: int = 0  # timed records that do not give the header's throughput objective
    undeclared: tuple[str, ...] = ()  # "name=value" of record values missing from the header's tune_params
    nonpositive: int = 0  # records whose time was 0 or less, replayed as failures
    cut_records: int = 0  # partly written last lines of an interrupted run, dropped
    t4: Optional[dict[str, int]] = None  # read from T4 results: how many timed out or gave wrong results there
    label: str = ""  # the name given beside other spaces of the same file name (`space_labels`); the stem otherwise
    by_time: bool = False  # asked for `--objective time`: the recorded time per call is minimised, whatever the file's objective
    _index: dict[tuple[str, ...], int] = field(default_factory=dict, repr=False, compare=False)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def content_sha(self) -> str:
        """sha256 of what the replay reads: parameters, configurations, times, repeats and failures.

        Measurement keys, and so the noise each replayed measurement draws, hang on it rather than on
        the file's path: the same space replays the same way wherever it lies, under whatever name or
        compression, so a benchmark reruns to the same table on another machine. The keys also name the device,
        and a cache that leaves its device empty (convolution_MI250X, a T4 file) is known by its file's name, so
        renaming such a file changes its noise."""
        if "sha" not in self._memo:
            h = hashlib.sha256()
            h.update(json.dumps([list(self.param_names), [[value_text(v) for v in c] for c in self.configs]]).encode())
            h.update(np.ascontiguousarray(self.times, dtype=float).tobytes())
            for r in self.repeats:
                h.update(np.ascontiguousarray(r, dtype=float).tobytes() + b"|")
            h.update(json.dumps(sorted((i, s.value) for i, s in self.failures.items())).encode())
            self._memo["sha"] = h.hexdigest()
        return self._memo["sha"]

    @property
    def notes(self) -> list[str]:
        """What the loader accepted but a user should know: the file says something it does not replay."""
        out = []
        said = self.label or self.path.name  # a label tells apart files of the same name (`space_labels`)
        if self.by_time and self.objective != "time":
            out.append(f"{said}: its objective is {self.objective!r}; kernelscout minimises the recorded time per "
                       "call, as --objective time asks")
        elif self.work_spread > 1:
            out.append(f"{said}: its objective is {self.objective!r}, and the work per call differs between "
                       f"configurations (up to {self.work_spread:.2f}x): kernelscout searches for the highest {self.objective}, "
                       "replaying each configuration's time for the same work (the median configuration's), so its "
                       f"speedups are ratios of {self.objective}")
        elif self.lacking_objective:
            out.append(f"{said}: its objective is {self.objective!r}, which {self.lacking_objective} timed record(s) "
                       "do not give; kernelscout minimises the recorded time instead")
        elif "," in self.objective:  # tuned for several (objective_named)
            out.append(f"{said}: its objectives are {self.objective}; kernelscout minimises the recorded time alone")
        elif not self.follows_objective:
            out.append(f"{said}: its objective is {self.objective!r}; kernelscout minimises the recorded time instead")
        if self.undeclared:
            shown = ", ".join(self.undeclared[:3]) + (", ..." if len(self.undeclared) > 3 else "")
            out.append(f"{said}: records hold parameter values its tune_params do not list ({shown}); "
                       "they are searched as recorded")
        if self.nonpositive:
            out.append(f"{said}: {self.nonpositive} record(s) have a time of 0 or less, which no kernel takes; "
                       "they are replayed as failed runs")
        if self.t4 and (self.t4.get("timeouts") or self.t4.get("wrong_results")):
            out.append(f"{said}: T4 results; {self.t4.get('timeouts', 0)} timed out and {self.t4.get('wrong_results', 0)} "
                       "gave wrong results there, which are replayed as failed runs")
        if self.cut_records:
            out.append(f"{said}: the file ends in a partly written record (an interrupted run?), which was left out")
        return out

    @property
    def follows_objective(self) -> bool:
        """Whether minimising the replayed time optimises the objective the file names: it is time, or a
        throughput that every timed record gives (then the times are for equal work where the work differs)."""
        return self.objective == "time" or (self.objective in THROUGHPUTS and not self.lacking_objective and not self.by_time)

    @property
    def objective_choice(self) -> str:
        """What `load` was asked (`OBJECTIVE_CHOICES`), for loading the same space again elsewhere."""
        return "time" if self.by_time else "file"

    @classmethod
    def load(cls, path: str | Path, objective: str = "file") -> ReplaySpace:
        """Read a Kernel Tuner cache file (.json or .json.gz). Anything that is not one (missing,
        unreadable, not JSON, no tune_params, no configurations) is a `CacheFileError` saying why, so
        every command can turn it into the same usage error.

        `objective`: "file" follows the objective the file names where kscout can (objectives.py); "time"
        minimises the recorded time per call whatever it names (a throughput-tuned space's time then
        mixes configurations that do different work per call, which is what a user asking for it wants)."""
        if objective not in OBJECTIVE_CHOICES:
            raise ValueError(f"objective {objective!r}: give one of {', '.join(OBJECTIVE_CHOICES)}")
        path = Path(path)
        try:
            return cls._load(path, by_time=objective == "time")
        except (ValueError, KeyError, TypeError, AttributeError, OSError, EOFError) as exc:
            detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise CacheFileError(path, detail) from exc

    @classmethod
    def _load(cls, path: Path, by_time: bool = False) -> ReplaySpace:
        raw = read_cache_json(path)
        if not isinstance(raw, Mapping):
            raise ValueError(f"the file holds a JSON {type(raw).__name__}, where a cache is an object with tune_params and cache")
        cut = int(raw.pop(CUT_KEY, 0))
        t4 = raw.pop(T4_KEY, None)
        params = raw["tune_params"]
        if not isinstance(params, Mapping):
            raise ValueError(f"tune_params is a JSON {type(params).__name__}, where a cache maps each parameter to its values")
        names = tuple(raw.get("tune_params_keys") or params.keys())
        for n in names:
            if n not in params:
                raise ValueError(f"tune_params_keys names {n!r}, which tune_params does not define")
            if not isinstance(params[n], list):
                raise ValueError(f"tune_params[{n!r}] is {params[n]!r}, where a cache lists each parameter's values")
        values = {n: tuple(as_hashable(v) for v in params[n]) for n in names}
        # Keys in the file are the str() of each value joined by ","; map text back to the typed value.
        by_text = [{value_text(v): v for v in values[n]} for n in names]
        configs: list[tuple[ParamValue, ...]] = []
        times: list[float] = []
        repeats: list[np.ndarray] = []
        failures: dict[int, MeasureStatus] = {}
        untimed = 0  # records with neither a time nor a failure marker
        nonpositive = 0
        unreadable: list[str] = []  # keys whose configuration could not be read
        outside = 0  # records marked as outside the space's restrictions
        objective = objective_named(raw.get("objective"))
        throughput: dict[int, float] = {}  # configuration index -> the objective's value, where it is a throughput
        is_throughput = objective in THROUGHPUTS
        for key, record in raw["cache"].items():
            config = cls._parse_config(key, record, names, by_text)
            if config is None:
                unreadable.append(key)
                continue
            t = record.get("time") if isinstance(record, Mapping) else None
            error = record.get("__error__") if isinstance(record, Mapping) else None
            if isinstance(error, str) and error:  # how Kernel Tuner 1.5 writes a failure: the marker there, no time
                t = error
            if isinstance(t, str) and t in _OUTSIDE_MARKERS:
                outside += 1
                continue
            t = _number_or_marker(t)
            # Kernel Tuner's time is the mean of the repeats it recorded: read from them where it is a list or missing
            if isinstance(t, list):
                t = _mean_of_numbers(t)
            elif t is None and isinstance(record, Mapping):
                t = _mean_of_numbers(record.get("times"))
            untimed += t is None or isinstance(t, (bool, dict))
            nonpositive += isinstance(t, (int, float)) and not isinstance(t, bool) and t <= 0
            status = cls._failure_of(t)
            idx = len(configs)
            configs.append(config)
            if status is not None:
                failures[idx] = status
                times.append(math.nan)
                repeats.append(np.empty(0))
                continue
            reps = record.get("times")
            reps_arr = (
                np.asarray([r for r in reps if isinstance(r, (int, float))], dtype=float) if reps else np.empty(0)
            )
            reps_arr = reps_arr[np.isfinite(reps_arr) & (reps_arr > 0)]
            times.append(float(t))
            repeats.append(reps_arr if reps_arr.size else np.asarray([float(t)]))
            if is_throughput:
                value = _number_or_marker(record.get(objective))
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
                    throughput[idx] = float(value)
        if not configs and unreadable:
            raise ValueError(
                f"none of the cache's {len(unreadable)} records could be read as a configuration of its tune_params "
                f"({', '.join(names)}): a record needs those fields, or a key of their values joined by ',' "
                f"(the first key is {unreadable[0]!r})")
        if not configs and outside:
            raise ValueError(f"no configurations in the cache: all {outside} of its records are marked "
                             f"{' or '.join(sorted(_OUTSIDE_MARKERS))}, that is outside the space's restrictions (Kernel Tuner "
                             "never ran them), so there is nothing to replay")
        if not configs:
            raise ValueError("no configurations in the cache")
        if untimed == len(configs):
            other = f"; its objective is {objective!r}, and kernelscout replays times" if objective != "time" else ""
            raise ValueError(f"no record has a numeric \"time\" (ms){other}")
        timed = [i for i in range(len(configs)) if i not in failures]
        lacking = sum(i not in throughput for i in timed) if is_throughput else 0
        spread = 1.0
        if is_throughput and timed and not lacking and not by_time:
            factors, found = equal_work_factors(np.asarray([times[i] for i in timed]), np.asarray([throughput[i] for i in timed]))
            if factors is not None:
                spread = found
                for i, f in zip(timed, factors):
                    times[i] *= float(f)
                    repeats[i] = repeats[i] * float(f)
        space = cls(
            path=path,
            kernel_name=str(raw.get("kernel_name", "")),
            device_name=str(raw.get("device_name", "")),
            param_names=names,
            param_values=values,
            configs=tuple(configs),
            times=np.asarray(times, dtype=float),
            repeats=tuple(repeats),
            failures=failures,
            problem_size=raw.get("problem_size"),
            objective=objective,
            work_spread=spread,
            lacking_objective=lacking,
            nonpositive=nonpositive,
            cut_records=cut,
            t4=t4,
            by_time=by_time,
            undeclared=tuple(sorted({f"{n}={c[j]!r}" for c in configs for j, n in enumerate(names)
                                     if value_text(c[j]) not in by_text[j]})),
        )
        space._index.update({tuple(value_text(v) for v in c): i for i, c in enumerate(configs)})
        return space

    @staticmethod
    def _parse_config(
        key: str, record: Any, names: Sequence[str], by_text: Sequence[dict[str, ParamValue]]
    ) -> Optional[tuple[ParamValue, ...]]:
        if isinstance(record, Mapping) and all(n in record for n in names):
            return tuple(as_hashable(record[n]) for n in names)
        parts = key.split(",")
        if len(parts) != len(names):
            return None
        try:
            return tuple(lookup[p] for lookup, p in zip(by_text, parts))
        except KeyError:
            return None

    @staticmethod
    def _failure_of(t: Any) -> Optional[MeasureStatus]:
        if isinstance(t, str):
            return _FAILURE_STATUS.get(t, MeasureStatus.runtime_error)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t >= _FAILED_TIME or t <= 0:
            return MeasureStatus.runtime_error
        return None

    # --- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.configs)

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``convolution_A100``, or the label it was given to tell it from another
        space's file of the same name (``hotspot/A100``)."""
        return self.label or space_name(self.path)

    def named(self, label: str) -> ReplaySpace:
        """The same space under another name (what it replays, and its measurement keys, are unchanged)."""
        return self if label in ("", self.name) else replace(self, label=label)

    @property
    def device_label(self) -> str:
        """Short device label; some caches leave ``device_name`` empty, so fall back to the file name (the stem
        always, not a label: measurement keys hang on it)."""
        return self.device_name.strip() or space_name(self.path)

    @property
    def ok_mask(self) -> np.ndarray:
        return np.isfinite(self.times)

    @cached_property
    def median_times(self) -> np.ndarray:
        """Median of the recorded repeats, the quantity `ReplayDevice.measure` estimates; NaN if failed."""
        return np.asarray([np.median(r) if r.size else math.nan for r in self.repeats])

    @property
    def best_index(self) -> int:
        return int(np.nanargmin(self.median_times))

    @property
    def best_time(self) -> float:
        """Best median time in ms over the space."""
        return float(self.median_times[self.best_index])

    def config(self, index: int) -> dict[str, ParamValue]:
        return dict(zip(self.param_names, self.configs[index]))

    def index_of(self, config: Config | Sequence[ParamValue]) -> Optional[int]:
        """Index of a config given as a dict or a value sequence; None when outside the space."""
        if isinstance(config, Mapping):
            if set(config) != set(self.param_names):
                return None
            values = [config[n] for n in self.param_names]
        else:
            values = list(config)
            if len(values) != len(self.param_names):
                return None
        return self._index.get(tuple(value_text(v) for v in values))

    def same_kernel(self, other: ReplaySpace) -> bool:
        """Whether two spaces tune the same kernel, so one can warm-start a model of the other. A file that does not
        name its kernel (T4 results never do) is judged by its parameters alone."""
        named = self.kernel_name and other.kernel_name
        return (not named or self.kernel_name == other.kernel_name) and set(self.param_names) == set(other.param_names)


class ReplayDevice:
    """Answers `measure` from a `ReplaySpace` as the hardware it was recorded on would have."""

    def __init__(self, space: ReplaySpace, name: Optional[str] = None) -> None:
        self.space = space
        self.device = f"replay:{name or space.device_label}"

    def measure(
        self,
        config: Config | Sequence[ParamValue],
        rng: np.random.Generator,
        reference: Optional[Config | Sequence[ParamValue]] = None,
    ) -> Measurement:
        """Measure one configuration; with `reference`, also time it in the same session for a speedup."""
        idx = self.space.index_of(config)
        if idx is None:
            return Measurement(
                status=MeasureStatus.invalid_problem,
                charged=False,
                device=self.device,
                message=f"configuration {dict(config) if isinstance(config, Mapping) else list(config)} "
                f"is outside the recorded space of {self.space.name}",
            )
        failure = self.space.failures.get(idx)
        if failure is not None:
            return Measurement(
                status=failure,
                charged=True,
                device=self.device,
                message=f"recorded as {failure.value} on {self.space.device_label}",
                checks=["replay"],
            )
        cand = self._timing(idx, rng)
        result = Measurement(
            status=MeasureStatus.ok,
            correct=True,
            runtime_ms=cand.median_ms,
            timing_valid=True,
            charged=True,
            device=self.device,
            candidate_timing=cand,
            checks=["replay"],
        )
        if reference is not None:
            ref_idx = self.space.index_of(reference)
            if ref_idx is None or ref_idx in self.space.failures:
                result.warnings.append("reference is outside the space or failed; no speedup reported")
            else:
                ref = self._timing(ref_idx, rng)
                result.reference_timing = ref
                result.ref_runtime_ms = ref.median_ms
                result.speedup = ref.median_ms / cand.median_ms
        return result

    def _timing(self, idx: int, rng: np.random.Generator) -> TimingStats:
        reps = self.space.repeats[idx]
        sample = rng.choice(reps, size=reps.size, replace=True)
        q25, q50, q75 = np.percentile(sample, [25, 50, 75])
        return TimingStats(
            median_ms=float(q50),
            iqr_ms=float(q75 - q25),
            mean_ms=float(sample.mean()),
            min_ms=float(sample.min()),
            repeats=int(sample.size),
        )


def recorded_spaces_dir() -> Path:
    """The folder of recorded tuning spaces that the tests and benchmarks run on.

    The data are not shipped in the package (they are the benchmark hub's, under their own licence), so
    they are looked for where a checkout usually has them: `KSCOUT_BENCHMARK_HUB` if set (used as given,
    so a wrong path shows up as missing data rather than silently falling back), else
    `shared/data/benchmark_hub` next to the checkout or inside it, else `/work/shared/data/benchmark_hub`.
    The first of those that exists is returned, or the first candidate when none does, so a caller's
    "not found" message can name a real place.
    """
    env = os.environ.get("KSCOUT_BENCHMARK_HUB")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo.parent / "shared" / "data" / "benchmark_hub", repo / "shared" / "data" / "benchmark_hub",
                  Path("/work/shared/data/benchmark_hub")]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def space_name(path: str | Path) -> str:
    """A recorded space's bare name: its file name without `.json` / `.json.gz`."""
    return Path(path).name.split(".json")[0]


def resolve_space(arg: str | Path) -> Path:
    """A recorded space's file from what a user typed: a path as given, or a bare name such as
    `convolution_A100` looked up as `NAME.json.gz` / `NAME.json` in `recorded_spaces_dir()`.

    Why: the tables and docs name spaces by their bare names, and typing the data folder's path each time
    is the chore users skip first. A path that exists always wins, so a local file of the same name is
    never shadowed; anything not found is returned unchanged for the caller's own "no such" message.
    """
    path = Path(arg)
    if path.exists() or len(path.parts) != 1 or path.name.endswith((".json", ".json.gz")):
        return path
    hub = recorded_spaces_dir()
    for suffix in (".json.gz", ".json"):
        if (hub / f"{path.name}{suffix}").is_file():
            return hub / f"{path.name}{suffix}"
    return path


def recorded_space_names() -> list[str]:
    """The bare names `resolve_space` knows, for "did you mean" hints; empty when the data are absent."""
    hub = recorded_spaces_dir()
    if not hub.is_dir():
        return []
    return sorted(space_name(q) for q in hub.iterdir() if q.name.endswith((".json", ".json.gz")))


def space_hint(arg: str | Path) -> str:
    """The tail of a "no such recorded space" message: the closest bare name, or the names there are."""
    import difflib

    names = recorded_space_names()
    if not names:
        return ""
    close = difflib.get_close_matches(space_name(arg), names, n=1)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; recorded spaces by name: {', '.join(names)}"


def space_labels(paths: Sequence[str | Path]) -> list[str]:
    """Names for spaces given together: each file's stem, with as many of its folders in front as it takes to
    tell apart files of the same name (`hotspot/A100` and `gemm/A100` in the hub's own layout). Results are
    kept by name, and renaming a file was the only way out before. The same file given twice keeps one name
    for both, which the caller refuses."""
    stems = [space_name(p) for p in paths]
    folders = [Path(p).resolve().parent.parts[::-1] for p in paths]  # nearest first
    depth = [0] * len(stems)
    while True:
        labels = ["/".join([*reversed(folders[i][:depth[i]]), stems[i]]) for i in range(len(stems))]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1 and depth[i] < len(folders[i])]
        if not clashing:
            return labels
        for i in clashing:
            depth[i] += 1


def load_spaces(paths: Sequence[str | Path], objective: str = "file") -> list[ReplaySpace]:
    """Load several caches; a folder stands for every cache file in it. Each is named by `space_labels`."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(space_files(p))
        else:
            files.append(p)
    return [ReplaySpace.load(f, objective).named(label) for f, label in zip(files, space_labels(files))]
