"""MCP tool servers as the relay calls them: one session per server per process, on the
event loop, through the official ``mcp`` SDK.

A session is opened (``initialize``) once per server and kept: every call of that server's
tools from this process goes over it, as tasks on the engine's loop, at most the server's
``max_concurrency`` at once. A session is owned by a task of its own, because the SDK's
transports are anyio task groups that must be entered and left by one task; the calls only
send over it. A session that ended (a stdio server that died, an HTTP server whose
connection failed) is opened again by the next call: for stdio that starts the child
process again.

What a call's outcome means follows ``relay.executors``' classes for HTTP tools:

- the session cannot be opened, or the POST of the call never connected: the request was
  certainly not sent (``unsent``: the next attempt is a plain call, in every mode);
- the server answered HTTP 408, 429 or 503: it says it did not process the request; or
  404: it no longer knows the session (it restarted), so a new one is opened;
- ``isError: true``, JSON-RPC "invalid params" or "method not found", an HTTP 4xx, a
  request for input mid-call, an answer over the size cap: the tool answered, a terminal
  error result the model sees;
- no answer within the tool's timeout, or the connection lost after the request left, or
  any other JSON-RPC error, or an answer that is not a tool result: ambiguous, handled by
  the tool's idempotency mode.

The order that keeps the dispatch mark true: the session is opened and a slot of the
server's limit taken *before* the mark is committed, so the mark's time is when the request
leaves (the settle wait of ``relay.executors`` counts from it), and a relay that dies while
waiting for a slot or a session has marked nothing.

Every ``tools/call`` carries, in ``_meta`` under ``META_KEY``, the call's idempotency key
and ids, and over HTTP the same key as the ``Idempotency-Key`` header (with the call's
``traceparent`` and its credential's header). The SDK sends a call's POST from a task it
starts in the caller's context, so a context variable carries those headers from the call
to the HTTP transport below the SDK, which also notes there whether the request connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

import anyio
import httpx2
import mcp_types
from mcp.client.extension import UnexpectedClaimedResult
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from outbox import config as outbox_config
from outbox import credentials, mcpservers, storable
from outbox.logs import log
from outbox.relay.outcomes import (
    Claimed,
    Outcome,
    ambiguous,
    error_result,
    result,
    retry,
)

logger = logging.getLogger("relay.mcp")
NOT_PROCESSED = {408, 429, 503}  # HTTP statuses that say the request was not processed
# The answer to a request of a session the server no longer knows (it restarted, or ended
# the session): the request was not processed, and the client starts a new session (MCP's
# streamable HTTP transport says so).
SESSION_GONE = 404
OPEN_TIMEOUT_S = 30.0  # longest wait for a session to open (connect + initialize)
CLOSE_TIMEOUT_S = 5.0  # longest wait for a session to close (a stdio child is then killed)
# An SSE event of a result may be as large as a result may be, twice (text content and
# structured content say the same), with room for the JSON-RPC envelope.
MAX_EVENT_BYTES = 2 * outbox_config.MAX_PAYLOAD_BYTES + 64 * 1024
CLIENT_INFO = mcp_types.Implementation(name="agent-outbox", version="1")


# -- what the HTTP transport sees of a call ---------------------------------------------


@dataclass
class Exchange:
    """One ``tools/call`` as the HTTP layer saw it: the headers it adds to the POST, whether
    the POST certainly never reached the server, and the HTTP status of its answer."""

    headers: dict[str, str]
    unsent: bool = False
    status: int | None = None


EXCHANGE: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "mcp_exchange", default=None
)


class CallTransport(httpx2.AsyncHTTPTransport):
    """The HTTP transport under the SDK: a call's headers on its POST, and what became of it."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        exchange = EXCHANGE.get()
        if exchange is None or request.method != "POST":
            return await super().handle_async_request(request)
        request.headers.update(exchange.headers)
        try:
            response = await super().handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout):
            exchange.unsent = True
            raise
        exchange.status = response.status_code
        return response


