"""A POST over HTTP/1.1 on asyncio, at the least CPU: what the relay's effects send.

Every model turn and HTTP tool call of a relay process is a request on its one event
loop, so each request's CPU is the relay's throughput: in the runs-in-flight bench the
loop thread was the relay's bottleneck, and most of it was the request path. So this
client does the least per request; ``python -m bench.poster`` (part of ``make bench``)
measures its CPU per request beside ``httpx2.AsyncClient``'s, on kept-alive connections,
400 at once (docs/benchmarks.md has the figures).

What the relay sends is narrow: a POST of a body it holds whole, with a few headers, to
a server that answers with a status, headers and a body it reads whole. A connection
here is an ``asyncio.Protocol`` that parses the answer as its bytes arrive (status line,
headers, then the body by ``content-length``, ``chunked``, or up to the server's end)
and hands it over when complete; there are no layers of events, locks or streams per
request. To the executors ``Poster.post`` looks like ``httpx2.AsyncClient.post``: the
answer (``Answered``) has the fields of an ``httpx2.Response`` they read (``status_code``,
``headers``, ``content``, ``text``, ``json()``, ``extensions``) and the errors are
``httpx2``'s classes, which the executors' failure classes are built on:
``ConnectError``/``ConnectTimeout`` only when the request was certainly not sent,
``ReadTimeout``/``WriteTimeout`` and ``RemoteProtocolError``/``ReadError`` when it was
(or may have been) sent and no whole answer came.

A request may bound the answer's body (``max_body``): past it the body is not read further,
the connection is closed, and the answer comes back with what was read and
``extensions["body_cut_at"]``, so that a tool answering gigabytes costs the relay a few
hundred kilobytes, not its memory. A request may also say when what has arrived of the
body is enough (``enough``): an MCP server's event stream holds the answer the relay waits
for, and a server that keeps the stream open after it must not hold the call.
"""

from __future__ import annotations

import asyncio
import functools
import json as jsonlib
import math
import re
import select
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2

CONNECTING = 64  # connections being opened at once per process (Poster says why)
# A kept-alive connection unused for this long is closed, never reused: servers end idle
# connections after as little as 2 s (gunicorn; uvicorn and Node after 5 s), and a request
# sent as the server ends its connection (its idle timer firing, its loop late under load)
# may or may not have been read: an ambiguous outcome, which a tool without a lookup waits
# out for its settle time. A new connection costs a handshake.
IDLE_S = 1.0
# A request that is simply sent again when it is lost (``post(repeatable=True)``: a model
# turn, which has no effect to settle) may take a connection idle this long: under the 5 s
# after which uvicorn and Node end one (a server that ended it sooner has said so on the
# socket, ``Connection.usable``). Between a wave of turns and the next, the model's
# connections wait out the tools: a new connection for each turn cost more relay CPU
# than the turn's own parsing.
REPEATABLE_IDLE_S = 4.0
MAX_HEAD = 64 * 1024  # bytes of status line and headers (or of a chunk line) an answer may have
# How long a body that holds all its caller needs (``Answer.enough``) may take to end before
# it is ended here: the connection is kept for the next request when the server ends it at
# once (as an MCP server should after its answer), and one that keeps it open holds the
# caller no longer than this.
END_GRACE_S = 0.05
MAX_INFORMATIONAL = 8  # 1xx answers skipped before the answer, at most
URL_SAFE = "!#$%&'()*+,/:;=?@[]~"  # kept as they are in a URL's path and query (others %-encoded)
UNTIL_END = -1  # an answer without length or chunks: its body ends with the connection
TRAILERS = -2  # a chunked answer after its last chunk
HEX_DIGITS = b"0123456789abcdefABCDEF"
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
OWN_HEADERS = {"host", "content-length", "transfer-encoding"}  # the poster's framing


Enough = Callable[["Answer"], bool]


