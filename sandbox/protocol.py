"""Length-prefixed JSON messages over the private pipes between supervisor and worker.

JSON, never pickle: the worker runs untrusted code, and unpickling its bytes in the
supervisor would hand that code the supervisor's process (and its secrets).
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any, Optional

_HEADER = struct.Struct("!I")
# bound when the worker starts, before any candidate code: a candidate that wrapped `json.loads` read every command,
# the keys of the reference's sampled positions among them (docs/harness_hardening.md, 2026-12-05). Rebinding these
# names is a change to a harness module, which the worker's re-checks read (integrity.changed_since).
_decode = json.JSONDecoder().decode
_encode = json.JSONEncoder(allow_nan=True).encode
_read, _write, _select = os.read, os.write, select.select
MAX_MESSAGE = 64 * 1024 * 1024


class ChannelClosed(Exception):
    """The other end went away (the worker died, or the supervisor closed the pipe)."""


class ChannelTimeout(Exception):
    """No complete message arrived before the deadline."""


def send(fd: int, message: dict[str, Any]) -> None:
    data = _encode(message).encode()
    payload = _HEADER.pack(len(data)) + data
    view = memoryview(payload)
    while view:
        try:
            written = _write(fd, view)
        except BrokenPipeError as exc:
            raise ChannelClosed(str(exc)) from exc
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: Optional[float], poll: Optional[callable]) -> bytes:
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout()
            wait = min(left, 0.2)
        else:
            wait = 0.2
        ready, _, _ = _select([fd], [], [], wait)
        if not ready:
            if poll is not None:
                poll()
            continue
        chunk = _read(fd, remaining)
        if not chunk:
            raise ChannelClosed("end of stream")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv(fd: int, deadline: Optional[float] = None, poll: Optional[callable] = None) -> dict[str, Any]:
    """Read one message; `poll` is called while waiting so the caller can watch the worker's memory."""
    (length,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline, poll))
    if length > MAX_MESSAGE:
        raise ChannelClosed(f"message of {length} bytes exceeds the protocol limit")
    message = _decode(_read_exact(fd, length, deadline, poll).decode())
    if not isinstance(message, dict):
        raise ChannelClosed("malformed message")
    return message