# -- servers and their sessions ---------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """How to reach one registered MCP server (a row of ``mcp_servers``, as the claim or
    ``outbox.mcpservers`` gives it)."""

    tenant_id: str
    name: str
    transport: str  # "http" or "stdio"
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    max_concurrency: int = mcpservers.DEFAULT_MAX_CONCURRENCY

    @classmethod
    def of(cls, row: dict[str, Any]) -> Server:
        return cls(
            tenant_id=row["tenant_id"],
            name=row["name"],
            transport=row["transport"],
            url=row.get("url"),
            headers=dict(row.get("headers") or {}),
            command=list(row.get("command") or []),
            env=dict(row.get("env") or {}),
            max_concurrency=int(row.get("max_concurrency") or mcpservers.DEFAULT_MAX_CONCURRENCY),
        )

    def key(self, secret_headers: dict[str, str]) -> str:
        """One session per server, configuration and credential: a server registered again
        with another URL or command, or a rotated credential, gets a new session."""
        text = json.dumps([dataclasses.asdict(self), secret_headers], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def where(self) -> str:
        return self.url or " ".join(self.command)


class Session:
    """One open MCP session: its owner task holds the transport and the SDK session, and
    ends them when ``close`` is called or the connection ends by itself."""

    def __init__(self, server: Server, secret_headers: dict[str, str]) -> None:
        self.server = server
        self.secret_headers = secret_headers
        self.slots = asyncio.Semaphore(server.max_concurrency)
        self.client: ClientSession | None = None
        self.stop = asyncio.Event()
        self.ended = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def open(self, timeout_s: float = OPEN_TIMEOUT_S) -> None:
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._own(ready), name=f"mcp:{self.server.name}")
        try:
            async with asyncio.timeout(timeout_s):
                self.client = await asyncio.shield(ready)
        except BaseException:
            await self.close()
            raise

    def alive(self) -> bool:
        """Whether calls may go over it. The SDK refuses a request on a connection that
        ended before sending it, with the error it also gives a request whose answer was
        lost, so a session whose connection ended is replaced before the call, not after."""
        if self.client is None or self.ended.is_set() or self.stop.is_set():
            return False
        dispatcher = getattr(self.client, "_dispatcher", None)
        return not getattr(dispatcher, "_closed", False)

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None and not self.task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(self.task)
            if not self.task.done():
                self.task.cancel()

    async def _own(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with (
                self._transport() as (read, write),
                ClientSession(read, write, client_info=CLIENT_INFO) as client,
            ):
                await client.initialize()
                ready.set_result(client)
                await self.stop.wait()
        except BaseException as err:  # the transport's task group ends as a group of errors
            if not ready.done():
                if isinstance(err, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(_first(err))
            elif not self.stop.is_set():
                log(
                    logger,
                    logging.WARNING,
                    "mcp.session_ended",
                    server=self.server.name,
                    tenant_id=self.server.tenant_id,
                    error=repr(_first(err)),
                )
            if isinstance(err, asyncio.CancelledError):
                raise
        finally:
            self.ended.set()

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.transport == "stdio":
            params = StdioServerParameters(
                command=server.command[0], args=server.command[1:], env=server.env or None
            )
            return stdio_client(params, errlog=_errlog())
        return _http(server, self.secret_headers)


@contextlib.asynccontextmanager
async def _http(server: Server, secret_headers: dict[str, str]) -> AsyncIterator[Any]:
    assert server.url is not None
    limits = httpx2.Limits(max_connections=server.max_concurrency + 2)
    client = httpx2.AsyncClient(
        transport=CallTransport(limits=limits),
        headers={**server.headers, **secret_headers},
        # Each call bounds its own wait (the tool's timeout); a POST's read is left open.
        timeout=httpx2.Timeout(OPEN_TIMEOUT_S, read=None),
    )
    async with (
        client,
        streamable_http_client(
            server.url, http_client=client, max_sse_event_size=MAX_EVENT_BYTES
        ) as streams,
    ):
        yield streams


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the relay's, which a child process can only
    inherit as a file descriptor (a ``sys.stderr`` replaced by one without, as a test
    runner's capture is, gives way to the process's own)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or open(os.devnull, "w")  # the children's, for good
    return sys.stderr


def _first(err: BaseException) -> BaseException:
    """The first error of an exception group (what went wrong), else ``err``."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


