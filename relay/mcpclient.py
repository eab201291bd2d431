"""MCP tool servers as the relay calls them: one session per server per process, on the
event loop. A server over streamable HTTP is spoken to by ``HttpSession`` below, written on
the spec over the relay's own HTTP client (``relay.poster``); a stdio server through the
official ``mcp`` SDK, which also lists tools for ``outbox mcp add``/``sync``. The SDK cost
the relay's loop six to eight times an HTTP tool call's CPU per call (docs/mcp.md has the
figures), and a call here costs about what an HTTP tool call costs. The SDK is imported
inside the code that uses it: importing it costs a process about half a second of CPU, and
a relay that calls no stdio server never needs it.

A session is opened (``initialize``, then ``notifications/initialized``) once per server
and kept: every call of that server's tools from this process goes over it, as tasks on the
engine's loop, at most the server's ``max_concurrency`` at once. A session that ended (a
stdio server that died; an HTTP server that no longer knows the session, answering 404, or
that could not be reached) is opened again by the next call: for stdio that starts the
child process again.

What a call's outcome means follows ``relay.executors``' classes for HTTP tools:

- the session cannot be opened, or the POST of the call never connected: the request was
  certainly not sent (``unsent``: the next attempt is a plain call, in every mode);
- the server answered HTTP 408, 429 or 503: it says it did not process the request; or
  404: it no longer knows the session (it restarted), so a new one is opened;
- ``isError: true``, JSON-RPC "invalid params" or "method not found", an HTTP 4xx, a
  request for input mid-call (stdio), an answer over the size cap: the tool answered, a
  terminal error result the model sees;
- no answer within the tool's timeout, or the connection lost after the request left, or
  any other JSON-RPC error, or an answer that is not a tool result: ambiguous, handled by
  the tool's idempotency mode.

The order that keeps the dispatch mark true: the session is opened and a slot of the
server's limit taken *before* the mark is committed, so the mark's time is when the request
leaves (the settle wait of ``relay.executors`` counts from it), and a relay that dies while
waiting for a slot or a session has marked nothing.

Every ``tools/call`` carries, in ``_meta`` under ``META_KEY``, the call's idempotency key
and ids, and over HTTP the headers an HTTP tool gets (``Idempotency-Key``, the call's ids,
``traceparent``, its credential's header).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

import httpx2
from pydantic import ValidationError

from outbox import config as outbox_config
from outbox import credentials, mcpservers, storable
from outbox.logs import log
from outbox.relay.outcomes import (
    GATEWAY_ANSWERS,
    NOT_PROCESSED,
    Claimed,
    Outcome,
    ambiguous,
    deadline_left_s,
    error_result,
    past_deadline,
    result,
    retry,
    retry_after_s,
)
from outbox.relay.poster import Answer, Answered, Poster

if TYPE_CHECKING:  # the SDK is imported where a stdio server or a listing needs it
    from mcp.client.session import ClientSession
    from mcp.shared.exceptions import MCPError

logger = logging.getLogger("relay.mcp")
# The answer to a request of a session the server no longer knows (it restarted, or ended
# the session): the request was not processed, and the client starts a new session (MCP's
# streamable HTTP transport says so).
SESSION_GONE = 404
OPEN_TIMEOUT_S = 30.0  # longest wait for a session to open (connect + initialize)
CLOSE_TIMEOUT_S = 5.0  # longest wait for a session to close (a stdio child is then killed)
# An SSE event of a result may be as large as a result may be, twice (text content and
# structured content say the same), with room for the JSON-RPC envelope.
MAX_EVENT_BYTES = 2 * outbox_config.MAX_PAYLOAD_BYTES + 64 * 1024
CLIENT_NAME, CLIENT_VERSION = "agent-outbox", "1"  # the clientInfo of ``initialize``
# Turns of the loop an answer already in a stdio server's pipe is given to reach its call
# once the call's timeout has passed (``answered_within``): a handful of task hops.
SETTLE_TURNS = 16
T = TypeVar("T")


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
    """One open MCP session through the SDK (a stdio server's; an HTTP server's only to
    list its tools): its owner task holds the transport and the SDK session, and ends them
    when ``close`` is called or the connection ends by itself."""

    def __init__(self, server: Server, secret_headers: dict[str, str]) -> None:
        self.server = server
        self.secret_headers = secret_headers
        self.slots = asyncio.Semaphore(server.max_concurrency)
        self.client: ClientSession | None = None
        self.stop = asyncio.Event()
        self.ended = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def open(self, timeout_s: float = OPEN_TIMEOUT_S, listed: bool = False) -> None:
        """Open the session; ``listed``: and list its tools once. The SDK checks a call's
        result against its tool's output schema, and lists the tools first when it has not:
        an exchange after the answer, which the call's timeout would cut short when the
        relay was paused past it (``answered_within``)."""
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._own(ready), name=f"mcp:{self.server.name}")
        try:
            async with asyncio.timeout(timeout_s):
                self.client = await asyncio.shield(ready)
                if listed:
                    await self.client.list_tools()
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
        import mcp_types
        from mcp.client.session import ClientSession

        info = mcp_types.Implementation(name=CLIENT_NAME, version=CLIENT_VERSION)
        try:
            async with (
                self._transport() as (read, write),
                ClientSession(read, write, client_info=info) as client,
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
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=server.command[0], args=server.command[1:], env=server.env or None
            )
            return stdio_client(params, errlog=_errlog())
        return _http(server, self.secret_headers)


@contextlib.asynccontextmanager
async def _http(server: Server, secret_headers: dict[str, str]) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    assert server.url is not None
    limits = httpx2.Limits(max_connections=server.max_concurrency + 2)
    client = httpx2.AsyncClient(
        limits=limits,
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


# -- streamable HTTP, on the spec ---------------------------------------------------------

# The revision offered in ``initialize``, and those accepted in answer (the handshake
# revisions; the stateless 2026 envelope is not spoken).
PROTOCOL_VERSION = "2025-11-25"
PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
ACCEPT = "application/json, text/event-stream"
INVALID_PARAMS, METHOD_NOT_FOUND = -32602, -32601  # JSON-RPC: the call itself was refused


class NotAnAnswer(Exception):
    """An HTTP answer that holds no JSON-RPC answer to the request: why, and whether the
    server answered at all (``answered``: it sent something that is not an answer)."""

    def __init__(self, reason: str, *, answered: bool) -> None:
        super().__init__(reason)
        self.answered = answered


def answer_of(response: Answered, request_id: int) -> dict[str, Any]:
    """The JSON-RPC answer to ``request_id`` in a POST's answer: its body (application/json)
    or an event of its stream (text/event-stream), where the server may send notifications
    and requests of its own before it. Raises ``NotAnAnswer``."""
    # The first media type named (as the SDK reads it: a header sent twice is joined).
    kind = response.headers.get("content-type", "").split(",")[0].partition(";")[0]
    kind = kind.strip().lower()
    if kind == "application/json":
        try:
            messages = [json.loads(response.content)]
        except ValueError as err:
            raise NotAnAnswer(f"a body that is not JSON ({err})", answered=True) from err
    elif kind == "text/event-stream":
        messages = list(_events(response.content))
    else:
        raise NotAnAnswer(f"content type {kind or '(none)'!r}", answered=True)
    for message in messages:
        found = _answer_in(message, request_id)
        if found is not None:
            return found
    if kind == "text/event-stream":
        raise NotAnAnswer("its event stream ended before the answer", answered=False)
    raise NotAnAnswer(f"JSON that is not an answer to request {request_id}", answered=True)


EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # a blank line: the end of an event


class AnswerSeen:
    """Whether an event stream has brought the answer to ``request_id`` yet (``enough`` of
    ``relay.poster``): the relay takes the answer when it arrives and closes the stream,
    not when the server ends it (a server may keep it open after the answer, and the spec's
    "should close" is no promise). Each event is read once, as it completes."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.read = 0  # body bytes up to the end of the last complete event looked at
        self.stream: bool | None = None  # whether the answer is an event stream at all
        self.found: dict[str, Any] | None = None  # the answer, once seen

    def __call__(self, answer: Answer) -> bool:
        if self.stream is None:
            kind = next((v for n, v in answer.headers if n.lower() == b"content-type"), b"")
            self.stream = kind.split(b";")[0].strip().lower() == b"text/event-stream"
        if not self.stream:
            return False
        body = answer.body
        ends = list(EVENT_END.finditer(body, self.read))
        if not ends:
            return False
        end = ends[-1].end()
        events, self.read = bytes(body[self.read : end]), end
        for message in _events(events):
            self.found = _answer_in(message, self.request_id)
            if self.found is not None:
                return True
        return False


