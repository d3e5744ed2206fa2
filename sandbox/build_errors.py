"""A C++/CUDA extension that does not build: the compiler's messages, at the candidate's own lines.

torch.utils.cpp_extension reports a failed build as one RuntimeError holding ninja's whole log: each
compiler command line (about 600 characters, twice), then the compiler's messages, which point at
the generated source in the compile cache (`main.cpp` line 7) rather than at the candidate file that
holds that source as a string (line 10). The user needs the messages and the candidate's line.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Optional

_HEADER = re.compile(r"^Error building extension '([^']+)'(?::\s*)?(.*)$")
_COMMAND = re.compile(r"^(?:\[\d+/\d+\]\s+)?\S*(?:c\+\+|g\+\+|gcc|clang\+\+|clang|nvcc|hipcc|cc)\s+.*\s-o\s+\S+\s*$")
_LOCATION = re.compile(r"^(?P<file>/[^:\s]+\.(?:cpp|cc|cu|cuh|h|hpp)):(?P<line>\d+)(?::\d+)?:")


def is_build_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and str(exc).startswith("Error building extension")


@lru_cache(maxsize=32)
def _lines(path: str) -> tuple[str, ...]:
    try:
        with open(path, errors="replace") as f:
            return tuple(f.read().splitlines())
    except OSError:
        return ()


def _candidate_line(generated: str, line: int, candidate_lines: list[str]) -> Optional[int]:
    """The candidate's line holding the generated file's line `line`, where exactly one does."""
    lines = _lines(generated)
    if not 0 < line <= len(lines):
        return None
    text = lines[line - 1].strip()
    if len(text) < 4:  # a brace or blank: too common to place
        return None
    hits = [i for i, c in enumerate(candidate_lines, start=1) if c.strip() == text]
    return hits[0] if len(hits) == 1 else None


def summarise(message: str, candidate_source: str, candidate_path: str) -> str:
    """ninja's log without the command lines, each compiler location followed by the candidate's line."""
    lines = message.splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if head is None:
        return message
    body = ([head.group(2)] if head.group(2) else []) + lines[1:]
    candidate_lines = candidate_source.splitlines()
    name = os.path.basename(candidate_path)
    out = [f"the C++/CUDA extension '{head.group(1)}' does not build; the compiler said:"]
    for line in body:
        if _COMMAND.match(line) or line.startswith("FAILED: ") or line.startswith("ninja: build stopped"):
            continue
        where = _LOCATION.match(line)
        if where:
            at = _candidate_line(where.group("file"), int(where.group("line")), candidate_lines)
            if at is not None:
                line = f"{line}  [{name} line {at}]"
        out.append(line)
    return "\n".join(out)
