"""Where handlers run the library's synchronous calls: one thread pool per process.

Starlette's ``run_in_threadpool`` goes through anyio (a capacity limiter, a cancel scope
and a checkpoint a call), which cost the event loop about a fifth of the server's CPU with
a thousand waiting requests (docs/benchmarks.md). ``in_thread`` hands the call to a
``ThreadPoolExecutor`` with one thread per database connection of the server's requests
(``serve --db-connections`` but the ``LISTEN`` one: ``size``): every call takes a pooled
connection, so a thread more would only wait for one, holding none, while it contends for
the interpreter with those that do; calls past it wait their turn in its queue. The
caller's context variables go with the call (the request's trace), and a cancelled caller
waits for its call to end before its cancellation goes on: the call holds a pooled
connection until its transaction ends.

The queue has a deadline (``serve --queue-timeout``): a call that waited longer for a
thread is not run but refused with ``ServerBusy`` (a 503 with ``Retry-After``), as long as
nothing of its request has been done yet, so the refused request stored nothing and its
client may send it again. Once a request ran a call that may write (``in_thread``; a key's
look-up, ``read_in_thread``, writes nothing), its later calls wait their turn however
long: the answer of a request whose run was created is never refused. Without it a burst
past what the server can store would queue without bound, each request waiting longer
than its client does.

A request whose client has gone while its first call that may write was queued (a client
timeout shorter than the queue's: the connection closed) is dropped when the call's turn
comes, ``ClientGone``, nothing of it done: run then, it would make a run nobody waits for,
and a client that sent it again without an ``Idempotency-Key`` would get a second one.
While such a call queues, its request's body read, a watcher waits for the client's
disconnect (the only message the server can send a request after its body).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from starlette.types import Message, Receive

from outbox.server.db_pool import DB_CONNECTIONS
from outbox.server.observed import (
    GONE_REQUESTS,
    QUEUE_WAIT_SECONDS,
    QUEUED_CALLS,
    QUEUED_GONE,
    SHED_REQUESTS,
)

P = ParamSpec("P")
T = TypeVar("T")
_lock = threading.Lock()
_threads = DB_CONNECTIONS  # an app's connections, until one says otherwise (size)
_pool = ThreadPoolExecutor(_threads, thread_name_prefix="outbox-serve")
QUEUE_TIMEOUT_S = 30.0  # seconds a request's first call may wait for a thread (a default)
_queue_timeout_s = QUEUE_TIMEOUT_S
# Whether the current request ran a call that may have written: its calls are never shed
# from then on. Set to False for each request (``new_request``): a request's task may
# start in a copy of the previous one's context (uvicorn, pipelined requests).
_begun: contextvars.ContextVar[bool] = contextvars.ContextVar("outbox_serve_begun", default=False)
RETRY_AFTER_MAX_S = 60.0  # the longest delay a refusal asks for: clients refuse longer ones


_waiting = 0  # calls queued for a thread now (changed under _lock)
_held_s = 0.005  # how long a call holds its thread: a moving average, seconds
QUEUED_CALLS.set_function(lambda: _waiting)


class ServerBusy(Exception):
    """A request refused before anything of it was done: its call waited ``waited_s`` for
    a thread, past the queue timeout ``timeout_s``. ``retry_after_s``: how long the calls
    queued now take to get a thread (1 s to ``RETRY_AFTER_MAX_S``), when a resend finds
    room."""

    def __init__(self, waited_s: float, timeout_s: float, retry_after_s: float) -> None:
        super().__init__(f"waited {waited_s:.1f} s for a database connection")
        self.waited_s = waited_s
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s


class ClientGone(Exception):
    """A request dropped before anything of it was done: its client left while its call
    waited ``waited_s`` for a thread."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"the client left while its request waited {waited_s:.1f} s")
        self.waited_s = waited_s