class Answer:
    """An HTTP/1.1 response parsed from its bytes as they arrive (``feed``). ``enough``, when
    given, is asked after each bytes of the body that arrive whether what has arrived is all
    the caller needs (an event stream's answer, which a server may follow with nothing but
    an open stream): if so the answer is ``sufficient``, and its connection ends it
    (``early``) unless the body ends within ``END_GRACE_S`` (``Connection``)."""

    # Slots, not a dict of attributes: one answer per request in flight, thousands at once
    # (352 bytes of object and dict each without them, 144 with).
    __slots__ = (
        "body",
        "buffer",
        "chunked",
        "complete",
        "cut",
        "early",
        "enough",
        "headers",
        "informational",
        "length",
        "max_body",
        "reusable",
        "status",
        "sufficient",
    )

    def __init__(self, max_body: int | None = None, enough: Enough | None = None) -> None:
        self.max_body = max_body  # body bytes read at most; past them the answer is cut
        self.enough = enough
        self.sufficient = False  # ``enough`` said so: the rest of the body is not needed
        self.early = False  # ended while sufficient, before the server ended the body
        self.cut = False  # the body was cut at max_body
        self.buffer = bytearray()
        self.status = 0  # 0 until the head is read
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.length = 0  # body bytes still to read (of the answer or the chunk), or as below
        self.chunked = False
        self.informational = 0  # 1xx answers skipped so far
        self.reusable = True
        self.complete = False

    def feed(self, data: bytes) -> bool:
        """Take the next bytes; whether the answer is complete. Raises
        ``httpx2.RemoteProtocolError`` for what is not HTTP/1.1."""
        read = len(self.body)
        if self._feed(data):
            return True
        if (
            self.enough is not None
            and not self.sufficient
            and self.status
            and len(self.body) > read
            and self.enough(self)
        ):
            self.sufficient = True
        return False

    def end_early(self) -> None:
        """End a sufficient answer here: its connection is not reused (the rest of its body
        would precede the next answer)."""
        self.early, self.complete, self.reusable = True, True, False

    def _feed(self, data: bytes) -> bool:
        self.buffer += data
        while not self.status:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise httpx2.RemoteProtocolError(f"answer head over {MAX_HEAD} bytes")
                return False
            head = bytes(self.buffer[:end])
            del self.buffer[: end + 4]
            self._head(head)
        if self.complete:
            return True
        if self.chunked:
            return self._chunks() or self._over()
        if self.length == UNTIL_END:
            self.body += self.buffer
            self.buffer.clear()
            return self._over()
        if self._over():  # a content-length past max_body is not waited for
            return True
        take = min(self.length, len(self.buffer))
        self.body += self.buffer[:take]
        del self.buffer[:take]
        self.length -= take
        if self.length == 0:
            self._done()
        return self.complete

    def _over(self) -> bool:
        """Whether the body passed ``max_body``; if so the answer ends here, cut."""
        if self.max_body is None:
            return False
        ahead = self.length if self.length > 0 and not self.chunked else 0
        if len(self.body) + max(ahead, len(self.buffer) - MAX_HEAD) <= self.max_body:
            return False
        if not self.chunked:  # what has arrived of it, for an error message's preview
            self.body += self.buffer[: max(0, self.max_body - len(self.body))]
        del self.body[self.max_body :]
        self.buffer.clear()
        self.cut, self.complete, self.reusable = True, True, False
        return True

    def end(self) -> bool:
        """The server ended the connection; whether that completes the answer."""
        if self.status and not self.chunked and self.length == UNTIL_END:
            self._done()
        return self.complete

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, space = rest[:3], rest[3:4]
        if not version.startswith(b"HTTP/1.") or not code.isdigit() or space not in b" ":
            raise httpx2.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(code)
        if status < 100:
            raise httpx2.RemoteProtocolError(f"no such HTTP status: {lines[0][:80]!r}")
        headers, length, chunked, close = _fields(lines[1:])
        if status < 200:  # informational (100 Continue): the answer follows
            self.informational += 1
            if self.informational > MAX_INFORMATIONAL:
                raise httpx2.RemoteProtocolError(f"over {MAX_INFORMATIONAL} 1xx answers")
            return
        # chunks with a length too: the chunks rule, and the connection is suspect
        reusable = version == b"HTTP/1.1" and not close and not (chunked and length is not None)
        self.status, self.headers, self.reusable = status, headers, reusable
        if status in (204, 304):
            self.length = 0
        elif chunked:
            self.chunked = True
        elif length is not None:
            self.length = length
        else:
            self.length = UNTIL_END
            self.reusable = False
        if self.length == 0 and not self.chunked:
            self._done()

    def _chunks(self) -> bool:
        buffer = self.buffer
        while True:
            if self.length > 0:  # inside a chunk: its data, then CRLF
                if len(buffer) < self.length + 2:
                    return False
                if buffer[self.length : self.length + 2] != b"\r\n":
                    raise httpx2.RemoteProtocolError("a chunk does not end with CRLF")
                self.body += buffer[: self.length]
                del buffer[: self.length + 2]
                self.length = 0
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    raise httpx2.RemoteProtocolError(f"a chunk line over {MAX_HEAD} bytes")
                return False
            if self.length == TRAILERS:  # after the last chunk: up to an empty line
                if end == 0:
                    del buffer[:2]
                    self._done()
                    return True
                del buffer[: end + 2]
                continue
            size = buffer[:end].split(b";", 1)[0].strip(b" \t")
            if not size or size.strip(HEX_DIGITS) or len(size) > 16:
                raise httpx2.RemoteProtocolError(f"bad chunk size: {bytes(size[:20])!r}")
            self.length = int(size, 16) or TRAILERS  # 0: the last chunk, trailers follow
            del buffer[: end + 2]

    def _done(self) -> None:
        self.complete = True
        if self.buffer:  # more than the answer: the connection is out of step
            self.reusable = False


