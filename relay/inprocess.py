"""In-process (python) tools, run in chunks: many calls per thread hop, each with its own timeout.

An in-process tool may take microseconds, less than the hand-offs around it: a slot thread
and a pool thread per call would cost more than the tool. So a chunk of claimed calls runs
on one pool thread, one call after the other, while the caller watches the call in progress
against that call's own timeout. It wakes when the chunk ends, when the watched deadline
passes, or when a call starts whose deadline comes sooner; not after every call.

What a timeout means is the same as for one call alone:

- a call that started and did not return in time is *ambiguous*: Python cannot stop a
  thread, so it runs on and its late answer is dropped; the tool's idempotency mode decides
  (``key`` retries, ``none`` goes to ``outcome_unknown``). The chunk is abandoned there and
  the calls after it, which never started, run in a new chunk;
- a chunk that has not started by its first call's deadline (every pool thread is stuck in
  a tool that overran) is cancelled: none of its calls ran, so all are retried later.

A thread kept by a call that overran is counted until the call returns (``overrunning``).
When every thread of the pool is kept (``wedged``), no in-process tool can run in this
process again until one returns, which may be never: the worker then stops and exits to be
restarted (``relay.worker``).

Import errors, exceptions (even ``SystemExit``), results that are not JSON or over the
payload cap become error results the model sees.

A tool function that takes a keyword ``outbox_context`` receives a ``ToolContext``
(``outbox.registry``): the call's idempotency key and ids, and only the credential its
registration names, resolved for the call's tenant; the secret is cut from its answer.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from outbox import config as outbox_config
from outbox import credentials, storable
from outbox.registry import ToolContext
from outbox.relay.outcomes import (
    Claimed,
    Outcome,
    ambiguous,
    error_result,
    redacted,
    retry,
    secret_of,
)

DEFAULT_TIMEOUT_S = 30.0  # a tool version always has one; this is for rows without a tool
_pool: ThreadPoolExecutor | None = None
_pool_threads = 64  # the pool's size (``configure``, before first use)
_pool_lock = threading.Lock()
_overrunning = 0  # pool threads kept by a call that overran its timeout
_callables: dict[str, Callable[..., Any]] = {}
_wants_context: dict[Callable[..., Any], bool] = {}
CONTEXT = "outbox_context"  # the keyword a tool function takes to receive a ToolContext


def configure(threads: int) -> None:
    """Size the process's pool; once it exists (one pool per process), nothing changes."""
    global _pool_threads
    with _pool_lock:
        if _pool is None:
            _pool_threads = threads