class Caller:
    """A request's client, as the queue sees it: whether the request's body has been read
    (``received`` is the receive its app is given) and whether the client has gone."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.body_read = False
        self.gone = threading.Event()  # set on the event loop, read by the pool's threads

    async def received(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self.body_read = True
        elif message["type"] == "http.disconnect":
            self.gone.set()
        return message

    def watch(self) -> asyncio.Task[Message] | None:
        """Wait for the client's disconnect while a call queues (a task to cancel once it
        has its thread); none before the body is read: the next message would be the body."""
        if not self.body_read or self.gone.is_set():
            return None
        return asyncio.get_running_loop().create_task(self.received())


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "outbox_serve_caller", default=None
)
_watched: set[Caller] = set()  # the clients of queued calls that may be dropped (under _lock)
QUEUED_GONE.set_function(lambda: sum(c.gone.is_set() for c in list(_watched)))


def size(threads: int) -> None:
    """Give the pool ``threads`` threads: the connections of the app being made (in a
    process that makes several, the tests', the newest app's count)."""
    global _pool, _threads
    with _lock:
        if threads != _threads:
            # Not shut down: a call of an app already serving may be handed to it still.
            # Its calls run on; its idle threads end once it is collected.
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="outbox-serve")
            _threads = threads


def _queue(change: int) -> None:
    global _waiting
    with _lock:
        _waiting += change


def queue_timeout(seconds: float) -> None:
    """Refuse a request whose first call waited more than ``seconds`` for a thread (the
    app being made's ``--queue-timeout``; as ``size``, the newest app's in a process)."""
    global _queue_timeout_s
    _queue_timeout_s = seconds


Tokens = tuple[contextvars.Token[bool], contextvars.Token[Caller | None]]


def new_request(receive: Receive) -> tuple[Tokens, Receive]:
    """Before a request is handled (server.access): none of it has begun, and its client
    is watched through the receive returned, which its app is to be given."""
    caller = Caller(receive)
    return (_begun.set(False), _caller.set(caller)), caller.received


def end_request(tokens: Tokens) -> None:
    _begun.reset(tokens[0])
    _caller.reset(tokens[1])


def begun() -> None:
    """Mark the current context's request as begun: none of its calls is shed (for work
    that answers requests whose runs exist: server.reads)."""
    _begun.set(True)


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the server's thread pool, with the caller's context;
    ``ServerBusy`` instead when it waited past the queue timeout and is its request's
    first call that may write (the module's docstring)."""
    sheddable = not _begun.get()
    _begun.set(True)
    return await _run(sheddable, functools.partial(fn, *args, **kwargs))


async def read_in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``in_thread`` for a call that writes nothing (an API key's look-up): the request's
    next call may still be shed."""
    return await _run(not _begun.get(), functools.partial(fn, *args, **kwargs))


async def _run(sheddable: bool, fn: Callable[[], T]) -> T:
    queued, timeout, context = time.monotonic(), _queue_timeout_s, contextvars.copy_context()
    caller = _caller.get() if sheddable else None
    _queue(+1)
    if caller is not None:
        with _lock:
            _watched.add(caller)

    def call() -> T:
        global _held_s
        started = time.monotonic()
        _queue(-1)
        if caller is not None:
            with _lock:
                _watched.discard(caller)
        QUEUE_WAIT_SECONDS.observe(started - queued)
        if sheddable and started - queued > timeout:
            SHED_REQUESTS.inc()
            # Sent again once the calls queued now have had their threads, a resend waits
            # less than the timeout (each client spreads its own resends: server.errors).
            drain_s = _waiting * _held_s / _threads
            raise ServerBusy(started - queued, timeout, min(max(1.0, drain_s), RETRY_AFTER_MAX_S))
        if caller is not None and caller.gone.is_set():
            GONE_REQUESTS.inc()
            raise ClientGone(started - queued)
        try:
            return context.run(fn)
        finally:
            # Racing threads may lose an update: an estimate, not a count.
            _held_s += (time.monotonic() - started - _held_s) / 64

    try:
        done = asyncio.get_running_loop().run_in_executor(_pool, call)
    except BaseException:
        _queue(-1)  # not queued after all (a pool shut down with the interpreter)
        if caller is not None:
            with _lock:
                _watched.discard(caller)
        raise
    watcher = caller.watch() if caller is not None else None
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait({done})  # the call ends first (it may hold a connection)
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