class Sessions:
    """The MCP sessions of one relay process, by server, opened on first use and kept."""

    def __init__(self) -> None:
        self.open: dict[str, Session] = {}
        self.opening: dict[str, asyncio.Future[Session]] = {}
        self.closing: set[asyncio.Task[None]] = set()  # ended sessions being closed

    async def get(self, server: Server, secret_headers: dict[str, str]) -> Session:
        """The server's live session, opened now if it has none (callers that ask at the
        same time share one opening); raises what opening it raised."""
        key = server.key(secret_headers)
        session = self.open.get(key)
        if session is not None and session.alive():
            return session
        if session is not None:  # ended by itself (a stdio server died): started again
            del self.open[key]
            closing = asyncio.get_running_loop().create_task(session.close())
            self.closing.add(closing)
            closing.add_done_callback(self.closing.discard)
            log(
                logger,
                logging.INFO,
                "mcp.session_restarted",
                server=server.name,
                tenant_id=server.tenant_id,
            )
        opening = self.opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(self._open(key, server, secret_headers))
            self.opening[key] = opening

            def opened(done: asyncio.Future[Session]) -> None:
                self.opening.pop(key, None)
                if not done.cancelled():
                    done.exception()  # retrieved here: its callers may all have gone

            opening.add_done_callback(opened)
        return await asyncio.shield(opening)

    async def _open(self, key: str, server: Server, secret_headers: dict[str, str]) -> Session:
        session = Session(server, secret_headers)
        await session.open()
        self.open[key] = session
        return session

    async def aclose(self) -> None:
        sessions, self.open = list(self.open.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


# -- listing (registration) -------------------------------------------------------------


async def list_tools(server: Server, secret_headers: dict[str, str] | None = None) -> list[Any]:
    """The server's ``tools/list`` (every page), as the SDK's ``Tool`` models."""
    session = Session(server, secret_headers or {})
    await session.open()
    try:
        assert session.client is not None
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                page = await session.client.list_tools(params=params)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
    finally:
        await session.close()


# -- calls ------------------------------------------------------------------------------

MarkDispatched = Callable[[Claimed], Awaitable[bool]]


def meta(row: Claimed, traceparent: str) -> dict[str, Any]:
    """The ``_meta`` of a call: our ids under ``META_KEY``, and its trace context."""
    return {
        mcpservers.META_KEY: {
            "idempotency_key": row.idempotency_key,
            "run_id": str(row.run_id),
            "tool_call_id": row.tool_call_id,
            "attempt": row.attempt,
            "correlation_id": row.correlation_id,
        },
        "traceparent": traceparent,
    }


class McpCaller:
    """Runs the calls of ``mcp`` tools for ``relay.executors.ToolExecutor``."""

    def __init__(self, mark_dispatched: MarkDispatched) -> None:
        self.sessions = Sessions()
        self.mark_dispatched = mark_dispatched

    async def call(
        self, row: Claimed, secret: credentials.Secret | None, headers: dict[str, str]
    ) -> Outcome:
        """One attempt of ``row``'s call (the executor already decided it may run);
        ``headers``: what an HTTP tool would be sent (key, ids, trace, credential)."""
        found = row.mcp or {}
        if not found.get("server"):
            return error_result(
                row,
                f"MCP server {found.get('missing')!r} of tool {row.tool_name!r} is no longer "
                "registered (`outbox mcp list`); the call was not executed",
            )
        server = Server.of(found["server"])
        secret_headers = secret.headers() if secret is not None else {}
        try:
            session = await self.sessions.get(server, secret_headers)
        except Exception as err:
            return retry(
                row,
                f"could not open a session with MCP server {server.name} at {server.where()}: "
                f"{describe(err)}",
                unsent=True,
            )
        async with session.slots:
            if not await self.mark_dispatched(row):
                return Outcome(row, "lost", error="lease lost before dispatch; not called")
            exchange = Exchange(headers)
            token = EXCHANGE.set(exchange)
            try:
                return await self._send(row, session, server, found["tool"], exchange)
            finally:
                EXCHANGE.reset(token)

    async def _send(
        self, row: Claimed, session: Session, server: Server, tool: str, exchange: Exchange
    ) -> Outcome:
        assert session.client is not None
        timeout_s = row.timeout_s or 30.0
        where = f"MCP server {server.name} ({server.where()})"
        try:
            # The SDK's own read timeout, and ours around it should the SDK not end the wait.
            async with asyncio.timeout(timeout_s + 1.0):
                answer = await session.client.call_tool(
                    tool,
                    row.arguments if isinstance(row.arguments, dict) else {},
                    read_timeout_seconds=timeout_s,
                    meta=cast(
                        mcp_types.RequestParamsMeta,
                        meta(row, exchange.headers.get("traceparent", "")),
                    ),
                )
        except MCPError as err:
            if exchange.status == SESSION_GONE:
                session.stop.set()  # the next call opens a new one
            return _error(row, err, exchange, where, timeout_s)
        except (RuntimeError, UnexpectedClaimedResult) as err:
            # The server asked for input mid-call (elicitation, sampling) or answered with an
            # extension's result: an answer, and not one the relay can act on.
            return error_result(row, f"{where} answered what the relay cannot use: {err}")
        except ValidationError as err:
            return ambiguous(
                row,
                f"{where} answered something that is not a tool result: {_first_line(err)}",
                answered=True,
            )
        except TimeoutError:
            return ambiguous(row, f"no answer from {where} within {timeout_s}s")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as err:
            if exchange.unsent:
                return retry(row, f"could not reach {where}: {describe(err)}", unsent=True)
            return ambiguous(row, f"connection to {where} broke: {describe(err)}")
        return normalise(row, answer)


def _error(
    row: Claimed, err: MCPError, exchange: Exchange, where: str, timeout_s: float
) -> Outcome:
    """What a JSON-RPC error (the server's, or the SDK's for a failed exchange) means."""
    text = f"{err.code}: {err.message}"
    if exchange.unsent:
        return retry(row, f"could not reach {where}: {text}", unsent=True)
    if exchange.status in NOT_PROCESSED:
        return retry(row, f"HTTP {exchange.status} from {where}: {text}", unsent=True)
    if exchange.status == SESSION_GONE:
        return retry(
            row,
            f"{where} no longer knows the session (HTTP 404: it restarted or ended it); "
            "a new one is opened for the next attempt",
            unsent=True,
        )
    if err.code in (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND):
        return error_result(row, f"{row.tool_name} refused the call ({text})")
    if exchange.status is not None and 400 <= exchange.status < 500:
        return error_result(row, f"HTTP {exchange.status} from {where}: {text}")
    if err.code == mcp_types.REQUEST_TIMEOUT:
        return ambiguous(row, f"no answer from {where} within {timeout_s}s")
    if err.code == mcp_types.CONNECTION_CLOSED and "byte limit" in err.message:
        # The SDK stopped reading an answer larger than MAX_EVENT_BYTES (its message is
        # the only sign of it): the tool did answer, too much, as an HTTP tool's body cut.
        return error_result(
            row,
            f"the answer of {where} is over {MAX_EVENT_BYTES} bytes (not read further), over "
            f"the cap of a tool result ({outbox_config.MAX_PAYLOAD_BYTES} bytes)",
        )
    if err.code == mcp_types.CONNECTION_CLOSED:
        return ambiguous(row, f"the connection to {where} ended before its answer ({text})")
    return ambiguous(row, f"{where} answered an error: {text}", answered=True)


def normalise(row: Claimed, answer: Any) -> Outcome:
    """A ``CallToolResult`` as a tool result: its content and structured content kept as
    the server sent them, ``isError`` as an error result the model sees."""
    content = [
        item.model_dump(by_alias=True, mode="json", exclude_none=True)
        for item in getattr(answer, "content", None) or []
    ]
    if getattr(answer, "is_error", False):
        said = " ".join(str(c.get("text", "")) for c in content if c.get("type") == "text")
        return error_result(row, f"{row.tool_name} answered an error: {said or '(no text)'}")
    output: dict[str, Any] = {"content": content}
    structured = getattr(answer, "structured_content", None)
    if structured is not None:
        output["structuredContent"] = structured
    try:
        size = len(storable.dumps(output, "tool result").encode())
    except storable.NotStorable as err:
        return error_result(row, err.args[0])
    if size > outbox_config.MAX_PAYLOAD_BYTES:
        return error_result(
            row,
            f"tool result is {size} bytes, over the cap of {outbox_config.MAX_PAYLOAD_BYTES} bytes",
        )
    return result(row, output)


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def describe(err: BaseException) -> str:
    err = _first(err)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
