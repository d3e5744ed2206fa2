"""A local stand-in for the Anthropic and OpenAI HTTP APIs, for tests.

The tests drive the real ``anthropic`` and ``openai`` SDK clients against this
server, so what is checked is what those SDKs actually send and parse, not a
mock of them. Replies are scripted as a queue of actions; one request consumes
one action, whichever wire format it arrives in:

    with FakeLLMServer() as server:
        server.script(rate_limited(), reply_text("hello"))
        client = anthropic.Anthropic(api_key="k", base_url=server.anthropic_base_url)
        ...
        assert server.request_count == 2

Only the standard library is used, so the server starts in milliseconds and
needs no network beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pytest

NeutralStop = Literal["end_turn", "tool_use", "max_tokens", "refusal"]


@dataclass(frozen=True)
class Reply:
    """A successful completion, rendered in whichever wire format was asked for."""

    text: str = ""
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    stop: NeutralStop | None = None  # None: "tool_use" if there are tool calls, else "end_turn"
    input_tokens: int = 11
    output_tokens: int = 7
    raw_arguments: str | None = None  # OpenAI only: send this string as the tool-call arguments


@dataclass(frozen=True)
class Status:
    """An HTTP error with an error body shaped like the provider's own."""

    code: int
    message: str = "scripted error"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Hang:
    """Hold the connection past the client's timeout, then send ``then`` (usually never read)."""

    seconds: float
    then: Action = field(default_factory=lambda: Reply(text="too late"))


@dataclass(frozen=True)
class Malformed:
    """A 200 response whose body is not valid JSON, as a broken proxy might send."""

    body: str = '{"id": "msg_broken", "content": [ {"type": "te'


Action = Reply | Status | Hang | Malformed


def reply_text(text: str, *, stop: NeutralStop | None = None, input_tokens: int = 11, output_tokens: int = 7) -> Reply:
    return Reply(text=text, stop=stop, input_tokens=input_tokens, output_tokens=output_tokens)


def reply_tool_call(name: str, arguments: dict[str, Any], *, text: str = "", raw_arguments: str | None = None) -> Reply:
    return Reply(text=text, tool_calls=((name, arguments),), raw_arguments=raw_arguments)


def rate_limited(retry_after_s: float = 0.01) -> Status:
    return Status(429, "rate limited, slow down", (("retry-after", str(retry_after_s)),))


def server_error(code: int = 500) -> Status:
    return Status(code, "internal server error")


def unauthorized() -> Status:
    return Status(401, "invalid x-api-key")


def hang(seconds: float) -> Hang:
    return Hang(seconds)


def malformed() -> Malformed:
    return Malformed()


@dataclass
class RecordedRequest:
    """One request as the server saw it; ``body`` is the decoded JSON payload."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeLLMServer:
    """A ThreadingHTTPServer on 127.0.0.1 (ephemeral port) in a background thread."""

    def __init__(self) -> None:
        self._queue: deque[Action] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        # Daemon threads: a handler still sleeping in a Hang must not keep close() waiting.
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-llm-server", daemon=True)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses -----------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic SDK appends /v1/messages itself."""
        return self.url

    @property
    def openai_base_url(self) -> str:
        """OpenAI-compatible servers are addressed with the /v1 prefix included."""
        return self.url + "/v1"

    # -- scripting -----------------------------------------------------------------
    def script(self, *actions: Action) -> None:
        with self._lock:
            self._queue.extend(actions)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def _take(self, request: RecordedRequest) -> Action | None:
        with self._lock:
            self.requests.append(request)
            return self._queue.popleft() if self._queue else None


# --------------------------------------------------------------------------------------
# Wire formats
# --------------------------------------------------------------------------------------
_OPENAI_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "refusal": "stop"}


def _stop_of(reply: Reply) -> NeutralStop:
    return reply.stop or ("tool_use" if reply.tool_calls else "end_turn")


def render_anthropic(reply: Reply, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for i, (name, args) in enumerate(reply.tool_calls):
        content.append({"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args})
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": "fake-claude",
        "content": content,
        "stop_reason": _stop_of(reply),
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def render_openai(reply: Reply, n: int) -> dict[str, Any]:
    stop = _stop_of(reply)
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if stop == "refusal":
        message = {"role": "assistant", "content": None, "refusal": reply.text or "I can't help with that."}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": reply.raw_arguments or json.dumps(args)},
            }
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake-gpt",
        "choices": [{"index": 0, "message": message, "finish_reason": _OPENAI_FINISH[stop], "logprobs": None}],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def _error_body(fmt: str, status: Status) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status.code, "api_error")
    if fmt == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": status.message}}
    return {"error": {"message": status.message, "type": kind, "code": None, "param": None}}


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # http.server's naming
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length).decode("utf-8") if length else ""
            try:
                body: Any = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw
            path = self.path.split("?", 1)[0]
            if path.endswith("/v1/messages"):
                fmt = "anthropic"
            elif path.endswith("/chat/completions"):
                fmt = "openai"
            else:
                self._send(404, {"error": {"message": f"fake server has no route {path}"}})
                return
            recorded = RecordedRequest("POST", path, {k.lower(): v for k, v in self.headers.items()}, body)
            action = server._take(recorded)
            n = len(server.requests)
            self._perform(action, fmt, n)

        def _perform(self, action: Action | None, fmt: str, n: int) -> None:
            if action is None:
                # Not retryable on purpose: an unscripted request should fail the test loudly.
                self._send(400, _error_body(fmt, Status(400, f"fake server script exhausted at request {n}")))
            elif isinstance(action, Reply):
                self._send(200, render_anthropic(action, n) if fmt == "anthropic" else render_openai(action, n))
            elif isinstance(action, Status):
                self._send(action.code, _error_body(fmt, action), dict(action.headers))
            elif isinstance(action, Hang):
                time.sleep(action.seconds)
                self._perform(action.then, fmt, n)
            elif isinstance(action, Malformed):
                self._send_raw(200, action.body.encode(), {})

        def _send(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send_raw(code, json.dumps(payload).encode(), headers or {})

        def _send_raw(self, code: int, data: bytes, headers: dict[str, str]) -> None:
            try:
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test); nothing to deliver

    return Handler


@pytest.fixture
def fake_llm_server() -> Iterator[FakeLLMServer]:
    """A started FakeLLMServer, closed after the test."""
    with FakeLLMServer() as server:
        yield server
