"""Executors: perform one claimed row's effect and say what happened, as an ``Outcome``.

They are coroutines on the I/O engine's event loop (``relay.engine``): an HTTP call in flight
is a task waiting on a socket, not a thread and never a database connection.

An executor never writes the outcome itself; the worker's completer does, in a fenced
transaction. The one exception is the *dispatch mark*: before sending a request to an HTTP
tool or an MCP server (in every mode; ``relay.mcpclient`` for MCP and its own failure
classes) or calling a python tool that cannot deduplicate (``lookup``/``none``),
the executor records, conditional on still holding an unexpired lease, that this attempt
may reach the tool, and when (the database's clock). A later attempt that finds the mark
knows the outcome is ambiguous and follows the tool's mode: ``none`` goes to
``outcome_unknown`` for an operator and is never executed on a guess (docs/guarantees.md,
invariant 5); ``lookup`` asks the tool what happened and ``key`` resends with the same
key. A request outlives the relay that sent it (killed, or gave up waiting), so what is safe
before it can no longer act there (``settle_left``: ``settle_s`` past the later of its
dispatch + the tool's timeout and the moment its relay gave up on it) is what the tool
declares:

- a lookup is asked at once: "found" is the result, "in progress" (``in_progress: true``)
  asks again shortly (``still_acting``); only "not found", which a request still on its
  way would also get, waits for that bound before the call is made again (``settling``);
- a ``key`` tool that refuses a key in use (``refuses_key_in_use``: a 409 while the first
  request acts, never a second effect) is resent at once, a 409 asked again shortly;
  any other ``key`` tool is resent only after that bound.

``outbox.registry.IDEMPOTENCY_MODES`` is the table of what each mode does; this module and
``relay.outcomes`` follow it.

Failure classes for an HTTP tool:

- connection refused or connect timeout: the request never left, retry in every mode;
- 2xx: the result (a body over the size cap, or JSON PostgreSQL cannot store, becomes an
  error result: the tool answered, so it is never called again for it);
- 4xx other than 408/429: a terminal error result the model will see (but a 409 of a tool
  that refuses a key in use: the earlier request still acts, ask again);
- 408, 429, 503: the tool says it did not process the request, retry;

An attempt of the first and last kinds certainly did not reach the tool: its outcome is
``unsent``, the completer takes its dispatch mark back, and the next attempt of a ``none``
or ``lookup`` tool is a plain call, not an ambiguous one;
- other 5xx, timeouts after sending, broken connections: ambiguous. ``key`` retries with the
  same key, ``lookup`` retries (the next attempt asks the lookup endpoint first), ``none``
  becomes ``outcome_unknown``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

import httpx2

from outbox import config as outbox_config
from outbox import context, credentials, failpoints, registry, storable
from outbox.relay import inprocess, spans
from outbox.relay.mcpclient import McpCaller
from outbox.relay.outcomes import (
    GATEWAY_ANSWERS,
    NOT_PROCESSED,
    NOT_REPEATED,
    Claimed,
    Outcome,
    ambiguous,
    error_result,
    past_deadline,
    redacted,
    result,
    retry,
    retry_after_s,
    secret_of,
)
from outbox.relay.poster import Answered, Poster

RESPONSE_PREVIEW_CHARS = 500

# -- secrets and tracing ----------------------------------------------------------------


def request_headers(
    row: Claimed, secret: credentials.Secret | None, trace: dict[str, str]
) -> dict[str, str]:
    """The headers of a request to a tool: our ids, the trace context of the call's span
    (``trace``: ``relay.spans.headers``) and the call's credential."""
    headers = {
        "Idempotency-Key": row.idempotency_key or "",
        "X-Outbox-Run-Id": str(row.run_id),
        "X-Outbox-Tool-Call-Id": row.tool_call_id or "",
        "X-Outbox-Attempt": str(row.attempt),
        "X-Correlation-Id": row.correlation_id or "",
        **trace,
    }
    if secret is not None:
        headers.update(secret.headers())
    return headers


