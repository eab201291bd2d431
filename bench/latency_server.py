"""A scripted model and a tool that take their time: thousands of requests open at once.

``python -m bench.latency_server --model-latency M --tool-latency T --calls K`` serves, on
one asyncio event loop (HTTP/1.1 with keep-alive, connections idle after an answer closed
after ``KEEP_ALIVE_S``):

- ``POST /v1/responses`` (the OpenAI Responses API): after ``M`` seconds, a turn asking for
  ``K`` parallel calls of the tool ``slow`` (``--tool-name``) when the input holds no tool
  output yet, else a final text. The relay's agent loop is thus model turn -> K tool
  calls -> model turn;
- ``POST /tools/<name>``: after ``T`` seconds, ``{"ok": true}``; each ``Idempotency-Key`` is
  counted, so a call performed twice shows up as a duplicate;
- with ``--model-status 503``, every model request is answered 503 at once, OpenAI's error
  JSON: a provider that is down (``bench.fallback``);
- ``GET /_stats``: requests served, the most open at once (per route) and duplicates;
- anything else: 404 with an OpenAI-style JSON error.

It prints its base URL on stdout once listening.

Design: this process shares the bench machine with the relay and PostgreSQL under test, and
its cycles are an artifact of the bench (in production the model and the tools run
elsewhere), so it is built to cost as little CPU per request as possible. Each connection is
an ``asyncio.Protocol`` (no streams, no coroutine per connection) with a small HTTP/1.1
parser of its own, and a waiting request is one ``loop.call_later`` timer handle, neither a
coroutine nor a thread. CPU per request, this process's ``user + system`` time (psutil)
over 4,000 POSTs 400 at once from ``httpx2.AsyncClient``, 2 vCPU: 0.23-0.26 ms with ``h11``
over asyncio streams, 0.11-0.12 ms with this parser (0.15 ms while another benchmark ran
beside it). At 10,000 runs of two tool calls (40,000 requests) that is about 5 CPU-seconds
instead of 10-12. What is left is mostly asyncio's event loop and the kernel's socket calls
(0.04 ms of system time per request either way), not this module.

The parser reads what the relay and ``httpx2`` send and nothing more: a request line, header
fields (names case-insensitive; it uses ``Content-Length``, ``Idempotency-Key`` and
``Connection: close``) and a body of ``Content-Length`` bytes. Requests pipelined on one
connection are answered one at a time, in order. Anything it cannot read (a chunked body or
any ``Transfer-Encoding``, a malformed request line or header, a head over ``MAX_HEAD``
bytes, a model request whose body is not a JSON object) is answered 400 and the connection
closed. An HTTP/1.0 request is answered with ``connection: close``, then the connection
closed. Routes go by path alone, whatever the method, as they always did.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

BACKLOG = 4096  # pending connections the kernel may queue (net.core.somaxconn here)
# An idle keep-alive connection is closed after this long, as uvicorn does (5 s) and nginx
# (75 s): without it every connection a client ever opened stayed open, and at 10,000 runs
# in flight the server ran out of file descriptors.
KEEP_ALIVE_S = 5.0
MAX_HEAD = 65536  # bytes of request line and header fields; more is answered 400

REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 503: b"Service Unavailable"}
Answer = tuple[int, Any]  # status and the JSON payload


def _id() -> str:
    # The 32 hex digits of a uuid4, at a fifth of uuid.uuid4()'s cost: five per model turn.
    return os.urandom(16).hex()


class BadRequest(Exception):
    """The request cannot be read; it is answered 400 and the connection closed."""


@dataclass
class Stats:
    model_requests: int = 0
    tool_requests: int = 0
    open_model: int = 0
    open_tool: int = 0
    max_open_model: int = 0
    max_open_tool: int = 0
    keys: collections.Counter[str] = field(default_factory=collections.Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "model_requests": self.model_requests,
            "tool_requests": self.tool_requests,
            "max_open_model": self.max_open_model,
            "max_open_tool": self.max_open_tool,
            "duplicate_effects": sum(n - 1 for n in self.keys.values() if n > 1),
        }


@dataclass(slots=True)
class Request:
    target: bytes
    key: str  # the Idempotency-Key header, "" without one
    close: bool  # Connection: close, or HTTP/1.0
    length: int  # of the body
    body: bytes = b""


def parse_head(head: bytes) -> Request:
    """The request line and header fields of ``head`` (without the blank line ending it)."""
    request_line, *lines = head.split(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1].startswith(b"/"):
        raise BadRequest("malformed request line")
    _method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest("unsupported HTTP version")
    request = Request(target, "", version == b"HTTP/1.0", 0)
    length: int | None = None
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise BadRequest("malformed header field")
        name = name.lower()
        value = value.strip()
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadRequest("bad Content-Length")
            length = int(value)
        elif name == b"transfer-encoding":
            raise BadRequest("Transfer-Encoding (a chunked body) is not supported")
        elif name == b"idempotency-key":
            request.key = value.decode("latin-1")
        elif name == b"connection":
            request.close |= b"close" in [t.strip() for t in value.lower().split(b",")]
    request.length = length or 0
    return request


class Server:
    """The routes and their statistics; shared by every connection."""

    def __init__(
        self,
        model_s: float,
        tool_s: float,
        calls: int,
        model_status: int = 200,
        tool_name: str = "slow",
    ) -> None:
        self.model_s = model_s
        self.tool_s = tool_s
        self.calls = calls
        self.model_status = model_status
        self.tool_name = tool_name
        self.stats = Stats()
        self.loop = asyncio.get_running_loop()

    def handle(self, conn: Connection, request: Request) -> Answer | None:
        """The answer now, or ``None`` when ``conn.answer`` will be called with it later."""
        target = request.target
        if target == b"/v1/responses":
            self.model(conn, request.body)
            return None
        if target.startswith(b"/tools/"):
            self.tool(conn, request.key)
            return None
        if target == b"/_stats":
            return 200, self.stats.as_json()
        path = target.decode("ascii", "backslashreplace")
        return 404, {"error": {"message": f"no route {path}"}}

    def model(self, conn: Connection, body: bytes) -> None:
        try:
            request = json.loads(body)
            answered = any(
                isinstance(item, dict) and item.get("type") == "function_call_output"
                for item in request.get("input", [])
            )
        except (ValueError, TypeError, AttributeError) as e:
            raise BadRequest("the body is not a Responses API request") from e
        s = self.stats
        s.model_requests += 1
        if self.model_status != 200:  # a provider that is down answers at once
            message = "The server had an error while processing your request."
            error = {"error": {"message": message, "type": "server_error"}}
            self.loop.call_soon(conn.answer, self.model_status, error)
            return
        s.open_model += 1
        s.max_open_model = max(s.max_open_model, s.open_model)
        # A timer handle, not a sleeping coroutine: cheaper to create and to wake.
        self.loop.call_later(self.model_s, self._model_done, conn, request.get("model"), answered)

    def _model_done(self, conn: Connection, model: Any, answered: bool) -> None:
        self.stats.open_model -= 1
        conn.answer(200, self.turn(model, answered))

    def turn(self, model: Any, answered: bool) -> dict[str, Any]:
        """A Responses API answer: ``self.calls`` tool calls, or the final text once answered."""
        if answered:
            output = [
                {
                    "type": "message",
                    "id": "msg_" + _id(),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            ]
        else:
            output = [
                {
                    "type": "function_call",
                    "id": "fc_" + _id(),
                    "call_id": "call_" + _id(),
                    "name": self.tool_name,
                    "arguments": json.dumps({"i": i}),
                    "status": "completed",
                }
                for i in range(self.calls)
            ]
        return {
            "id": "resp_" + _id(),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 15,
            },
        }

    def tool(self, conn: Connection, key: str) -> None:
        s = self.stats
        s.tool_requests += 1
        s.keys[key] += 1
        s.open_tool += 1
        s.max_open_tool = max(s.max_open_tool, s.open_tool)
        self.loop.call_later(self.tool_s, self._tool_done, conn)

    def _tool_done(self, conn: Connection) -> None:
        self.stats.open_tool -= 1
        conn.answer(200, {"ok": True})


class Connection(asyncio.Protocol):
    """One client connection: reads requests from its buffer and answers them in order.

    While one request is being answered (``busy``) the next ones wait in ``buffer``
    unread, so pipelined requests are answered one at a time, in order.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.request: Request | None = None  # its head is read, its body not yet
        self.busy = False  # a complete request is being answered
        self.close_after = False  # that request asked for Connection: close
        self.eof = False  # the client sent all it will send
        self.closed = False
        # The idle timer is armed once and re-armed when it fires early, rather than
        # cancelled and created anew for every request: a request costs one loop.time().
        self.idle_since = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # No idle timer before the first request, as uvicorn: a client whose loop is late
        # between its connect and its send (thousands of requests in a burst) would have
        # its request ended unread, an ambiguous outcome, for no fault of the relay's.
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        # A request still waiting keeps its timer: its route stays counted as open until the
        # wait ends (as the sleeping coroutine of the h11 version did), then the answer is
        # dropped.
        self.closed = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def eof_received(self) -> bool:
        self.eof = True
        return self.busy  # keep the socket open to answer the request in hand, then close

    def answer(self, status: int, payload: Any) -> None:
        """Send the answer to the request in hand (a waiting request's timer calls this)."""
        if self.closed:
            return
        self._send(status, payload)
        self._next()

    def _next(self) -> None:
        """Answer the buffered requests, in order, until one must wait or the buffer is read."""
        while not self.busy and not self.closed:
            try:
                request = self._read()
                if request is None:
                    break
                self.busy = True
                self.close_after = request.close
                answer = self.server.handle(self, request)
            except BadRequest as e:
                self.request = None
                self._send(400, {"error": {"message": f"bad request: {e}"}}, close=True)
                return
            if answer is not None:
                self._send(*answer)
        if not self.busy and not self.closed:
            if self.eof:
                self._close()
            else:
                self._idle()

    def _read(self) -> Request | None:
        """The next complete request from the buffer, or ``None`` until more arrives."""
        buffer = self.buffer
        if self.request is None:
            while buffer.startswith(b"\r\n"):  # RFC 9112 2.2: ignore a stray CRLF before it
                del buffer[:2]
            end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    raise BadRequest("request head too large")
                return None
            self.request = parse_head(bytes(buffer[:end]))
            del buffer[: end + 4]
        request = self.request
        if len(buffer) < request.length:
            return None
        request.body = bytes(buffer[: request.length])
        del buffer[: request.length]
        self.request = None
        return request

    def _send(self, status: int, payload: Any, close: bool = False) -> None:
        """Write one answer; close after it when asked to or when the client asked to."""
        data = json.dumps(payload).encode()
        close = close or self.close_after
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status,
            REASONS[status],
            len(data),
        )
        if close:
            head += b"connection: close\r\n"
        assert self.transport is not None
        self.transport.write(head + b"\r\n" + data)
        self.busy = False
        if close:
            self._close()

    def _idle(self) -> None:
        self.idle_since = self.loop.time()
        if self.idle_timer is None:
            self.idle_timer = self.loop.call_later(KEEP_ALIVE_S, self._idle_check)

    def _idle_check(self) -> None:
        self.idle_timer = None
        if self.busy or self.closed:
            return  # _idle arms it again once the request in hand is answered
        left = self.idle_since + KEEP_ALIVE_S - self.loop.time()
        if left > 0:
            self.idle_timer = self.loop.call_later(left, self._idle_check)
        else:
            self._close()

    def _close(self) -> None:
        self.closed = True
        assert self.transport is not None
        self.transport.close()


async def serve(args: argparse.Namespace) -> None:
    server = Server(
        args.model_latency, args.tool_latency, args.calls, args.model_status, args.tool_name
    )
    listener = await server.loop.create_server(
        lambda: Connection(server), "127.0.0.1", args.port, backlog=BACKLOG
    )
    port = listener.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_server", description=__doc__)
    parser.add_argument("--model-latency", type=float, default=2.0, help="seconds per turn")
    parser.add_argument("--tool-latency", type=float, default=0.5, help="seconds per call")
    parser.add_argument("--calls", type=int, default=2, help="parallel tool calls per turn")
    parser.add_argument(
        "--model-status",
        type=int,
        choices=sorted(REASONS),
        default=200,
        help="answer every model request with this status at once (503: a provider down)",
    )
    parser.add_argument(
        "--tool-name", default="slow", help="the tool the model's turns call (default: slow)"
    )
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one socket per open request
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
