"""Whole-file writes that a killed process cannot leave half-written.

A run directory is resumed after `kill -9`, so every file the agent rewrites in place (manifests,
caches, archived kernels) is written next to its target and renamed over it: a reader sees the old
file or the new one, never a prefix. The temporary name carries the pid, so two processes writing the
same file do not write into each other's temporary file.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str, durable: bool = False) -> None:
    """Replace `path` with `text` in one rename; `durable` also fsyncs before the rename, for files
    that must survive a power cut and not just a killed process."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
