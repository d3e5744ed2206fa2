"""Turn tunable-parameter configurations into model features, for any Kernel Tuner space.

The features are derived from the parameter values alone, never from knowing which kernel is tuned,
so that the same encoder works on spaces nobody has looked at. They encode what makes GPU tuning
spaces hard for a model fed raw values with 50 samples:

* log2 of positive values, because times scale multiplicatively with sizes;
* the power of two dividing an integer (its 2-adic valuation) and the log2 of its odd part, because
  hardware rewards multiples of warp/wavefront sizes and powers of two (48 and 64 share no simple order);
* the same for products of every pair of parameters, and log-ratios of pairs, because threads per
  block, work per thread and tile footprints are products and ratios of the raw parameters;
* one-hot columns for parameters with few values, because small integers are often codes (a method
  number) whose order means nothing, and a tree cannot isolate a middle value in one split;
* a switch (a two-valued parameter) that another parameter's value forces off is encoded as "does not
  apply" (the average of its two encodings), when the valid configurations are known: a tile stride
  when the tile is 1, or padding for a block that needs none, is no choice at all, yet encoded as
  "off" it teaches the model that "off" is slow from configurations where it was chosen;
* for Kernel Tuner's thread-block parameters (`block_size_x/y/z`, its default `block_size_names`):
  threads per block and the share of the last warp (32 lanes) and wavefront (64 lanes) that is used,
  because a block of 80 threads pays for 96 lanes on NVIDIA and 128 on AMD. No combination of log-values
  and 2-adic valuations expresses that round-up, and it is what separates good from bad block shapes
  on spaces like dedispersion (8-space pairwise accuracy 0.8452 -> 0.8523 with it, docs/surrogate_experiments.md).

Two blocks come out: ``full`` (everything, for tree ensembles) and ``compact`` (one to three columns per
parameter, for a Gaussian process whose ARD length scales cannot be fitted on hundreds of columns).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_PAIRS = 300  # beyond ~25 parameters pairwise features cost more than they help
MAX_ONEHOT = 8  # numeric parameters with at most this many values also get one-hot columns (trees only)
THREAD_BLOCK_PARAMS = ("block_size_x", "block_size_y", "block_size_z")  # Kernel Tuner's default block_size_names
LANE_WIDTHS = (32, 64)  # NVIDIA warp, AMD wavefront
_VALUATION_CAP = 12.0


def as_hashable(value: Any) -> Any:
    """A parameter value as a configuration holds it: a list (a shape, as JSON reads one back) as a tuple."""
    return tuple(as_hashable(v) for v in value) if isinstance(value, list) else value


def value_text(value: Any) -> str:
    """The text a categorical value is known by, the same for a list and the tuple a space holds."""
    return str(as_hashable(value))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, str)


def _is_positive_int(v: Any) -> bool:
    return _is_number(v) and float(v) > 0 and float(v) == math.floor(float(v)) and float(v) < 2**52


@dataclass(frozen=True)
class _Param:
    name: str
    values: tuple[Any, ...]
    numeric: bool
    positive: bool
    integer: bool

    @property
    def categorical(self) -> bool:
        return not self.numeric


@dataclass
class FeatureBlocks:
    """Feature matrices for one batch of configurations."""

    full: np.ndarray
    compact: np.ndarray


def _valuation_and_odd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xi = np.round(x).astype(np.int64)
    xi = np.where(xi > 0, xi, 1)
    low = xi & -xi
    return np.minimum(np.log2(low), _VALUATION_CAP), np.log2(xi // low)


def _lane_use(threads: np.ndarray, width: int) -> np.ndarray:
    """Share of the lanes a block occupies that do work: its threads over whole warps (wavefronts)."""
    return threads / (width * np.ceil(threads / width))


class ConfigEncoder:
    """Encodes configurations of one tuning space (its `tune_params`) as numeric feature blocks."""

    def __init__(self, tune_params: Mapping[str, Sequence[Any]], rich: bool = True,
                 valid: Sequence[Sequence[Any]] | np.ndarray | None = None) -> None:
        """`valid`: the space's valid configurations (rows in `tune_params` order), when it can be
        enumerated; from them the encoder learns which switches other parameters force off."""
        self.rich = rich
        self.param_names: tuple[str, ...] = tuple(tune_params)
        params = []
        for name, values in tune_params.items():
            vals = tuple(values)
            numeric = all(_is_number(v) or isinstance(v, bool) for v in vals)
            params.append(
                _Param(
                    name=name,
                    values=vals,
                    numeric=numeric,
                    positive=numeric and all(float(v) > 0 for v in vals),
                    integer=numeric and all(_is_positive_int(v) for v in vals),
                )
            )
        # A parameter with one value carries no information.
        self._params = [p for p in params if len(p.values) > 1]
        self._cat_index = {p.name: {value_text(v): i for i, v in enumerate(p.values)} for p in self._params if p.categorical}
        logs = [p for p in self._params if p.positive]
        ints = [p for p in self._params if p.integer]
        self._log_pairs = list(itertools.combinations([p.name for p in logs], 2))[:MAX_PAIRS]
        self._int_pairs = list(itertools.combinations([p.name for p in ints], 2))[:MAX_PAIRS]
        self._block_dims, self._block_const = self._thread_block(params)
        self._forced_off = self._forced_switches(valid) if valid is not None and len(valid) else []

    def _forced_switches(self, valid: Sequence[Sequence[Any]] | np.ndarray) -> list[tuple[int, int, float]]:
        """(switch column, column, value) for each value of another parameter under which every valid
        configuration has the switch at its lower setting (for strings, the first listed). A switch forced on (padding needs shared
        memory, so padding forces shared memory on) is a real choice and is left alone, as are the
        thread-block dimensions, whose product is the block whatever forced it."""
        raw = self.values_matrix(np.asarray(valid, dtype=object))
        rules = []
        for b, p in enumerate(self._params):
            if len(p.values) != 2 or p.name in THREAD_BLOCK_PARAMS:
                continue
            off = min(self._code(p, v) for v in p.values)
            for a in range(len(self._params)):
                if a == b:
                    continue
                for value in np.unique(raw[:, a]):
                    seen = raw[raw[:, a] == value, b]
                    if seen.size and np.all(seen == off):
                        rules.append((b, a, float(value)))
        return rules

    def _code(self, p: _Param, v: Any) -> float:
        return float(self._cat_index[p.name][value_text(v)]) if p.categorical else float(v)

    @staticmethod
    def _thread_block(params: list[_Param]) -> tuple[list[str], float]:
        """Varying thread-block parameters, and the product of the constant ones (a fixed block_size_y=8
        still multiplies the threads); none unless every one is a positive integer."""
        dims = [p for p in params if p.name in THREAD_BLOCK_PARAMS]
        if not dims or not all(p.integer for p in dims):
            return [], 1.0
        varying = [p.name for p in dims if len(p.values) > 1]
        return varying, float(np.prod([float(p.values[0]) for p in dims if len(p.values) == 1]))

    @property
    def varying_params(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._params)

    def values_matrix(self, configs: Sequence[Mapping[str, Any]] | np.ndarray) -> np.ndarray:
        """Numeric value per varying parameter; categorical values become their index in the space."""
        if isinstance(configs, np.ndarray):
            # Rows hold values in `param_names` order.
            cols = {n: configs[:, i] for i, n in enumerate(self.param_names)}
        else:
            cols = {n: [c[n] for c in configs] for n in self.varying_params}
        out = np.empty((len(configs), len(self._params)))
        for j, p in enumerate(self._params):
            col = cols[p.name]
            if p.categorical:
                index = self._cat_index[p.name]
                out[:, j] = [index.get(value_text(v), -1) for v in col]
            else:
                out[:, j] = np.asarray(col, dtype=float)
        return out

    def transform(self, configs: Sequence[Mapping[str, Any]] | np.ndarray) -> FeatureBlocks:
        raw = self.values_matrix(configs)
        blocks = self._encode(raw)
        if not self._forced_off:
            return blocks
        forced = np.zeros((raw.shape[0], len(self._params)), dtype=bool)
        for b, a, value in self._forced_off:
            forced[:, b] |= raw[:, a] == value
        # rows with the same inapplicable switches are averaged over every setting of those switches
        for pattern in np.unique(forced[forced.any(axis=1)], axis=0):
            rows = np.flatnonzero((forced == pattern).all(axis=1))
            switches = np.flatnonzero(pattern)
            encoded = []
            for setting in itertools.product(*[[self._code(self._params[b], v) for v in self._params[b].values] for b in switches]):
                alt = raw[rows].copy()
                alt[:, switches] = setting
                encoded.append(self._encode(alt))
            blocks.full[rows] = np.mean([e.full for e in encoded], axis=0)
            blocks.compact[rows] = np.mean([e.compact for e in encoded], axis=0)
        return blocks

    def _encode(self, raw: np.ndarray) -> FeatureBlocks:
        n = raw.shape[0]
        if not self.rich:
            return FeatureBlocks(full=raw, compact=raw)
        by_name = {p.name: raw[:, j] for j, p in enumerate(self._params)}
        logs: dict[str, np.ndarray] = {}
        full: list[np.ndarray] = [raw]
        compact: list[np.ndarray] = []
        for p in self._params:
            x = by_name[p.name]
            if p.categorical:
                onehot = np.stack([(x == i).astype(float) for i in range(len(p.values))], axis=1)
                full.append(onehot)
                compact.append(onehot if len(p.values) <= 12 else x[:, None])
                continue
            if p.positive:
                logs[p.name] = np.log2(x)
                compact.append(logs[p.name][:, None])
            else:
                compact.append(x[:, None])
            if p.integer:
                val, odd = _valuation_and_odd(x)
                full.extend([val[:, None], odd[:, None]])
                compact.extend([val[:, None], odd[:, None]])
            if 2 < len(p.values) <= MAX_ONEHOT:
                # A few numeric values are often codes (method 0..3), whose order means nothing.
                full.append(np.stack([(x == float(v)).astype(float) for v in p.values], axis=1))
        # Logs of single values again for the trees: extra-trees draw split points uniformly between
        # the extremes, so on a log scale they split 16|32 as readily as 128|256.
        full.extend(logs[p.name][:, None] for p in self._params if p.name in logs)
        for a, b in self._log_pairs:
            full.append((logs[a] + logs[b])[:, None])
            full.append((logs[a] - logs[b])[:, None])
        for a, b in self._int_pairs:
            val, odd = _valuation_and_odd(by_name[a] * by_name[b])
            full.extend([val[:, None], odd[:, None]])
        if self._block_dims:
            threads = self._block_const * np.prod([by_name[d] for d in self._block_dims], axis=0)
            block = [_lane_use(threads, w)[:, None] for w in LANE_WIDTHS]
            if len(self._block_dims) > 1:  # with one dimension, log2(threads) is already a column
                block.insert(0, np.log2(threads)[:, None])
            full.extend(block)
            compact.extend(block)
        full_m = np.hstack(full) if full else np.zeros((n, 0))
        compact_m = np.hstack(compact) if compact else np.zeros((n, 0))
        return FeatureBlocks(full=full_m, compact=compact_m)