# -- tool calls -------------------------------------------------------------------------


MarkDispatched = Callable[[Claimed], Awaitable[bool]]
ReadStored = Callable[[Claimed, int], Awaitable[str | None]]  # (call, message id) -> result


class ToolExecutor:
    """Runs ``tool_call`` rows: HTTP tools through the engine's poster, MCP tools through
    ``relay.mcpclient`` (which opens the session and takes a slot before it marks), python
    tools in-process, and the built-in ``read_result`` (``executor`` ``builtin``: a page of
    a stored result, read through ``read_stored``, ``relay.preparer``).

    ``mark_dispatched`` is the fenced write of the module docstring, batched with other
    rows' by ``relay.preparer``; it returns False when this worker no longer holds the lease,
    and then the tool is not called. ``threads`` runs an in-process call of a tool that needs
    that mark (a chunk of one, ``relay.inprocess``) off the event loop.
    """

    def __init__(
        self,
        http: Poster,
        mark_dispatched: MarkDispatched,
        threads: Executor,
        read_stored: ReadStored,
    ) -> None:
        self.http = http
        self.mark_dispatched = mark_dispatched
        self.read_stored = read_stored
        self.threads = threads
        self.mcp = McpCaller(mark_dispatched, http)

    async def run(self, row: Claimed) -> Outcome:
        started, started_at = time.monotonic(), time.time()
        if row.executor == "builtin":  # read_result: a read of the thread, run here
            outcome = await self._read_result(row)
            failpoints.hit("read_result.after_read")
            return dataclasses.replace(
                outcome, duration_s=time.monotonic() - started, started_at=started_at
            )
        try:
            secret = secret_of(row)
        except credentials.CredentialRevoked as err:
            outcome = error_result(row, str(err))
        except credentials.CredentialUnavailable as err:
            outcome = retry(row, str(err), unsent=True)
        else:
            outcome = redacted(await self._run(row, secret, spans.headers(row)), secret)
        return dataclasses.replace(
            outcome, duration_s=time.monotonic() - started, started_at=started_at
        )

    async def _run(
        self, row: Claimed, secret: credentials.Secret | None, trace: dict[str, str]
    ) -> Outcome:
        mode = registry.idempotency(row.idempotency_mode)
        ended = past_deadline(row, where_of(row))
        if ended is not None:
            return ended
        if row.dispatched_attempt is not None:
            if mode.after_ambiguous == "unknown" or (
                mode.after_ambiguous == "lookup" and not row.lookup_endpoint
            ):
                return Outcome(
                    row,
                    "unknown",
                    error=f"outcome unknown: attempt {row.dispatched_attempt} may have reached "
                    f"the tool; {NOT_REPEATED}",
                )
            if mode.after_ambiguous == "lookup":
                # "Found" and "in progress" are facts whenever they are asked; only a "not
                # found" may be a request still on its way, so only it waits for the bound.
                found = await self._lookup(row, secret, trace)
                if found is not None:
                    return found
            # A tool that refuses a key in use (never a lookup tool) cannot act twice.
            wait_s = settle_left(row)
            if wait_s > 0 and not row.refuses_key_in_use:
                return settling(row, wait_s)
        if row.executor == "mcp":
            # A request sent over the network may outlive its sender: marked in every mode.
            outcome = await self.mcp.call(row, secret, request_headers(row, secret, trace))
            failpoints.hit("tool.after_call")
            return outcome
        # A request sent over the network may outlive its sender, so its dispatch time is
        # recorded in every mode; an in-process call dies with its process. The resend of a
        # tool that refuses a key in use keeps the earlier attempt's mark: the tool tells
        # whether that request still acts, and its mark bounds how long it may say so.
        marked = mode.dispatch_mark or row.executor == "http"
        if row.refuses_key_in_use and row.dispatched_attempt is not None:
            marked = False
        if marked and not await self.mark_dispatched(row):
            return Outcome(row, "lost", error="lease lost before dispatch; not called")
        if row.executor == "python":
            loop = asyncio.get_running_loop()
            outcome = await loop.run_in_executor(self.threads, _call_python, row)
        else:
            outcome = await self._call_http(row, secret, trace)
        failpoints.hit("tool.after_call")
        return outcome

    async def _read_result(self, row: Claimed) -> Outcome:
        """A page of a stored result past its cap (``outbox.context.page``), read in the
        call's own thread and tenant: no side effect, so no dispatch mark and no key; a
        handle that names nothing there is an error result the model sees."""
        arguments = row.arguments if isinstance(row.arguments, dict) else {}
        given = str(arguments.get("handle", ""))
        message_id = context.message_of(given)
        stored = None if message_id is None else await self.read_stored(row, message_id)
        if stored is None:
            return error_result(
                row,
                f"{given!r} is not the handle of a result of this conversation: use the "
                "handle the note at the end of a cut result gives",
            )
        offset = int(arguments.get("offset", 0))
        page = context.page(
            stored, offset, int(arguments.get("max_bytes", context.READ_PAGE_BYTES))
        )
        return result(row, {"handle": given, **page})

    async def _lookup(
        self, row: Claimed, secret: credentials.Secret | None, trace: dict[str, str]
    ) -> Outcome | None:
        """Ask the tool whether an earlier attempt happened: its result, or None to execute."""
        if not row.lookup_endpoint:
            return None
        try:
            response = await self.http.post(
                row.lookup_endpoint,
                json={"idempotency_key": row.idempotency_key, "arguments": row.arguments},
                headers=request_headers(row, secret, trace),
                timeout=row.timeout_s or 30.0,
                max_body=outbox_config.MAX_PAYLOAD_BYTES,
            )
        except httpx2.HTTPError as err:
            return retry(row, f"lookup at {row.lookup_endpoint} failed: {describe(err)}")
        if response.status_code != 200:
            return retry(
                row, f"lookup answered HTTP {response.status_code}: {preview(response, secret)}"
            )
        if "body_cut_at" in response.extensions:
            return retry(
                row,
                f"lookup answered over {outbox_config.MAX_PAYLOAD_BYTES} bytes, the cap of a "
                "tool result; it was not read further",
            )
        try:
            body = storable.loads(response.content, "lookup answer")
            found = bool(body["found"])
            in_progress = not found and body.get("in_progress") is True
        except storable.NotStorable as err:
            # The tool said what happened in a form that cannot be kept: asking again would
            # hear the same, and calling the tool could act twice.
            return error_result(row, err.args[0])
        except (ValueError, KeyError, TypeError):
            return retry(row, f"lookup answered something unreadable: {preview(response, secret)}")
        if found:
            return result(row, body.get("result"), source="lookup")
        if in_progress:
            return still_acting(row, "the lookup answered that a request is in progress there")
        return None

    async def _call_http(
        self, row: Claimed, secret: credentials.Secret | None, trace: dict[str, str]
    ) -> Outcome:
        assert row.endpoint is not None
        try:
            response = await self.http.post(  # its headers are let go once sent (Poster)
                row.endpoint,
                json=row.arguments,
                headers=request_headers(row, secret, trace),
                timeout=row.timeout_s or 30.0,
                max_body=outbox_config.MAX_PAYLOAD_BYTES,  # read no further than the cap
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as err:
            return retry(row, f"could not reach {row.endpoint}: {describe(err)}", unsent=True)
        except httpx2.TimeoutException as err:
            return ambiguous(
                row, f"no answer from {row.endpoint} within {row.timeout_s}s: {describe(err)}"
            )
        except httpx2.HTTPError as err:
            return ambiguous(row, f"connection to {row.endpoint} broke: {describe(err)}")
        return normalise(row, response, secret)


def where_of(row: Claimed) -> str:
    """The tool a call goes to, for an error message: its endpoint, or its MCP server."""
    server = (row.mcp or {}).get("server") or {}
    if server:
        return f"MCP server {server.get('name')} ({server.get('url') or 'stdio'})"
    return row.endpoint or row.callable or row.tool_name or "the tool"


def settle_left(row: Claimed) -> float:
    """Seconds until an earlier attempt that may have reached the tool can no longer act
    there (0: there is none, or it is past that)."""
    return max(0.0, row.settle_wait_s or 0.0)


def still_acting(row: Claimed, said: str) -> Outcome:
    """The tool says an earlier request of this call is acting there now (a lookup's "in
    progress", a 409 for the key in use): nothing was done, the call is asked again after
    the relay's backoff, uncharged while that request may still act (``settle_left``).
    Past that bound the tool breaks what it declared, so the attempt is charged: a tool
    that stays "in progress" ends quarantined, not retried forever."""
    if settle_left(row) > 0:
        return Outcome(row, "defer", error=f"{said}: asked again shortly, not resent")
    return retry(
        row,
        f"{said}, past the time the tool's request may act there (its timeout and settle "
        "time): check the tool",
    )


def settling(row: Claimed, wait_s: float) -> Outcome:
    """The attempt after one that may have reached the tool, too early: that request may
    still be running there (its relay died or stopped waiting, the tool did not), so a
    lookup would answer "not found" and a resend act twice. Nothing is done until its
    dispatch + the tool's timeout + settle time has passed; no attempt is charged."""
    return Outcome(
        row,
        "defer",
        error=f"attempt {row.dispatched_attempt} may have reached the tool and may still take "
        f"effect there for {wait_s:.1f}s more (its dispatch + the tool's timeout and settle "
        "time): no lookup and no resend before then",
        delay_s=wait_s,
    )


def normalise(
    row: Claimed, response: Answered, secret: credentials.Secret | None = None
) -> Outcome:
    """What an HTTP tool's answer means (the module docstring's failure classes).
    ``secret``: the call's credential, cut from an error body before it is shortened."""
    status = response.status_code
    if 200 <= status < 300:
        size = len(response.content)
        cut = response.extensions.get("body_cut_at")
        if cut is not None or size > outbox_config.MAX_PAYLOAD_BYTES:
            said = f"{size} bytes" if cut is None else f"over {cut} bytes (not read further)"
            return error_result(
                row,
                f"tool result is {said}, over the cap of {outbox_config.MAX_PAYLOAD_BYTES} bytes",
            )
        try:
            output = storable.loads(response.content, "tool result") if size else None
        except storable.NotStorable as err:
            return error_result(row, err.args[0])
        except ValueError:  # not JSON: its text, if a text column can hold it
            problem = storable.text_problem(response.text)
            if problem:
                return error_result(row, f"tool result (not JSON) cannot be stored: {problem}")
            output = {"text": response.text}
        return result(row, output)
    if status in NOT_PROCESSED:
        return retry(
            row,
            f"HTTP {status} from {row.endpoint}: {preview(response, secret)}",
            retry_after_s(response.headers.get("retry-after")),
            unsent=True,
        )
    if status == 409 and row.refuses_key_in_use:
        return still_acting(row, f"HTTP 409 from {row.endpoint}: the key is in use")
    if 400 <= status < 500:
        return error_result(row, f"HTTP {status} from {row.tool_name}: {preview(response, secret)}")
    return ambiguous(
        row,
        f"HTTP {status} from {row.endpoint}: {preview(response, secret)}",
        answered=status not in GATEWAY_ANSWERS,
    )


def _call_python(row: Claimed) -> Outcome:
    """One in-process call: a chunk of one (``relay.inprocess`` says what timeouts mean)."""
    return inprocess.run_calls([row])[0]


def describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def preview(response: Answered, secret: credentials.Secret | None = None) -> str:
    """The start of a response body for an error message. The secret, in each of its
    forms, is cut out before the body is shortened: cut after, a body shortened inside the
    secret (or its base64) would keep its start, which no later redaction recognises."""
    text = response.text
    if secret is not None:
        text = credentials.redact(text, secret.value)
    return text if len(text) <= RESPONSE_PREVIEW_CHARS else text[:RESPONSE_PREVIEW_CHARS] + "..."
