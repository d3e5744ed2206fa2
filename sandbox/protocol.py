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
MAX_MESSAGE = 64 * 1024 * 1024


class ChannelClosed(Exception):
    """The other end went away (the worker died, or the supervisor closed the pipe)."""


class ChannelTimeout(Exception):
    """No complete message arrived before the deadline."""


def send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message, allow_nan=True).encode()
    payload = _HEADER.pack(len(data)) + data
    view = memoryview(payload)
    while view:
        try:
            written = os.write(fd, view)
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
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            if poll is not None:
                poll()
            continue
        chunk = os.read(fd, remaining)
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
    message = json.loads(_read_exact(fd, length, deadline, poll))
    if not isinstance(message, dict):
        raise ChannelClosed("malformed message")
    return message
