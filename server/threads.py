"""Where handlers run the library's synchronous calls: one thread pool per process.

Starlette's ``run_in_threadpool`` goes through anyio (a capacity limiter, a cancel scope
and a checkpoint a call), which cost the event loop about a fifth of the server's CPU with
a thousand waiting requests (docs/benchmarks.md). ``in_thread`` hands the call to a
``ThreadPoolExecutor`` with one thread per database connection of the server (``serve
--db-connections``, ``size``): every call takes a pooled connection, so a thread more
would only wait for one, holding none, while it contends for the interpreter with those
that do; calls past it wait their turn in its queue. The caller's context variables go
with the call (the request's trace), and a cancelled caller waits for its call to end
before its cancellation goes on: the call holds a pooled connection until its
transaction ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from outbox.server.store import DB_CONNECTIONS

P = ParamSpec("P")
T = TypeVar("T")
_lock = threading.Lock()
_threads = DB_CONNECTIONS  # an app's connections, until one says otherwise (size)
_pool = ThreadPoolExecutor(_threads, thread_name_prefix="outbox-serve")


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


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the server's thread pool, with the caller's context."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    done = asyncio.get_running_loop().run_in_executor(_pool, call)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait({done})  # the call ends first (it may hold a connection)
        raise
