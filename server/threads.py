"""Where handlers run the library's synchronous calls: one thread pool per process.

Starlette's ``run_in_threadpool`` goes through anyio (a capacity limiter, a cancel scope
and a checkpoint a call), which cost the event loop about a fifth of the server's CPU with
a thousand waiting requests (docs/benchmarks.md). ``in_thread`` hands the call to a
``ThreadPoolExecutor`` of the same size as anyio's default (40): calls past it wait their
turn in its queue, as they waited on anyio's limiter. The caller's context variables go
with the call (the request's trace, as anyio carried them), and a cancelled caller waits
for its call to end before its cancellation goes on, as anyio's shielded call did: the
call holds a pooled connection until its transaction ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
THREADS = 40  # as many as Starlette's (anyio's) default limiter allowed

_pool = ThreadPoolExecutor(THREADS, thread_name_prefix="outbox-serve")


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the server's thread pool, with the caller's context."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    done = asyncio.get_running_loop().run_in_executor(_pool, call)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait({done})  # the call ends first (it may hold a connection)
        raise
