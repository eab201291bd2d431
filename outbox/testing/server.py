"""A reusable base for the fake HTTP services the tests and the demo start.

The fakes are real HTTP servers, not mocked clients: the code under test goes through its
own HTTP stack (``httpx2`` and the ``openai`` SDK), so timeouts, dropped connections and
status codes behave as they do in production.

Design choice: the standard library only. A ``ThreadingHTTPServer`` runs in a daemon thread,
bound to 127.0.0.1 on an ephemeral port (port 0) by default. Each request is turned into a
small immutable ``Request`` and answered with a ``Reply`` by the subclass's ``handle``; the
plumbing (HTTP/1.1 keep-alive, Content-Length, dropping a connection, delaying an answer
after the state change, tolerating clients that hung up) lives here once. Subclasses keep
their state behind ``self.lock``. ``serve_main`` runs any fake as a separate process that
prints its URL on stdout and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

DEFAULT_HOST = "127.0.0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024  # bytes; larger bodies are refused with 413
STOP_JOIN_TIMEOUT_S = 5.0  # seconds to wait for the serving thread on stop()
POLL_INTERVAL_S = 0.05  # seconds between shutdown checks of the serve loop (bounds stop())


@dataclass(frozen=True)
class Request:
    """One HTTP request as the fake sees it (header names are lower-case)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """Decode the body as JSON; raise ``HttpError`` 400 when it is not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise HttpError(400, {"error": {"message": f"invalid JSON body: {exc}"}}) from exc

    def json_object(self) -> dict[str, Any]:
        """Decode the body as a JSON object (an empty body is ``{}``)."""
        data = self.json()
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise HttpError(400, {"error": {"message": "the JSON body must be an object"}})
        return data


@dataclass
class Reply:
    """The answer to send; ``delay_s`` is slept *after* the state change, before sending.
    A ``body`` of bytes is sent as it is (to play a server whose answer is not the JSON
    ``json.dumps`` would write), anything else as JSON."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # seconds
    drop: bool = False  # close the connection without answering


def json_reply(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Reply:
    """A JSON reply with the given status."""
    return Reply(status=status, body=body, headers=dict(headers or {}))


def dropped() -> Reply:
    """A reply that closes the socket without sending a byte."""
    return Reply(drop=True)


class HttpError(Exception):
    """Raise from ``handle`` to answer with an error status and a JSON body."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}: {body!r}")
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for fingerprints and token counts."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: benchmarks should not pay a connect per call
    disable_nagle_algorithm = True  # headers and body are two writes: avoid a 40 ms ACK stall
    server: _HttpServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(Reply(413, {"error": {"message": "request body too large"}}))
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=url.path,
            query=dict(parse_qsl(url.query)),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        try:
            reply = self.server.fake.handle(request)
        except HttpError as exc:
            reply = Reply(exc.status, exc.body, exc.headers)
        except Exception as exc:  # a bug in a fake must answer, not hang the client
            reply = Reply(500, {"error": {"message": f"fake server error: {exc!r}"}})
        if reply.delay_s > 0:
            time.sleep(reply.delay_s)  # simulated latency, not a wait for a condition
        if reply.drop:
            self.close_connection = True
            return
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        if isinstance(reply.body, bytes):
            payload = reply.body
        else:
            payload = b"" if reply.body is None else json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            named = {name.lower() for name in reply.headers}
            if reply.body is not None and "content-type" not in named:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError:  # the client gave up (timeout) before the answer
            self.close_connection = True


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for stalled handlers or idle keep-alives
    request_queue_size = 128  # listen backlog: the default 5 makes bursts wait 1 s for SYN retry

    def __init__(self, address: tuple[str, int], fake: FakeServer) -> None:
        self.fake = fake
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that hung up is business as usual for a fault-injecting fake
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class FakeServer:
    """Base class: a threaded HTTP server in a daemon thread, usable as a context manager.

    Subclasses implement ``handle(request) -> Reply`` and keep their state behind
    ``self.lock``. ``with Fake() as srv: srv.url`` starts and stops it.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.host = host
        self.requested_port = port
        self.lock = threading.RLock()
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    def handle(self, request: Request) -> Reply:
        """Answer one request; called concurrently from the server's handler threads."""
        raise NotImplementedError

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL without a trailing slash, e.g. ``http://127.0.0.1:54321``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        """Bind and serve in a daemon thread; returns self. Idempotent."""
        if self._httpd is not None:
            return self
        self._httpd = _HttpServer((self.host, self.requested_port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            args=(POLL_INTERVAL_S,),
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close open client connections and release the port. Idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._httpd = self._thread = None
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if thread is not None:
            thread.join(STOP_JOIN_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_main(
    factory: Callable[[str, int], FakeServer],
    description: str,
    argv: Sequence[str] | None = None,
) -> int:
    """Run a fake as a process: print its URL on stdout, serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with factory(args.host, args.port) as fake:
        print(fake.url, flush=True)
        stop.wait()
    return 0