def pool() -> ThreadPoolExecutor:
    """The process's pool for in-process tools (created on first use).

    A tool stuck past its timeout keeps its thread until it returns; when all are stuck,
    new chunks wait in the queue and, cancelled unstarted at their deadline, are retried.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_pool_threads, thread_name_prefix="pytool")
        return _pool


def overrunning() -> int:
    """Pool threads kept by calls that overran their timeout and have not returned."""
    return _overrunning


def wedged() -> bool:
    """Whether every pool thread is kept by an overrunning call."""
    return _overrunning >= _pool_threads


def _count_overrun(change: int) -> None:
    global _overrunning
    with _pool_lock:
        _overrunning += change


def load(path: str) -> Callable[..., Any]:
    """The callable named ``package.module:function`` (imported once per process)."""
    function = _callables.get(path)
    if function is None:
        module_name, _, attr = path.partition(":")
        function = getattr(importlib.import_module(module_name), attr)
        if not callable(function):
            raise TypeError(f"{path} is not callable")
        _callables[path] = function
    return function


@dataclass
class _Chunk:
    """Calls run one after the other on a pool thread; shared with the waiting caller."""

    functions: list[Callable[..., Any]]
    arguments: list[dict[str, Any]]
    timeouts: list[float]  # seconds, per call
    answers: list[tuple[bool, Any, float]] = field(default_factory=list)  # (ok, value, s)
    current: int = -1  # index of the call in progress; -1 before the first
    started_at: float = 0.0  # monotonic start of the call in progress
    watched_until: float = float("inf")  # monotonic time the waiting caller sleeps until
    finished: bool = False
    abandoned: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        for i, (function, arguments) in enumerate(zip(self.functions, self.arguments, strict=True)):
            started = time.monotonic()
            with self.cond:
                if self.abandoned:
                    return
                self.current, self.started_at = i, started
                if started + self.timeouts[i] < self.watched_until:
                    self.cond.notify_all()  # this call's deadline comes first: re-arm the watch
            try:
                ok, value = True, function(**arguments)
            except BaseException as err:  # a tool's SystemExit must not end a relay thread
                ok, value = False, _describe(err)
            answer = (ok, value, time.monotonic() - started)
            with self.cond:
                if self.abandoned:  # the caller gave up on this call: drop its late answer
                    _count_overrun(-1)  # and the thread is free again
                    return
                self.answers.append(answer)
        with self.cond:
            self.finished = True
            self.cond.notify_all()


def run_calls(rows: list[Claimed]) -> list[Outcome]:
    """Run the in-process tool calls of ``rows``; one outcome per row, in any order."""
    outcomes: list[Outcome] = []
    todo: list[tuple[Claimed, Callable[..., Any]]] = []
    secrets: dict[int, credentials.Secret] = {}
    for row in rows:
        try:
            function = load(row.callable or "")
            secret = secret_of(row)
        except credentials.CredentialRevoked as err:
            outcomes.append(error_result(row, str(err)))
        except credentials.CredentialUnavailable as err:
            outcomes.append(retry(row, str(err), unsent=True))
        except Exception as err:
            outcomes.append(error_result(row, f"cannot load python tool {row.callable!r}: {err}"))
        else:
            if secret is not None:
                secrets[row.id] = secret
            todo.append((row, function))
    done: list[Outcome] = []
    while todo:
        todo = _run_chunk(todo, done, secrets)
    return outcomes + [redacted(o, secrets.get(o.row.id)) for o in done]


def wants_context(function: Callable[..., Any]) -> bool:
    """Whether a tool function takes ``outbox_context`` (asked once per function)."""
    wanted = _wants_context.get(function)
    if wanted is None:
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            parameters = {}  # type: ignore[assignment]
        wanted = _wants_context[function] = CONTEXT in parameters
    return wanted


def _arguments(
    row: Claimed, function: Callable[..., Any], secret: credentials.Secret | None
) -> dict[str, Any]:
    arguments = dict(row.arguments or {})
    if wants_context(function):
        arguments[CONTEXT] = ToolContext(
            tenant_id=row.tenant_id,
            run_id=str(row.run_id),
            tool_call_id=row.tool_call_id or "",
            idempotency_key=row.idempotency_key or "",
            attempt=row.attempt,
            credentials={} if secret is None else {secret.name: secret.value},
        )
    return arguments


def _timeout(row: Claimed) -> float:
    return row.timeout_s or DEFAULT_TIMEOUT_S


def _run_chunk(
    todo: list[tuple[Claimed, Callable[..., Any]]],
    outcomes: list[Outcome],
    secrets: dict[int, credentials.Secret],
) -> list[tuple[Claimed, Callable[..., Any]]]:
    """Run one chunk; append outcomes; return the calls that never started and must run."""
    chunk = _Chunk(
        [f for _, f in todo],
        [_arguments(row, f, secrets.get(row.id)) for row, f in todo],
        [_timeout(r) for r, _ in todo],
    )
    submitted = time.monotonic()
    future = pool().submit(chunk.run)
    overran = -1
    with chunk.cond:
        while not chunk.finished:
            i = chunk.current
            start = submitted if i < 0 else chunk.started_at
            chunk.watched_until = start + chunk.timeouts[max(i, 0)]
            left = chunk.watched_until - time.monotonic()
            if left > 0:
                chunk.cond.wait(left)
                continue
            if i >= 0 and len(chunk.answers) > i:
                # Call i has answered and the next has not started yet: no overrun. Its
                # start (a sooner deadline than this) or the chunk's end wakes the watch.
                chunk.watched_until = float("inf")
                chunk.cond.wait()
                continue
            if i >= 0:
                chunk.abandoned, overran = True, i
                _count_overrun(+1)  # under the chunk's lock: before its thread can return
                break
            if not future.cancel():  # starting this instant: its first call gets its full time
                submitted = time.monotonic()
                continue
            for row, _ in todo:
                outcomes.append(
                    retry(
                        row,
                        f"python tool {row.callable} did not start within {_timeout(row)}s",
                        unsent=True,
                    )
                )
            return []
        answers = list(chunk.answers)  # stops short of the call that overran
    for (row, _), (ok, value, seconds) in zip(todo, answers, strict=False):
        outcomes.append(_judge(row, ok, value, seconds))
    if overran < 0:
        return []
    row = todo[overran][0]
    outcomes.append(
        ambiguous(row, f"python tool {row.callable} did not return within {_timeout(row)}s")
    )
    return todo[overran + 1 :]


def _describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:  # an exception whose str() fails still names its type
        return type(err).__name__


def _judge(row: Claimed, ok: bool, value: Any, seconds: float) -> Outcome:
    """The outcome of one finished call: its result, or the error the model will see,
    timed for its span as long as it took, ending now (its chunk has just ended)."""
    started_at = time.time() - seconds
    error = None if ok else str(value)
    if ok:
        try:
            size = len(storable.dumps(value, "tool result"))
        except storable.NotStorable as err:
            error = err.args[0]
        else:
            if size > outbox_config.MAX_PAYLOAD_BYTES:
                cap = outbox_config.MAX_PAYLOAD_BYTES
                error = f"tool result is {size} bytes, over the cap of {cap}"
    if error is None:
        return Outcome(row, "result", "ok", value, None, "relay", seconds, started_at)
    return Outcome(row, "result", "error", None, error, "relay", seconds, started_at)
