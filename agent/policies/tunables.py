"""The tunable-space convention: a candidate declares the knobs it can be run with, and the tuner turns them.

A candidate module declares its space at module level, next to one plain assignment per knob
holding the value it currently uses::

    TUNABLE = {"BLOCK_SIZE": [64, 128, 256, 512], "num_warps": [2, 4, 8]}
    TUNABLE_RESTRICTIONS = ["BLOCK_SIZE * num_warps <= 2048"]   # optional
    BLOCK_SIZE = 128
    num_warps = 4

Everything here works on the source text only. Candidate code is untrusted and runs only in the
sandbox, so the space is read with ``ast`` (never imported or executed), restrictions are
evaluated by a tiny whitelisting evaluator (never ``eval``), and a new configuration is written
by replacing just the value text of those assignments, so the rest of the file stays byte-identical
and two configurations differ exactly where their knobs do. See docs/tuner.md.
"""

from __future__ import annotations

import ast
import difflib
import functools
import itertools
import math
import operator
import random
from collections.abc import Iterator
from typing import Any, Callable, Union

from pydantic import BaseModel, Field

SPACE_NAME = "TUNABLE"
RESTRICTIONS_NAME = "TUNABLE_RESTRICTIONS"

Value = Union[bool, int, float, str]
Config = dict[str, Value]

MAX_RESTRICTION_CHARS = 500
MAX_RESTRICTION_NODES = 200
MAX_ENUMERATE = 200_000  # configurations scanned before sampling gives up on a full enumeration


class TunableError(ValueError):
    """A declaration, restriction or configuration that breaks the convention; the message says how."""


class TunableSpace(BaseModel):
    """A candidate's declared space: knob names in declaration order, their values, and where it is now."""

    names: list[str]
    values: dict[str, list[Value]]
    current: Config
    restrictions: list[str] = Field(default_factory=list)

    @property
    def size(self) -> int:
        """Configurations before restrictions are applied."""
        return math.prod(len(self.values[n]) for n in self.names)

    def is_valid(self, config: Config) -> bool:
        """Every knob set to one of its declared values, and every restriction true."""
        if set(config) != set(self.names):
            return False
        if any(not _member(config[n], self.values[n]) for n in self.names):
            return False
        return all(evaluate_restriction(r, config) for r in self.restrictions)

    def key(self, config: Config) -> tuple:
        """A hashable, order-independent identity of a configuration."""
        return tuple((n, type(config[n]).__name__, config[n]) for n in self.names)


# -- reading the declaration ------------------------------------------------------------------

def declares_space(source: str) -> bool:
    """Cheap check used before a full parse: does the module assign TUNABLE at top level?"""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(_assigned_name(node) == SPACE_NAME for node in tree.body)


