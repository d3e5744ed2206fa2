"""Read a T4 results file (the community's auto-tuning output schema) as a Kernel Tuner cache.

Kernel Tuner writes T4 with `store_output_file` (a schema meant to be shared between tuners), so a
brute-forced space often exists only in that form. It holds the same facts as a cache, laid out per
result: the configuration, whether it ran (`invalidity`), the repeats (`times.runtimes`) and the named
measurements. Turning it into the cache layout at the point of reading lets the replay loader, and
the Kernel Tuner baseline that reads the same file, stay one code path.

Mapping, so that a user can predict what is replayed:

* `invalidity` "correct" with `correctness` not 0: timed, from the measurement named ``time``, or the
  mean of `times.runtimes` where there is none.
* "compile": ``CompilationFailedConfig``; "runtime", "timeout", "correctness", or a correctness of 0:
  ``RuntimeFailedConfig`` (a charged failed run; the space's notes count the timeouts and wrong results).
* "constraints": ``InvalidConfig``, outside the space.
* Times are converted to milliseconds from the measurement's own unit, else the file's
  `metadata.timeunit`, else taken as milliseconds (Kernel Tuner's).
* A parameter's values are those the results hold, in numeric order where all are numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

T4_KEY = "__kscout_t4__"  # set on a converted document: what the T4 file said that a cache cannot, for the space's notes

_MS_PER_UNIT = {
    "ms": 1.0, "millisecond": 1.0, "milliseconds": 1.0,
    "s": 1e3, "sec": 1e3, "second": 1e3, "seconds": 1e3,
    "us": 1e-3, "µs": 1e-3, "microsecond": 1e-3, "microseconds": 1e-3,
    "ns": 1e-6, "nanosecond": 1e-6, "nanoseconds": 1e-6,
}
_FAILED_AS = {"compile": "CompilationFailedConfig", "runtime": "RuntimeFailedConfig", "timeout": "RuntimeFailedConfig",
              "correctness": "RuntimeFailedConfig", "constraints": "InvalidConfig"}
# Kernel Tuner's cache field: the T4 names for it (Kernel Tuner writes "compilation"; the schema spells "compilation_time")
_TIMING_FIELDS = {"compile_time": ("compilation", "compilation_time"), "benchmark_time": ("benchmark",),
                  "framework_time": ("framework",), "strategy_time": ("search_algorithm",), "verification_time": ("validation",)}


T4_METADATA = "a T4 metadata file (the machine a tuning ran on), not its results"


def is_t4_results(doc: Any) -> bool:
    return isinstance(doc, Mapping) and isinstance(doc.get("results"), list) and "cache" not in doc


def is_t4_metadata(doc: Any) -> bool:
    return isinstance(doc, Mapping) and "schema_version" in doc and "metadata" in doc and not {"results", "cache"} & set(doc)


def starts_as_t4_metadata(head: str) -> bool:
    """Whether a file's first characters open a T4 metadata document (its first key is "metadata"), so that a folder
    of tuning output can be listed without parsing each file whole."""
    return head.lstrip().startswith("{") and head.lstrip()[1:].lstrip().startswith('"metadata"')


def _ms_factor(unit: Any, default: float) -> float:
    if not isinstance(unit, str) or not unit.strip():
        return default
    factor = _MS_PER_UNIT.get(unit.strip().lower())
    if factor is None:
        raise ValueError(f"a time unit of {unit!r}, which is not one of {', '.join(sorted(set(_MS_PER_UNIT)))}")
    return factor


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _ordered(values: list[Any]) -> list[Any]:
    if all(_number(v) is not None for v in values):
        return sorted(values)
    return values  # strings, shapes, mixed: as first seen


def t4_as_cache(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The T4 results document as a Kernel Tuner cache (header, `tune_params`, `cache`)."""
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
    default = _ms_factor(metadata.get("timeunit"), 1.0)
    results = [r for r in doc["results"] if isinstance(r, Mapping)]
    if not results:
        raise ValueError("a T4 results file with no results")
    names: list[str] = []
    for r in results:
        config = r.get("configuration")
        if not isinstance(config, Mapping):
            raise ValueError("a T4 result without a configuration object")
        names += [n for n in config if n not in names]
    seen: dict[str, list[Any]] = {n: [] for n in names}
    cache: dict[str, Any] = {}
    objectives: list[str] = []
    timeouts = wrong = 0
    for r in results:
        config = r["configuration"]
        missing = [n for n in names if n not in config]
        if missing:
            raise ValueError(f"a T4 result whose configuration lacks {', '.join(missing)}, which other results set")
        for n in names:
            if config[n] not in seen[n]:
                seen[n].append(config[n])
        objectives += [o for o in (r.get("objectives") or []) if isinstance(o, str) and o not in objectives]
        times = r.get("times") if isinstance(r.get("times"), Mapping) else {}
        record: dict[str, Any] = {n: config[n] for n in names}
        record.update({field: next((x for x in map(_number, map(times.get, spellings)) if x is not None), 0.0)
                       for field, spellings in _TIMING_FIELDS.items()})
        invalidity = str(r.get("invalidity", "correct"))
        if invalidity == "correct" and r.get("correctness") == 0:
            invalidity = "correctness"
        if invalidity != "correct":
            if invalidity not in _FAILED_AS:
                raise ValueError(f"a T4 result with invalidity {invalidity!r}, which the T4 schema does not define")
            timeouts += invalidity == "timeout"
            wrong += invalidity == "correctness"
            record["time"] = _FAILED_AS[invalidity]
        else:
            # the measurements other than time (GFLOP/s, ...) under their names, as a cache records them: an objective
            # may be one (time itself is read below, in its unit)
            record.update({m["name"]: m["value"] for m in r.get("measurements") or [] if isinstance(m, Mapping)
                           and isinstance(m.get("name"), str) and m["name"] != "time" and m["name"] not in record
                           and _number(m.get("value")) is not None})
            runtimes = [x * default for x in (times.get("runtimes") or []) if _number(x) is not None]
            measured = next((m for m in r.get("measurements") or [] if isinstance(m, Mapping) and m.get("name") == "time"), None)
            value = measured.get("value") if measured else None
            if isinstance(value, list):  # the schema allows an array: the repeats themselves
                factor = _ms_factor(measured.get("unit"), default)
                runtimes = runtimes or [x * factor for x in value if _number(x) is not None]
                value = None
            value = _number(value)
            if value is not None:
                record["time"] = value * _ms_factor(measured.get("unit"), default)
            elif runtimes:
                record["time"] = sum(runtimes) / len(runtimes)
            if runtimes:
                record["times"] = runtimes
        cache[",".join(str(config[n]) for n in names)] = record
    return {  # no device, kernel or problem size: T4 results do not say, and the loader has its defaults
        "tune_params_keys": names,
        "tune_params": {n: _ordered(seen[n]) for n in names},
        "objective": objectives[0] if len(objectives) == 1 else objectives or "time",  # several: as a cache's list reads
        "cache": cache,
        T4_KEY: {"timeouts": timeouts, "wrong_results": wrong},
    }
