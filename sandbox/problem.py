"""Static checks of problem and candidate files, done in the supervisor without running them.

A problem is a KernelBench file (``class Model``, ``get_inputs()``, ``get_init_inputs()``);
a candidate is a module with ``class ModelNew``. Catching a missing name or a syntax error
here costs nothing and spends no budget; anything that needs the code to run happens in a
sandbox worker.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path


class InputFileError(Exception):
    """A problem or candidate file that cannot be used, with a message that says what to fix."""

    def __init__(self, path: Path | str, message: str, kind: str = "invalid_problem"):
        self.path = str(path)
        self.kind = kind
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True)
class SourceFile:
    path: Path
    source: str
    sha: str
    imports: frozenset[str]

    @property
    def uses_triton(self) -> bool:
        return "triton" in self.imports


def _read(path: Path, kind: str) -> str:
    if not path.exists():
        raise InputFileError(path, "no such file", kind)
    if path.is_dir():
        raise InputFileError(path, "is a folder; pass a .py file", kind)
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise InputFileError(path, "is not a UTF-8 text file", kind) from None


def _parse(path: Path, source: str, kind: str) -> ast.Module:
    try:
        return ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        raise InputFileError(path, f"syntax error at {where}: {exc.msg}" + (f"\n    {line}" if line else ""), kind) from None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


def _imported_modules(tree: ast.Module) -> frozenset[str]:
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module.split(".")[0])
    return frozenset(mods)


def _load(path: Path | str, kind: str) -> tuple[SourceFile, set[str]]:
    path = Path(path).resolve()
    source = _read(path, kind)
    tree = _parse(path, source, kind)
    sha = hashlib.sha256(source.encode()).hexdigest()
    return SourceFile(path, source, sha, _imported_modules(tree)), _top_level_names(tree)


def problem_name(path: Path | str) -> str:
    """A problem's name: its folder's for a problem.py (examples/softmax), the file's stem for a KernelBench file."""
    path = Path(path)
    return path.parent.name if path.name == "problem.py" else path.stem


def problem_file(path: Path | str) -> Path:
    """A folder stands for the problem.py it holds (examples/softmax), so that every command and tool takes
    a problem the way `kscout optimize` does; a folder without one is an error that says so."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / "problem.py").is_file():
        raise InputFileError(path, "is a folder without problem.py; pass a KernelBench .py file or a folder holding "
                                   "problem.py", "invalid_problem")
    return path / "problem.py"


def load_problem(path: Path | str) -> SourceFile:
    """Check that a KernelBench problem file (or a folder holding problem.py) has what the harness needs."""
    problem, names = _load(problem_file(path), "invalid_problem")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise InputFileError(
            problem.path,
            "is not a KernelBench problem: missing " + ", ".join(missing)
            + " (a problem defines class Model(nn.Module), get_inputs() and get_init_inputs())",
        )
    return problem


def load_candidate(path: Path | str) -> SourceFile:
    """Check that a candidate module defines ModelNew; failures here are never charged."""
    candidate, names = _load(path, "compile_error")
    if "ModelNew" not in names:
        hint = " (it defines Model; rename the optimised class to ModelNew)" if "Model" in names else ""
        raise InputFileError(candidate.path, f"defines no class ModelNew{hint}", "compile_error")
    return candidate