def _fields(
    lines: list[bytes],
) -> tuple[list[tuple[bytes, bytes]], int | None, bool, bool]:
    """An answer's header lines as (headers, content-length, chunked?, connection: close?)."""
    headers = []
    length: int | None = None
    chunked = close = False
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise httpx2.RemoteProtocolError(f"malformed header line: {line[:80]!r}")
        value = value.strip(b" \t")
        headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length":
            if not value.isdigit() or len(value) > 18 or length not in (None, int(value)):
                raise httpx2.RemoteProtocolError(f"bad content-length: {value[:40]!r}")
            length = int(value)
        elif lowered == b"transfer-encoding":
            chunked = value.lower() == b"chunked"  # other codings: bytes we cannot read
            if not chunked:
                raise httpx2.RemoteProtocolError(f"unsupported transfer-encoding: {value!r}")
        elif lowered == b"connection" and b"close" in value.lower():
            close = True
    return headers, length, chunked, close


class Answered:
    """An answer, as the fields of ``httpx2.Response`` the relay reads. One is made for every
    model turn and tool call, and an ``httpx2.Response`` of a body already read still takes
    it through its decoding chain, most of what making one costs: only a body sent with a
    ``content-encoding`` goes through it here, to be decoded."""

    __slots__ = ("content", "extensions", "headers", "status_code")

    def __init__(
        self,
        status_code: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        self.status_code = status_code
        self.headers = httpx2.Headers(headers)
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            body = httpx2.Response(status_code, headers=self.headers, content=body).content
        self.content = body
        self.extensions = extensions or {}

    @property
    def text(self) -> str:
        """The body as text, in the charset its content type names (else UTF-8), a byte
        that is not of it replaced, as ``httpx2.Response.text``."""
        charset = _CHARSET.search(self.headers.get("content-type", ""))
        name = charset.group(1).strip("'\"") if charset else "utf-8"
        try:
            return self.content.decode(name, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


_CHARSET = re.compile(r";\s*charset=([^;\s]+)", re.IGNORECASE)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. The server's end closes
    it at once: asyncio would keep the socket half-open (it might still be written to),
    and between two waves of thousands of model turns the relay held thousands of such
    sockets, each a descriptor and a local port (with most ports taken, opening the next
    wave cost the kernel about half a millisecond a connection)."""

    # Slots, as ``Answer``: a connection per request in flight, and the idle ones kept.
    __slots__ = (
        "answer",
        "checked",
        "closed",
        "fd",
        "grace",
        "idle_since",
        "last",
        "loop",
        "timeout",
        "timer",
        "transport",
        "until",
        "waiter",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fd = -1  # its socket's, polled before it is reused (-1: no poll here)
        self.closed = False
        self.answer: Answer | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.timer: asyncio.TimerHandle | None = None  # the request's deadline (``_expire``)
        self.timeout = 0.0
        self.until = math.inf  # loop time by which the whole answer must be in
        self.last = 0.0  # loop time of the request's send, then of its latest incomplete bytes
        self.checked = False  # the deadline passed; a turn of the loop to read what is there
        self.idle_since = 0.0  # monotonic seconds, while kept alive for the next request
        self.grace: asyncio.TimerHandle | None = None  # a sufficient answer's END_GRACE_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(select, "poll"):
            self.fd = sock.fileno()

    def data_received(self, data: bytes) -> None:
        answer, waiter = self.answer, self.waiter
        if answer is None or waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        try:
            complete = answer.feed(data)
        except httpx2.RemoteProtocolError as err:
            self._fail(err)
            return
        if complete:
            waiter.set_result(answer)
            return
        if self.loop is not None:  # the read timeout counts from the latest bytes
            self.last = self.loop.time()
            self.checked = False
        if answer.sufficient and self.loop is not None and self.grace is None:
            self.grace = self.loop.call_later(END_GRACE_S, self._end_early, answer)

    def _end_early(self, answer: Answer) -> None:
        """The grace for a sufficient answer's body to end is over (``END_GRACE_S``)."""
        if self.answer is answer and self.waiter is not None and not self.waiter.done():
            answer.end_early()
            self.waiter.set_result(answer)

    def _expire(self) -> None:
        """The request's timer: a timeout only once what the socket holds has been read.
        Bytes since the timer was set move the deadline; a deadline passed gets one more
        turn of the loop first (a timer due now runs after that turn's I/O pass, which reads
        every socket that holds bytes: an answer that came while the process was paused is
        taken, not lost); bytes read then move it again, none make it a timeout."""
        self.timer = None
        waiter, loop = self.waiter, self.loop
        if waiter is None or waiter.done() or loop is None:
            return
        now = loop.time()
        due = min(self.last + self.timeout, self.until)
        if due > now:
            self.timer = loop.call_at(due, self._expire)
            return
        if not self.checked:
            self.checked = True
            self.timer = loop.call_at(now, self._expire)
            return
        if self.transport is not None and self.transport.get_write_buffer_size():
            self._fail(httpx2.WriteTimeout(f"request not sent within {self.timeout}s"))
        elif self.last + self.timeout > self.until:
            self._fail(httpx2.ReadTimeout("no whole answer within the request's time"))
        else:
            self._fail(httpx2.ReadTimeout(f"no answer within {self.timeout}s"))

    def eof_received(self) -> bool:
        answer, waiter = self.answer, self.waiter
        if answer is not None and waiter is not None and not waiter.done():
            if answer.end():
                waiter.set_result(answer)
            elif answer.status:
                self._fail(httpx2.RemoteProtocolError("the server ended the answer early"))
            else:
                self._fail(httpx2.RemoteProtocolError("the server ended without an answer"))
        self.closed = True
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if exc is None:
                self._fail(httpx2.RemoteProtocolError("the connection closed without an answer"))
            else:
                self._fail(httpx2.ReadError(f"{type(exc).__name__}: {exc}"))

    def usable(self) -> bool:
        """Whether it can carry a request: open, and nothing (the server's end, which asyncio
        has not read yet) waiting on its socket. Polled as httpcore's backends poll, with a
        poll object made for the check: one kept per connection would be kept for each
        request in flight too, thousands at once."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        if self.fd < 0:
            return True
        try:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def send(
        self,
        data: list[bytes],
        timeout: float,
        max_body: int | None = None,
        enough: Enough | None = None,
        until: float = math.inf,
    ) -> asyncio.Future[Answer]:
        """Send ``data`` (a whole request, taken out of the list so that nothing keeps it
        while the answer is awaited); the future of its whole answer (or of the first
        ``max_body`` bytes of its body, or of what ``enough`` says is enough: ``Answer``),
        to await, then ``release`` in any case. No bytes may arrive for ``timeout``
        seconds, and the answer must be in by ``until`` (the loop's time). Either passed is
        a timeout only once what the connection holds has been read (``_expire``). A
        function, not a coroutine: one more frame kept by every request in flight."""
        if self.closed or self.transport is None:  # ended by the server since it was opened
            raise httpx2.ConnectError("the server closed the connection before the request")
        loop = self.loop = asyncio.get_running_loop()
        self.answer, self.waiter = Answer(max_body, enough), loop.create_future()
        self.timeout, self.until, self.checked = timeout, until, False
        self.last = loop.time()
        self.timer = loop.call_at(min(self.last + timeout, until), self._expire)
        self.transport.write(data.pop())  # the transport copies what it cannot send at once
        return self.waiter

    def release(self) -> None:
        """The request is over (answered, failed or cancelled): its answer is the caller's
        now, not the idle connection's to keep, and its timers end."""
        self.answer = self.waiter = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None

    def settled(self) -> bool:
        """Open, with the whole request sent: a server may answer before it has read the
        body, and what is still unsent would precede the next request."""
        return (
            not self.closed
            and self.transport is not None
            and not (self.transport.get_write_buffer_size())
        )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, err: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
        self.close()


@functools.cache
def verified_tls() -> ssl.SSLContext:
    """The context of every https request, shared: making one reads the CA bundle (tens of
    milliseconds), which a relay that never calls https should not pay at its start."""
    return ssl.create_default_context()


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> tuple[tuple[str, int, bool], bytes]:
    """``url`` as its origin (host, port, TLS?) and the request's first two lines."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise httpx2.UnsupportedProtocol(f"not an http:// or https:// URL: {url!r}")
    tls = parts.scheme == "https"
    host = parts.hostname.encode("idna").decode()
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if parts.port:
        host += f":{parts.port}"
    path = quote(parts.path or "/", safe=URL_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=URL_SAFE)
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\n"
    return (parts.hostname, parts.port or (443 if tls else 80), tls), head.encode()


def _headers(headers: dict[str, str], length: int) -> bytes:
    """The header lines of a request: the caller's (a name must be an HTTP token and a value
    hold no line break: a header that would inject another is refused, not sent), then its
    ``content-length``. ``host`` and ``content-length`` are the poster's to set."""
    lines = []
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name) or "\r" in value or "\n" in value:
            raise httpx2.LocalProtocolError(f"header {name!r} is not a valid HTTP header")
        if name.lower() not in OWN_HEADERS:
            lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode() + b"content-length: %d\r\n\r\n" % length


async def open_connection(
    host: str, port: int, tls: ssl.SSLContext | None
) -> tuple[asyncio.BaseTransport, Connection]:
    """A connection to ``host:port``, over TLS (verified for ``host``) if ``tls``."""
    loop = asyncio.get_running_loop()
    return await loop.create_connection(Connection, host, port, ssl=tls)


class Poster:
    """The POSTs of a relay process, each on a kept-alive connection to its origin when
    one is free (the most recently used first: warm connections are reused and the others
    age out, ``close_idle``) and on a new one otherwise.

    At most ``CONNECTING`` connections are being opened at once: a relay that claims
    thousands of effects together would otherwise open thousands of connections in one
    burst, overflow the server's accept queue, and have the kernel reset connections that
    already carried a request (seen: every one of 10,000 requests failed, ``Broken pipe``),
    an ambiguous outcome for each call. Requests on open connections are not held back.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # None: verified_tls(), made at the first https request
        self.idle: dict[tuple[str, int, bool], list[Connection]] = {}
        self.busy: set[Connection] = set()
        self.connecting = asyncio.Semaphore(CONNECTING)  # bound to a loop at its first use

    async def post(
        self,
        url: str,
        *,
        timeout: float,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        max_body: int | None = None,
        enough: Enough | None = None,
        total: float | None = None,
        repeatable: bool = False,
    ) -> Answered:
        """``timeout`` (seconds) bounds the connect, the send, and each wait for bytes of
        the answer; ``total``, if given, the whole request, from its connect to its answer's
        end (an event stream that trickles). Neither ends a request before what its socket
        already holds has been read (the module docstring). ``json`` is sent as
        ``application/json`` (compact, as ``httpx2``). An answer whose body passes
        ``max_body`` bytes comes back cut there, with ``extensions["body_cut_at"] =
        max_body`` (the module docstring). ``enough``: see
        ``Answer``; an answer it ended comes back with ``extensions["ended_early"]``, its
        connection closed. ``repeatable``: the caller sends the request again when it is
        lost, so it may take a connection idle up to ``REPEATABLE_IDLE_S`` (else ``IDLE_S``)."""
        origin, line = _target(url)
        sent = dict(headers or {})
        if content is None:
            content = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            if not any(name.lower() == "content-type" for name in sent):
                sent["content-type"] = "application/json"
        # The request's bytes are held by the connection only until they are written:
        # while a request waits for its answer (a model turn: seconds to minutes), neither
        # its encoded body, its headers nor the whole request stays alive in this frame.
        data = [line + _headers(sent, len(content)) + content]
        del content, json, headers, sent
        until = math.inf if total is None else asyncio.get_running_loop().time() + total
        connection = self._kept(
            origin, REPEATABLE_IDLE_S if repeatable else IDLE_S
        ) or await self._connect(origin, min(timeout, total or timeout))
        self.busy.add(connection)
        try:
            try:
                answer = await connection.send(data, timeout, max_body, enough, until)
            finally:
                connection.release()
        except BaseException:
            connection.close()
            raise
        finally:
            self.busy.discard(connection)
        if answer.reusable and connection.settled():
            connection.idle_since = time.monotonic()
            self.idle.setdefault(origin, []).append(connection)
        else:
            connection.close()
        extensions: dict[str, Any] | None = None
        if answer.cut:
            extensions = {"body_cut_at": max_body}
        elif answer.early:
            extensions = {"ended_early": True}
        return Answered(answer.status, answer.headers, bytes(answer.body), extensions)

    def close_idle(self, now: float) -> int:
        """Close the connections idle since before ``now - REPEATABLE_IDLE_S`` (no request
        may take them); returns how many.
        Servers end idle connections too, but not all do, and a burst's connections would
        otherwise hold their sockets (and the server's) for good."""
        closed = 0
        for origin, idle in list(self.idle.items()):
            kept = []
            for connection in idle:
                if connection.closed:
                    continue
                if now - connection.idle_since > REPEATABLE_IDLE_S:
                    connection.close()
                    closed += 1
                else:
                    kept.append(connection)
            if kept:
                self.idle[origin] = kept
            else:
                del self.idle[origin]
        return closed

    async def aclose(self) -> None:
        for idle in self.idle.values():
            for connection in idle:
                connection.close()
        self.idle.clear()
        for connection in list(self.busy):
            connection.close()

    def _kept(self, origin: tuple[str, int, bool], most_idle_s: float) -> Connection | None:
        """The connection of ``origin`` used last, if it has been idle under
        ``most_idle_s`` and is open; one too old for this request but not for a repeatable
        one stays kept (the others are older still: the list is in order of use)."""
        idle, now = self.idle.get(origin), time.monotonic()
        while idle:
            connection = idle[-1]
            waited = now - connection.idle_since
            if waited < most_idle_s and connection.usable():
                return idle.pop()
            if waited < REPEATABLE_IDLE_S and connection.usable():
                return None
            idle.pop().close()
        return None

    async def _connect(self, origin: tuple[str, int, bool], timeout: float) -> Connection:
        host, port, secure = origin
        try:
            async with asyncio.timeout(timeout), self.connecting:
                tls = (self.tls or verified_tls()) if secure else None
                _, connection = await open_connection(host, port, tls)
        except TimeoutError as err:
            raise httpx2.ConnectTimeout(f"not connected within {timeout}s") from err
        except OSError as err:  # refused, unreachable, and TLS refused (ssl.SSLError)
            raise httpx2.ConnectError(f"{type(err).__name__}: {err}") from err
        return connection