def _answer_in(message: Any, request_id: int) -> dict[str, Any] | None:
    """The answer to ``request_id`` in a message (or a batch), or None."""
    if isinstance(message, list):  # a batch (2025-03-26)
        found = [m for m in message if isinstance(m, dict) and m.get("id") == request_id]
        message = found[0] if found else None
    if (
        isinstance(message, dict)
        and message.get("id") == request_id
        and ("result" in message or "error" in message)
    ):
        return message
    return None


def _events(stream: bytes) -> Iterator[Any]:
    """The JSON messages of an event stream's ``message`` events (an event's ``data`` lines
    joined; events of other types, comments and unreadable data skipped)."""
    for event in stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
        data, kind = [], b"message"
        for line in event.split(b"\n"):
            field_, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field_ == b"data":
                data.append(value)
            elif field_ == b"event":
                kind = value
        if data and kind == b"message":
            with contextlib.suppress(ValueError):
                yield json.loads(b"\n".join(data))


class HttpSession:
    """One MCP session with a server over streamable HTTP, on the relay's poster: a
    JSON-RPC request is one POST, answered with a JSON body or an event stream that ends
    with its answer. ``session_id`` is the server's (none for a server that keeps no
    sessions); ``gone`` once the server no longer knows it or could not be reached, so the
    next call opens a new one."""

    def __init__(self, server: Server, secret_headers: dict[str, str], poster: Poster) -> None:
        assert server.url is not None
        self.server = server
        self.url = server.url
        self.secret_headers = secret_headers
        self.poster = poster
        self.slots = asyncio.Semaphore(server.max_concurrency)
        self.session_id: str | None = None
        self.version = PROTOCOL_VERSION
        self.ids = 0
        self.gone = False

    def headers(self, call: dict[str, str] | None = None) -> dict[str, str]:
        """A request's headers: the server's, the credential's, the session's, the call's."""
        headers = {**self.server.headers, **self.secret_headers, **(call or {})}
        headers["Accept"] = ACCEPT
        headers["MCP-Protocol-Version"] = self.version
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.ids += 1
        return self.ids, {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}

    async def open(self, timeout_s: float = OPEN_TIMEOUT_S) -> None:
        """``initialize``, then ``notifications/initialized``; raises ``OpenFailed`` (or
        what the poster raised) when the server cannot be reached or refuses."""
        request_id, body = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": CLIENT_NAME, "version": CLIENT_VERSION},
            },
        )
        headers = {**self.server.headers, **self.secret_headers, "Accept": ACCEPT}
        async with asyncio.timeout(timeout_s):
            response = await self.poster.post(
                self.url,
                json=body,
                headers=headers,
                timeout=timeout_s,
                max_body=MAX_EVENT_BYTES,
                enough=AnswerSeen(request_id),
            )
            if response.status_code != 200:
                raise OpenFailed(f"initialize answered HTTP {response.status_code}")
            try:
                answer = answer_of(response, request_id)
            except NotAnAnswer as err:
                raise OpenFailed(f"initialize answered {err}") from err
            found = answer.get("result")
            if not isinstance(found, dict):
                raise OpenFailed(f"initialize answered an error: {answer.get('error')}")
            version = found.get("protocolVersion")
            if version not in PROTOCOL_VERSIONS:
                raise OpenFailed(
                    f"the server speaks protocol version {version!r}; the relay speaks "
                    f"{', '.join(PROTOCOL_VERSIONS)}"
                )
            self.version = version
            self.session_id = response.headers.get("mcp-session-id")
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            response = await self.poster.post(
                self.url, json=note, headers=self.headers(), timeout=timeout_s
            )
            if not 200 <= response.status_code < 300:
                raise OpenFailed(f"notifications/initialized answered HTTP {response.status_code}")

    def alive(self) -> bool:
        return not self.gone

    async def close(self) -> None:
        """Nothing to end here: the poster's connections are the relay's, and a session the
        server keeps it ends by itself (a ``DELETE`` is a courtesy the spec leaves open)."""
        self.gone = True

    async def call(
        self, row: Claimed, tool: str, call_headers: dict[str, str], where: str
    ) -> Outcome:
        """One ``tools/call`` of ``tool`` for ``row``, and what its answer means."""
        timeout_s = row.timeout_s or 30.0
        request_id, body = self.request(
            "tools/call",
            {
                "name": tool,
                "arguments": row.arguments if isinstance(row.arguments, dict) else {},
                "_meta": meta(row, call_headers.get("traceparent", "")),
            },
        )
        seen = AnswerSeen(request_id)
        try:
            # ``timeout`` bounds each wait for bytes, ``total`` the whole answer; the poster
            # reads what its socket holds before it declares either passed.
            response = await self.poster.post(
                self.url,
                json=body,
                headers=self.headers(call_headers),
                timeout=timeout_s,
                max_body=MAX_EVENT_BYTES,
                enough=seen,
                total=timeout_s + 1.0,
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as err:
            self.gone = True  # it may have restarted, and forgotten the session with it
            return retry(row, f"could not reach {where}: {describe(err)}", unsent=True)
        except httpx2.TimeoutException:
            return ambiguous(row, f"no answer from {where} within {timeout_s}s")
        except httpx2.HTTPError as err:
            return ambiguous(row, f"connection to {where} broke: {describe(err)}")
        return self._outcome(row, response, request_id, where, seen.found)

    def _outcome(
        self,
        row: Claimed,
        response: Answered,
        request_id: int,
        where: str,
        found: dict[str, Any] | None = None,
    ) -> Outcome:
        """What an answer means; ``found``: its JSON-RPC answer, when the event stream's
        reading already found it (``AnswerSeen``)."""
        status = response.status_code
        if "body_cut_at" in response.extensions:
            return error_result(
                row,
                f"the answer of {where} is over {MAX_EVENT_BYTES} bytes (not read further), "
                f"over the cap of a tool result ({outbox_config.MAX_PAYLOAD_BYTES} bytes)",
            )
        if status == SESSION_GONE and self.session_id is not None:
            self.gone = True
            return retry(
                row,
                f"{where} no longer knows the session (HTTP 404: it restarted or ended it); "
                "a new one is opened for the next attempt",
                unsent=True,
            )
        if status in NOT_PROCESSED:
            return retry(
                row,
                f"HTTP {status} from {where}: {_text(response)}",
                retry_after_s(response.headers.get("retry-after")),
                unsent=True,
            )
        try:
            answer = found if found is not None else answer_of(response, request_id)
        except NotAnAnswer as err:
            if 400 <= status < 500:
                return error_result(row, f"HTTP {status} from {where}: {_text(response)}")
            if status >= 500:
                return ambiguous(
                    row,
                    f"HTTP {status} from {where}: {_text(response)}",
                    answered=status not in GATEWAY_ANSWERS,
                )
            if err.answered:
                return ambiguous(row, f"{where} answered {err}", answered=True)
            return ambiguous(row, f"the connection to {where} ended before its answer ({err})")
        error = answer.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            said = error.get("message") if isinstance(error, dict) else error
            text = f"{code}: {said}"
            if code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                return error_result(row, f"{row.tool_name} refused the call ({text})")
            if 400 <= status < 500:
                return error_result(row, f"HTTP {status} from {where}: {text}")
            return ambiguous(row, f"{where} answered an error: {text}", answered=True)
        found = answer["result"]
        content = found.get("content") if isinstance(found, dict) else None
        if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
            return ambiguous(
                row, f"{where} answered something that is not a tool result", answered=True
            )
        return tool_result(
            row, content, found.get("isError") is True, found.get("structuredContent")
        )


class OpenFailed(Exception):
    """A session could not be opened: the server refused ``initialize`` or answered it
    with what is not an answer."""


def _text(response: Answered) -> str:
    """The start of an answer's body, for an error message."""
    return response.content[:300].decode(errors="replace") or "(empty body)"


AnySession = Session | HttpSession


class Sessions:
    """The MCP sessions of one relay process, by server, opened on first use and kept;
    HTTP ones on ``poster`` (the relay's)."""

    def __init__(self, poster: Poster) -> None:
        self.poster = poster
        self.open: dict[str, AnySession] = {}
        self.opening: dict[str, asyncio.Future[AnySession]] = {}
        self.closing: set[asyncio.Task[None]] = set()  # ended sessions being closed

    async def get(self, server: Server, secret_headers: dict[str, str]) -> AnySession:
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

            def opened(done: asyncio.Future[AnySession]) -> None:
                self.opening.pop(key, None)
                if not done.cancelled():
                    done.exception()  # retrieved here: its callers may all have gone

            opening.add_done_callback(opened)
        return await asyncio.shield(opening)

    async def _open(self, key: str, server: Server, secret_headers: dict[str, str]) -> AnySession:
        session: AnySession
        if server.transport == "http":
            session = HttpSession(server, secret_headers, self.poster)
            await session.open()
        else:
            session = Session(server, secret_headers)
            await session.open(listed=True)
        self.open[key] = session
        return session

    async def aclose(self) -> None:
        sessions, self.open = list(self.open.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


# -- listing (registration) -------------------------------------------------------------


async def list_tools(server: Server, secret_headers: dict[str, str] | None = None) -> list[Any]:
    """The server's ``tools/list`` (every page), as the SDK's ``Tool`` models."""
    import mcp_types

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
    """Runs the calls of ``mcp`` tools for ``relay.executors.ToolExecutor``; HTTP servers
    over ``poster`` (the relay's; one of its own when none is given)."""

    def __init__(self, mark_dispatched: MarkDispatched, poster: Poster | None = None) -> None:
        self.sessions = Sessions(poster or Poster())
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
        where = f"MCP server {server.name} ({server.where()})"
        left = deadline_left_s(row)
        try:
            # A call with a deadline waits for a session no longer than until it.
            async with asyncio.timeout(None if left is None else max(0.0, left)):
                session = await self.sessions.get(server, secret_headers)
        except Exception as err:
            return retry(
                row,
                f"could not open a session with MCP server {server.name} at {server.where()}: "
                f"{describe(err) if not isinstance(err, TimeoutError) else 'not by the deadline'}",
                unsent=True,
            )
        async with session.slots:
            # Nothing leaves after the call's deadline, however long the session or a slot
            # took.
            ended = past_deadline(row, where)
            if ended is not None:
                return ended
            if not await self.mark_dispatched(row):
                return Outcome(row, "lost", error="lease lost before dispatch; not called")
            if isinstance(session, HttpSession):
                return await session.call(row, found["tool"], headers, where)
            return await self._send(row, session, found["tool"], headers, where)

    async def _send(
        self, row: Claimed, session: Session, tool: str, headers: dict[str, str], where: str
    ) -> Outcome:
        """A call through the SDK (a stdio server)."""
        import anyio
        import mcp_types
        from mcp.client.extension import UnexpectedClaimedResult
        from mcp.shared.exceptions import MCPError

        assert session.client is not None
        timeout_s = row.timeout_s or 30.0
        try:
            # Bounded here, not by the SDK's read timeout: see ``answered_within``.
            answer = await answered_within(
                session.client.call_tool(
                    tool,
                    row.arguments if isinstance(row.arguments, dict) else {},
                    meta=cast(
                        mcp_types.RequestParamsMeta, meta(row, headers.get("traceparent", ""))
                    ),
                ),
                timeout_s,
            )
        except MCPError as err:
            return _error(row, err, where, timeout_s)
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
            return ambiguous(row, f"connection to {where} broke: {describe(err)}")
        return normalise(row, answer)


async def answered_within(call: Awaitable[T], timeout_s: float) -> T:
    """What ``call`` (an SDK request) returns, or ``TimeoutError`` when it has not returned
    ``timeout_s`` seconds from now nor within ``SETTLE_TURNS`` more turns of the loop. A
    process paused past the timeout (SIGSTOP, a frozen VM) wakes with its timers due and,
    perhaps, the answer in its pipe; the answer reaches the call through the SDK's reader
    and dispatcher tasks, a turn of the loop each, so a timer that ended the call at once
    would lose an answer that came in time (a call that acted, journaled as ambiguous).
    Each turn waited here is a timer due now, which runs after that turn's I/O pass."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait({task}, timeout=timeout_s)
        loop = asyncio.get_running_loop()
        for _ in range(SETTLE_TURNS):
            if task.done():
                break
            turn = loop.create_future()
            loop.call_at(loop.time(), _settle, turn)
            await turn
    except BaseException:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        await asyncio.wait({task})  # the SDK ends its wait for the answer
        raise TimeoutError(f"no answer within {timeout_s}s")
    return task.result()


def _settle(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


def _error(row: Claimed, err: MCPError, where: str, timeout_s: float) -> Outcome:
    """What a JSON-RPC error (the server's, or the SDK's for a failed exchange) means."""
    import mcp_types

    text = f"{err.code}: {err.message}"
    if err.code in (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND):
        return error_result(row, f"{row.tool_name} refused the call ({text})")
    if err.code == mcp_types.REQUEST_TIMEOUT:
        return ambiguous(row, f"no answer from {where} within {timeout_s}s")
    if err.code == mcp_types.CONNECTION_CLOSED:
        return ambiguous(row, f"the connection to {where} ended before its answer ({text})")
    return ambiguous(row, f"{where} answered an error: {text}", answered=True)


def normalise(row: Claimed, answer: Any) -> Outcome:
    """The SDK's ``CallToolResult`` (stdio) as a tool result (``tool_result``)."""
    content = [
        item.model_dump(by_alias=True, mode="json", exclude_none=True)
        for item in getattr(answer, "content", None) or []
    ]
    return tool_result(
        row,
        content,
        bool(getattr(answer, "is_error", False)),
        getattr(answer, "structured_content", None),
    )


def tool_result(
    row: Claimed, content: list[dict[str, Any]], is_error: bool, structured: Any
) -> Outcome:
    """A ``tools/call`` result as a tool result: its content and structured content kept as
    the server sent them, ``isError`` as an error result the model sees."""
    if is_error:
        said = " ".join(str(c.get("text", "")) for c in content if c.get("type") == "text")
        return error_result(row, f"{row.tool_name} answered an error: {said or '(no text)'}")
    output: dict[str, Any] = {"content": content}
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
