"""Executors: perform one claimed row's effect and say what happened, as an ``Outcome``.

An executor never writes the outcome itself; the worker's completer does, in a fenced
transaction. The one exception is the *dispatch mark*: before calling a tool that cannot
deduplicate (idempotency mode ``lookup`` or ``none``), the executor records, conditional on
still holding an unexpired lease, that this attempt may reach the tool. A later attempt that
finds the mark knows the outcome is ambiguous and follows the tool's mode: ``lookup`` asks
the tool what happened, ``none`` goes to ``outcome_unknown`` for an operator and is never
executed on a guess (DESIGN invariant 5).

Failure classes for an HTTP tool:

- connection refused or connect timeout: the request never left, retry in every mode;
- 2xx: the result (a body over the size cap becomes an error result);
- 4xx other than 408/429: a terminal error result the model will see;
- 408, 429, 503: the tool says it did not process the request, retry;
- other 5xx, timeouts after sending, broken connections: ambiguous. ``key`` retries with the
  same key, ``lookup`` retries (the next attempt asks the lookup endpoint first), ``none``
  becomes ``outcome_unknown``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2

from outbox import config as outbox_config
from relay import failpoints

Action = Literal["result", "retry", "unknown", "deliver", "lost", "turn", "fail_run", "skip"]
NOT_PROCESSED = {408, 429, 503}
RESPONSE_PREVIEW_CHARS = 500
NOT_REPEATED = (
    "the tool honours no idempotency key and offers no lookup, so it is not called again: "
    "check the tool and run `outbox reconcile TOOL_CALL --happened --result JSON` or "
    "`--not-happened`"
)


@dataclass(frozen=True)
class Claimed:
    """A claimed outbox row with what its executor needs (the claim query's columns)."""

    id: int
    kind: str
    tenant_id: str
    thread_id: Any
    run_id: Any
    batch_id: int | None
    tool_call_ref: int | None
    correlation_id: str | None
    attempt: int
    max_attempts: int
    payload: dict[str, Any]
    lag_s: float
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: Any = None
    idempotency_key: str | None = None
    idempotency_mode: str | None = None
    executor: str | None = None
    dispatched_attempt: int | None = None
    endpoint: str | None = None
    lookup_endpoint: str | None = None
    callable: str | None = None
    timeout_s: float | None = None
    credential_ref: str | None = None
    claimed_at_monotonic: float = field(default_factory=time.monotonic)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Claimed:
        return cls(
            id=row["id"],
            kind=row["kind"],
            tenant_id=row["tenant_id"],
            thread_id=row["thread_id"],
            run_id=row["run_id"],
            batch_id=row["batch_id"],
            tool_call_ref=row["tool_call_ref"],
            correlation_id=row["correlation_id"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            payload=row["payload"] or {},
            lag_s=float(row["lag_s"] or 0.0),
            tool_call_id=row["tool_call_id"],
            tool_name=row["tool_name"],
            arguments=row["arguments"],
            idempotency_key=row["idempotency_key"],
            idempotency_mode=row["idempotency_mode"],
            executor=row["executor"],
            dispatched_attempt=row["dispatched_attempt"],
            endpoint=row["endpoint"],
            lookup_endpoint=row["lookup_endpoint"],
            callable=row["callable"],
            timeout_s=row["timeout_s"],
            credential_ref=row["credential_ref"],
        )

    def context(self) -> dict[str, Any]:
        """The identities every log line and journal event about this row carries."""
        return {
            "tenant_id": self.tenant_id,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "batch_id": self.batch_id,
            "tool_call_ref": self.tool_call_ref,
            "tool_call_id": self.tool_call_id,
            "correlation_id": self.correlation_id,
            "attempt": self.attempt,
        }


@dataclass(frozen=True)
class Outcome:
    """What an attempt produced. ``result``: a terminal result (ok or error) to store;
    ``retry``: try again later (or quarantine when out of attempts); ``unknown``: ambiguous
    and not safely repeatable; ``deliver``: a batch delivery to perform in the completion
    transaction; ``lost``: the lease was gone before the effect, nothing to write;
    ``turn``: a model response (a ``ModelTurnIn`` in ``output``) to record; ``fail_run``:
    end the run as failed (``model_error``); ``skip``: nothing to do but finish the row."""

    row: Claimed
    action: Action
    status: Literal["ok", "error"] | None = None
    output: Any = None
    error: str | None = None
    source: str = "relay"
    duration_s: float = 0.0


def result(row: Claimed, output: Any, source: str = "relay") -> Outcome:
    return Outcome(row, "result", "ok", output, None, source)


def error_result(row: Claimed, error: str) -> Outcome:
    return Outcome(row, "result", "error", None, error)


def retry(row: Claimed, error: str) -> Outcome:
    return Outcome(row, "retry", error=error)


def ambiguous(row: Claimed, error: str) -> Outcome:
    """An attempt whose effect may or may not have happened, per the tool's mode."""
    if row.idempotency_mode == "none":
        return Outcome(row, "unknown", error=f"outcome unknown: {error}; {NOT_REPEATED}")
    return retry(row, error)


# -- secrets and tracing ----------------------------------------------------------------


def resolve_credential(ref: str) -> str:
    """The secret named ``ref``: ``$OUTBOX_SECRET_<REF>``, else a line ``REF=value`` of the
    file named by ``$OUTBOX_SECRETS_FILE``. Read at call time, never stored or logged."""
    env_name = "OUTBOX_SECRET_" + ref.upper().replace("-", "_").replace(".", "_")
    if env_name in os.environ:
        return os.environ[env_name]
    path = os.environ.get("OUTBOX_SECRETS_FILE")
    if path and os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                name, _, value = line.strip().partition("=")
                if name == ref:
                    return value
    raise LookupError(
        f"credential {ref!r} is not set: define ${env_name} or a line '{ref}=...' "
        "in $OUTBOX_SECRETS_FILE for the relay"
    )


def traceparent(correlation_id: str | None) -> str:
    """A W3C traceparent whose trace id is derived from the correlation id."""
    seed = correlation_id or secrets.token_hex(16)
    trace_id = hashlib.sha256(seed.encode()).hexdigest()[:32]
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def request_headers(row: Claimed) -> dict[str, str]:
    headers = {
        "Idempotency-Key": row.idempotency_key or "",
        "X-Outbox-Run-Id": str(row.run_id),
        "X-Outbox-Tool-Call-Id": row.tool_call_id or "",
        "X-Outbox-Attempt": str(row.attempt),
        "X-Correlation-Id": row.correlation_id or "",
        "traceparent": traceparent(row.correlation_id),
    }
    if row.credential_ref:
        headers["Authorization"] = "Bearer " + resolve_credential(row.credential_ref)
    return headers


# -- tool calls -------------------------------------------------------------------------


MarkDispatched = Callable[[Claimed], bool]


class ToolExecutor:
    """Runs ``tool_call`` rows: HTTP tools through one shared client, python tools in-process.

    ``mark_dispatched`` is the worker's fenced write (see the module docstring); it returns
    False when this worker no longer holds the lease, and then the tool is not called.
    """

    def __init__(self, http: httpx2.Client, mark_dispatched: MarkDispatched) -> None:
        self.http = http
        self.mark_dispatched = mark_dispatched
        self._callables: dict[str, Callable[..., Any]] = {}

    def run(self, row: Claimed) -> Outcome:
        started = time.monotonic()
        outcome = self._run(row)
        return Outcome(
            outcome.row,
            outcome.action,
            outcome.status,
            outcome.output,
            outcome.error,
            outcome.source,
            time.monotonic() - started,
        )

    def _run(self, row: Claimed) -> Outcome:
        mode = row.idempotency_mode
        if row.dispatched_attempt is not None:
            if mode == "none":
                return Outcome(
                    row,
                    "unknown",
                    error=f"outcome unknown: attempt {row.dispatched_attempt} may have reached "
                    f"the tool; {NOT_REPEATED}",
                )
            if mode == "lookup":
                found = self._lookup(row)
                if found is not None:
                    return found
        if mode in ("none", "lookup") and not self.mark_dispatched(row):
            return Outcome(row, "lost", error="lease lost before dispatch; not called")
        outcome = self._call_python(row) if row.executor == "python" else self._call_http(row)
        failpoints.hit("tool.after_call")
        return outcome

    def _lookup(self, row: Claimed) -> Outcome | None:
        """Ask the tool whether an earlier attempt happened: its result, or None to execute."""
        if not row.lookup_endpoint:
            return None
        try:
            response = self.http.post(
                row.lookup_endpoint,
                json={"idempotency_key": row.idempotency_key, "arguments": row.arguments},
                headers=request_headers(row),
                timeout=row.timeout_s or 30.0,
            )
        except httpx2.HTTPError as err:
            return retry(row, f"lookup at {row.lookup_endpoint} failed: {describe(err)}")
        if response.status_code != 200:
            return retry(row, f"lookup answered HTTP {response.status_code}: {preview(response)}")
        try:
            body = response.json()
            found = bool(body["found"])
        except (ValueError, KeyError, TypeError):
            return retry(row, f"lookup answered something unreadable: {preview(response)}")
        if found:
            return result(row, body.get("result"), source="lookup")
        return None

    def _call_http(self, row: Claimed) -> Outcome:
        assert row.endpoint is not None
        try:
            headers = request_headers(row)
        except LookupError as err:
            return retry(row, str(err))
        try:
            response = self.http.post(
                row.endpoint, json=row.arguments, headers=headers, timeout=row.timeout_s or 30.0
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as err:
            return retry(row, f"could not reach {row.endpoint}: {describe(err)}")
        except httpx2.TimeoutException as err:
            return ambiguous(
                row, f"no answer from {row.endpoint} within {row.timeout_s}s: {describe(err)}"
            )
        except httpx2.HTTPError as err:
            return ambiguous(row, f"connection to {row.endpoint} broke: {describe(err)}")
        return self._normalise(row, response)

    def _normalise(self, row: Claimed, response: httpx2.Response) -> Outcome:
        status = response.status_code
        if 200 <= status < 300:
            size = len(response.content)
            if size > outbox_config.MAX_PAYLOAD_BYTES:
                return error_result(
                    row,
                    f"tool result is {size} bytes, over the cap of "
                    f"{outbox_config.MAX_PAYLOAD_BYTES} bytes",
                )
            try:
                output = response.json() if size else None
            except ValueError:
                output = {"text": response.text}
            return result(row, output)
        if status in NOT_PROCESSED:
            return retry(row, f"HTTP {status} from {row.endpoint}: {preview(response)}")
        if 400 <= status < 500:
            return error_result(row, f"HTTP {status} from {row.tool_name}: {preview(response)}")
        return ambiguous(row, f"HTTP {status} from {row.endpoint}: {preview(response)}")

    def _call_python(self, row: Claimed) -> Outcome:
        """Call an in-process tool with the tool's timeout, on the shared python-tool pool.

        The call runs on a pool thread and the slot waits at most ``timeout_s`` for it. A
        call still queued at the deadline is cancelled and never runs: retried in every
        mode. A call that started and did not finish is ambiguous (Python cannot stop a
        thread; it keeps running and its late answer is dropped): it follows the tool's
        idempotency mode like a timed-out HTTP call.
        """
        try:
            function = self._load(row.callable or "")
        except Exception as err:
            return error_result(row, f"cannot load python tool {row.callable!r}: {err}")
        timeout_s = row.timeout_s or 30.0
        future = python_tool_pool().submit(_call_tool, function, row.arguments or {})
        try:
            output = future.result(timeout=timeout_s)
        except FutureTimeout:
            if future.cancel():
                return retry(row, f"python tool {row.callable} did not start within {timeout_s}s")
            return ambiguous(row, f"python tool {row.callable} did not return within {timeout_s}s")
        except ToolRaised as err:
            return error_result(row, str(err))
        try:
            size = len(json.dumps(output))
        except (TypeError, ValueError) as err:
            return error_result(row, f"python tool returned something not JSON: {err}")
        if size > outbox_config.MAX_PAYLOAD_BYTES:
            return error_result(
                row,
                f"tool result is {size} bytes, over the cap of {outbox_config.MAX_PAYLOAD_BYTES}",
            )
        return result(row, output)

    def _load(self, path: str) -> Callable[..., Any]:
        function = self._callables.get(path)
        if function is None:
            module_name, _, attr = path.partition(":")
            function = getattr(importlib.import_module(module_name), attr)
            if not callable(function):
                raise TypeError(f"{path} is not callable")
            self._callables[path] = function
        return function


def describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def preview(response: httpx2.Response) -> str:
    text = response.text
    return text if len(text) <= RESPONSE_PREVIEW_CHARS else text[:RESPONSE_PREVIEW_CHARS] + "..."


# -- in-process tools -------------------------------------------------------------------

PYTHON_TOOL_THREADS = 64  # pool threads running in-process tools, per worker process
_python_pool: ThreadPoolExecutor | None = None
_python_pool_lock = threading.Lock()


class ToolRaised(Exception):
    """An in-process tool raised; the message is the error result the model will see."""


def python_tool_pool() -> ThreadPoolExecutor:
    """The process's pool for in-process tools (created on first use).

    One small pool instead of a thread per call: its threads are reused, so a call costs a
    hand-off, not a thread start. A tool stuck past its timeout keeps its thread until it
    returns; when all are stuck, new calls wait in the queue and, cancelled unstarted at
    their deadline, are retried later rather than treated as ambiguous.
    """
    global _python_pool
    with _python_pool_lock:
        if _python_pool is None:
            _python_pool = ThreadPoolExecutor(PYTHON_TOOL_THREADS, thread_name_prefix="pytool")
        return _python_pool


def _call_tool(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    try:
        return function(**arguments)
    except BaseException as err:  # a tool's SystemExit must not end a relay thread
        raise ToolRaised(f"{type(err).__name__}: {err}") from None