def parse_space(source: str) -> TunableSpace:
    """Read the declared space statically. Raises TunableError if the module breaks the convention."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TunableError(f"the candidate does not parse: {exc.msg} (line {exc.lineno})") from None
    assignments = _top_level_assignments(tree)
    if SPACE_NAME not in assignments:
        raise TunableError(f"the module assigns no {SPACE_NAME} at top level")
    values = _literal(assignments[SPACE_NAME][0], SPACE_NAME)
    if not isinstance(values, dict) or not values:
        raise TunableError(f"{SPACE_NAME} must be a non-empty dict literal mapping knob names to lists of values")
    names: list[str] = []
    space: dict[str, list[Value]] = {}
    for name, options in values.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TunableError(f"{SPACE_NAME} key {name!r} is not a Python identifier")
        if not isinstance(options, (list, tuple)) or not options:
            raise TunableError(f"{SPACE_NAME}[{name!r}] must be a non-empty list of values")
        for v in options:
            if not isinstance(v, (bool, int, float, str)):
                raise TunableError(f"{SPACE_NAME}[{name!r}] holds {v!r}; values must be numbers, strings or booleans")
        if len({(type(v), v) for v in options}) != len(options):
            raise TunableError(f"{SPACE_NAME}[{name!r}] lists a value twice")
        names.append(name)
        space[name] = list(options)
    current: Config = {}
    for name in names:
        if name not in assignments:
            near = difflib.get_close_matches(name, [a for a in assignments if a not in space and a.isidentifier()], n=1)
            fix = (f"is it {near[0]}, which is assigned? name the knob the same in both places" if near
                   else f"add `{name} = {space[name][0]!r}`")
            raise TunableError(f"{name} is declared in {SPACE_NAME} but never assigned at top level ({fix})")
        node, count = assignments[name]
        if count > 1:
            raise TunableError(f"{name} is assigned {count} times at top level; the tuner rewrites exactly one assignment")
        value = _literal(node, name)
        if not _member(value, space[name]):
            raise TunableError(f"{name} = {value!r} is not one of its declared values {space[name]}")
        current[name] = value
    restrictions: list[str] = []
    if RESTRICTIONS_NAME in assignments:
        raw = _literal(assignments[RESTRICTIONS_NAME][0], RESTRICTIONS_NAME)
        if not isinstance(raw, (list, tuple)) or not all(isinstance(r, str) for r in raw):
            raise TunableError(f"{RESTRICTIONS_NAME} must be a list of expression strings")
        restrictions = list(raw)
        for r in restrictions:
            compile_restriction(r, names)
            if not evaluate_restriction(r, current):  # then the kernel as written is outside its own space
                setting = ", ".join(f"{n} = {current[n]!r}" for n in names)
                raise TunableError(f"the kernel as written ({setting}) breaks its own restriction {r!r}; set the knobs to "
                                   f"values that meet every entry of {RESTRICTIONS_NAME}, or correct the restriction")
    return TunableSpace(names=names, values=space, current=current, restrictions=restrictions)


def read_constants(source: str, names: set[str]) -> dict[str, Any]:
    """Literal values of top-level assignments to the given names (non-literal ones are left out)."""
    out = {}
    for name, (node, _) in _top_level_assignments(ast.parse(source)).items():
        if name in names:
            try:
                out[name] = ast.literal_eval(node)
            except ValueError:
                continue
    return out


def _assigned_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def _top_level_assignments(tree: ast.Module) -> dict[str, tuple[ast.expr, int]]:
    """Name -> (value node of its first simple assignment, number of top-level assignments)."""
    found: dict[str, tuple[ast.expr, int]] = {}
    for node in tree.body:
        name = _assigned_name(node)
        if name is None:
            continue
        value = node.value  # type: ignore[attr-defined]
        if name in found:
            found[name] = (found[name][0], found[name][1] + 1)
        else:
            found[name] = (value, 1)
    return found


def _literal(node: ast.expr, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise TunableError(f"{what} must be a literal (numbers, strings, lists, dicts), not an expression") from None


def _member(value: Any, options: list[Value]) -> bool:
    """Membership that keeps True apart from 1 and 2 apart from 2.0: they render differently."""
    return any(type(value) is type(v) and value == v for v in options)


# -- restrictions -----------------------------------------------------------------------------

_BIN_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMP_OPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
    ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.IfExp, ast.Call,
    *_BIN_OPS, *_CMP_OPS,
)


def compile_restriction(expression: str, names: list[str] | None = None) -> ast.Expression:
    """Parse and vet a restriction; refuse anything beyond numbers, names, arithmetic, comparisons and min/max/abs."""
    if not isinstance(expression, str):
        raise TunableError(f"a restriction must be a string, not {type(expression).__name__}")
    tree = _vetted(expression)
    if names is not None:
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and id(node) not in called and node.id not in names:
                raise TunableError(f"restriction {expression!r} names {node.id!r}, which is not a declared knob")
    return tree


@functools.lru_cache(maxsize=1024)
def _vetted(expression: str) -> ast.Expression:
    if len(expression) > MAX_RESTRICTION_CHARS:
        raise TunableError(f"a restriction must be at most {MAX_RESTRICTION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise TunableError(f"restriction {expression!r} is not a Python expression") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_RESTRICTION_NODES:
        raise TunableError(f"restriction {expression!r} is too long")
    for node in nodes:
        if not isinstance(node, _ALLOWED_NODES):
            raise TunableError(f"restriction {expression!r} uses {type(node).__name__}, which is not allowed "
                               "(only numbers, knob names, arithmetic, comparisons, and/or/not, min/max/abs)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (bool, int, float, str)):
            raise TunableError(f"restriction {expression!r} holds a constant of type {type(node.value).__name__}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
                raise TunableError(f"restriction {expression!r} calls something other than min/max/abs with positional arguments")
    return tree


def evaluate_restriction(expression: str, config: Config) -> bool:
    """Evaluate a vetted restriction over one configuration, without eval()."""
    tree = compile_restriction(expression, list(config))
    return bool(_eval(tree.body, config))


def _number(x: Any) -> Any:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TunableError(f"arithmetic on {x!r}; only numbers take part in arithmetic")
    return x


def _eval(node: ast.expr, env: Config) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise TunableError(f"unknown name {node.id!r} in a restriction")
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env) for v in node.values)
        return any(_eval(v, env) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        return -_number(value) if isinstance(node.op, ast.USub) else +_number(value)
    if isinstance(node, ast.BinOp):
        left, right = _number(_eval(node.left, env)), _number(_eval(node.right, env))
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 2**32):
            raise TunableError("exponent too large in a restriction")
        try:
            return _BIN_OPS[type(node.op)](left, right)
        except ZeroDivisionError:
            return math.nan  # a restriction that divides by zero is simply not satisfied
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            try:
                if not _CMP_OPS[type(op)](left, right):
                    return False
            except TypeError:
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call):
        args = [_number(_eval(a, env)) for a in node.args]
        return _FUNCTIONS[node.func.id](*args)  # type: ignore[union-attr]
    raise TunableError(f"{type(node).__name__} is not allowed in a restriction")


# -- walking the space ------------------------------------------------------------------------

def iter_configs(space: TunableSpace) -> Iterator[Config]:
    """Every valid configuration, in declaration order (the first knob varies slowest)."""
    for combo in itertools.product(*(space.values[n] for n in space.names)):
        config = dict(zip(space.names, combo))
        if all(evaluate_restriction(r, config) for r in space.restrictions):
            yield config


def neighbours(space: TunableSpace, config: Config) -> list[Config]:
    """Configurations one step away: one knob moved to an adjacent declared value, restrictions kept.

    Declared order is the neighbourhood, so declare values in a meaningful order (ascending sizes).
    """
    out = []
    for name in space.names:
        options = space.values[name]
        at = next(i for i, v in enumerate(options) if type(v) is type(config[name]) and v == config[name])
        for step in (-1, 1):
            if 0 <= at + step < len(options):
                moved = dict(config, **{name: options[at + step]})
                if space.is_valid(moved):
                    out.append(moved)
    return out


def random_configs(space: TunableSpace, rng: random.Random, n: int, exclude: set[tuple] | None = None) -> list[Config]:
    """Up to n distinct valid configurations drawn uniformly, skipping keys in exclude."""
    exclude = set(exclude or ())
    if space.size <= MAX_ENUMERATE:
        pool = [c for c in iter_configs(space) if space.key(c) not in exclude]
        return rng.sample(pool, min(n, len(pool)))
    picked: list[Config] = []
    for _ in range(50 * n):  # rejection sampling for spaces too large to list
        config = {name: rng.choice(space.values[name]) for name in space.names}
        key = space.key(config)
        if key not in exclude and space.is_valid(config):
            exclude.add(key)
            picked.append(config)
            if len(picked) == n:
                break
    return picked


# -- writing a configuration ------------------------------------------------------------------

def with_config(source: str, config: Config) -> str:
    """Return the source with the knobs in config set to new values; every other byte is unchanged.

    Raises TunableError for an unknown knob, an undeclared value or a configuration that breaks a
    restriction, so a configuration outside the space can never be written.
    """
    space = parse_space(source)
    unknown = set(config) - set(space.names)
    if unknown:
        raise TunableError(f"unknown knob(s) {sorted(unknown)}; the space declares {space.names}")
    full = {**space.current, **config}
    for name, value in config.items():
        if not _member(value, space.values[name]):
            raise TunableError(f"{name} = {value!r} is not one of its declared values {space.values[name]}")
    broken = [r for r in space.restrictions if not evaluate_restriction(r, full)]
    if broken:
        raise TunableError(f"configuration {full} breaks restriction(s) {broken}")
    tree = ast.parse(source)
    assignments = _top_level_assignments(tree)
    encoded = source.encode()
    line_starts = _line_starts(encoded)
    edits = []
    for name, value in config.items():
        node = assignments[name][0]
        start = line_starts[node.lineno - 1] + node.col_offset  # col offsets are UTF-8 byte offsets
        end = line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
        edits.append((start, end, repr(value).encode()))
    for start, end, text in sorted(edits, reverse=True):
        encoded = encoded[:start] + text + encoded[end:]
    return encoded.decode()


def _line_starts(encoded: bytes) -> list[int]:
    starts = [0]
    for i, byte in enumerate(encoded):
        if byte == 0x0A:
            starts.append(i + 1)
    return starts
