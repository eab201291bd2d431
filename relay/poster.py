"""A POST through ``httpcore2`` on asyncio: what the relay's effects send, at the least CPU.

Every model turn and HTTP tool call of a relay process is a request on its one event
loop, so each request's CPU is the relay's throughput. Measured per request on this 2-core
machine under load (4,000 POSTs, 400 at once; docs/benchmarks.md, 2026-11-25):

| path | CPU per request |
|---|---:|
| the ``openai`` SDK's client (model calls, until 2026-11-25) | 3.0 ms |
| ``httpx2.AsyncClient.post`` | 1.9-2.1 ms |
| ``httpx2``'s transport alone | 1.5-1.7 ms |
| ``httpcore2``'s pool on its default network backend (``anyio``) | 1.3-1.5 ms |
| ``httpcore2``'s pool on ``AsyncioBackend`` (here) | 0.9-1.2 ms |

The layers above ``httpcore2`` do what the relay does not use (URL merging, auth,
redirects, cookies, event hooks), and ``anyio``'s cancel scopes, typed attributes and task
lookups cost a fifth of a request: this thread only ever runs asyncio, so the network
backend is asyncio's own streams, with ``asyncio.timeout`` for each phase. It is the same
HTTP stack (``httpcore2``'s connection pool, HTTP/1.1 by ``h11``); only the socket layer is
asyncio's. To the executors ``Poster.post`` looks like ``httpx2.AsyncClient.post``: the
answer is an ``httpx2.Response`` (read whole) and the errors are ``httpx2``'s
(``ConnectError``, ``ReadTimeout``, ...: the classes the executors' failure classes are
built on, translated one to one from ``httpcore2``'s, which have the same names).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

SHARD_CONNECTIONS = 4  # connections per pool (relay.engine.Shards says why so few)
TLS = ssl.create_default_context()  # shared: a context per pool took milliseconds to build
READ_CHUNK = 65536  # bytes; what httpcore2 asks for per read
CONNECTING = 64  # connections being opened at once per process (AsyncioBackend says why)


class AsyncioStream(httpcore2.AsyncNetworkStream):
    """A connection for ``httpcore2``: an asyncio stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self.reader.read(max_bytes)
        except TimeoutError as err:
            raise httpcore2.ReadTimeout(err) from err
        except OSError as err:
            raise httpcore2.ReadError(err) from err

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(buffer)
                await self.writer.drain()
        except TimeoutError as err:
            raise httpcore2.WriteTimeout(err) from err
        except OSError as err:
            raise httpcore2.WriteError(err) from err

    async def aclose(self) -> None:
        self.writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self.writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as err:
            self.writer.close()
            raise httpcore2.ConnectTimeout(err) from err
        except (OSError, ssl.SSLError) as err:
            self.writer.close()
            raise httpcore2.ConnectError(err) from err
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle keep-alive connection the server closed?
            # Asked before a connection is reused. The stream shows an end asyncio has
            # read; the socket (polled, as httpcore2's own backends do) one that arrived
            # since the loop last looked: a closed peer keeps a socket readable.
            sock = self.writer.get_extra_info("socket")
            return (
                self.reader.at_eof() or self.writer.is_closing() or sock is None or _readable(sock)
            )
        return self.writer.get_extra_info(
            {
                "ssl_object": "ssl_object",
                "client_addr": "sockname",
                "server_addr": "peername",
                "socket": "socket",
            }.get(info, info)
        )


def _readable(sock: Any) -> bool:
    """Whether a read would not block: data or the peer's end is waiting (no wait here)."""
    try:
        if not hasattr(select, "poll"):  # Windows: select(), which sees fds under 1,024 only
            return bool(select.select([sock], [], [], 0)[0])
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed meanwhile: as good as readable
        return True


class ClosingProtocol(asyncio.StreamReaderProtocol):
    """``asyncio.open_connection``'s protocol, but a connection the server ends is closed
    at once. asyncio keeps a socket half-open after the peer's end (it might still be
    written to), and a pool only looks at an idle connection when it next hands it out:
    with servers that end idle keep-alive connections after a few seconds (uvicorn: 5 s),
    a relay between two waves of thousands of model turns held thousands of such sockets,
    each a file descriptor and a local port. With most local ports taken, every new
    connection's port search cost the kernel about half a millisecond (measured: the
    event loop thread spent 80 % of its time in the kernel while it opened the second
    wave). What the server sent before its end stays readable."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False  # close the transport


async def open_connection(
    host: str, port: int, local: tuple[str, int] | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection``, on a ``ClosingProtocol``."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
    transport, protocol = await loop.create_connection(
        lambda: ClosingProtocol(reader, loop=loop), host, port, local_addr=local
    )
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
    """``httpcore2``'s network backend on asyncio's streams (see the module docstring).

    At most ``CONNECTING`` connections of the process are being opened at once (all its
    pools share this backend): a relay that claims thousands of effects together would
    otherwise open thousands of connections in one burst, overflow the server's accept
    queue, and have the kernel reset connections that already carried a request (seen:
    every one of 10,000 requests failed, ``Broken pipe``), an ambiguous outcome for each
    call. Requests on open connections are not held back.
    """

    def __init__(self) -> None:
        self.connecting: asyncio.Semaphore | None = None  # made on the loop that uses it

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        if self.connecting is None:
            self.connecting = asyncio.Semaphore(CONNECTING)
        try:
            async with asyncio.timeout(timeout), self.connecting:
                reader, writer = await open_connection(host, port, local)
        except TimeoutError as err:
            raise httpcore2.ConnectTimeout(err) from err
        except OSError as err:
            raise httpcore2.ConnectError(err) from err
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# httpcore2's errors as httpx2's: the same names, one to one (subclasses first).
_AS_HTTPX: list[tuple[type[Exception], type[httpx2.TransportError]]] = [
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
]


def as_httpx(err: Exception) -> Exception:
    """``httpx2``'s class for one of ``httpcore2``'s errors (others as they are)."""
    for core, ours in _AS_HTTPX:
        if isinstance(err, core):
            return ours(str(err) or type(err).__name__)
    return err


class Poster:
    """POSTs through one ``httpcore2`` pool of ``SHARD_CONNECTIONS`` connections:
    ``httpx2.AsyncClient.post``'s answer and errors, without the client's layers."""

    def __init__(self, backend: AsyncioBackend | None = None, tls: ssl.SSLContext = TLS) -> None:
        self.pool = httpcore2.AsyncConnectionPool(
            ssl_context=tls,
            max_connections=SHARD_CONNECTIONS,
            max_keepalive_connections=SHARD_CONNECTIONS,
            network_backend=backend or AsyncioBackend(),
        )

    async def post(
        self,
        url: str,
        *,
        timeout: float,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx2.Response:
        """``timeout`` (seconds) bounds each phase: connect, write, each read, pool wait.
        ``json`` is sent as ``application/json`` (compact, as ``httpx2`` sends it)."""
        sent: dict[bytes | str, bytes | str] = dict((headers or {}).items())
        if content is None:
            content = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            sent.setdefault("content-type", "application/json")
        phases = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        try:
            answer = await self.pool.request(
                "POST", url, headers=sent, content=content, extensions={"timeout": phases}
            )
        except Exception as err:
            raise as_httpx(err) from err
        return httpx2.Response(answer.status, headers=answer.headers, content=answer.content)

    async def aclose(self) -> None:
        await self.pool.aclose()
