"""The I/O engine: every effect in flight is a task on one event loop, none a connection.

Agent work is latency-bound: a model turn waits seconds for its model, a tool call for its
service. A relay process therefore holds its effects in flight as asyncio tasks on one
event loop thread (model calls and HTTP tools, each a POST through ``relay.poster``), as
many as ``--concurrency`` allows, while the database is reached through the process's few
fixed links (``relay.links``): what a task needs from PostgreSQL
before its effect is batched with other tasks' by ``relay.preparer``, and its outcome goes to
a completer thread that writes many per transaction (``relay.completer``).

HTTP pools come in shards of ``SHARD_CONNECTIONS`` connections: httpcore's pool walks all
its connections (and probes every idle socket, which cost a quarter of the loop's time with
shards of 64) each time a request starts or ends, so one pool of ten thousand connections
would cost ten thousand steps per request. A request takes a free place on a client
(``Shards``), so no pool ever holds more than a handful.

In-process tools do not run here: they are calls into Python code, run on threads by
``relay.inprocess``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

import sniffio

from outbox.logs import log
from relay.executors import ToolExecutor
from relay.model import DEFAULT_BASE_URL, ModelExecutor, ModelServer
from relay.outcomes import Claimed, Outcome, retry
from relay.poster import SHARD_CONNECTIONS, Connector, Poster
from relay.preparer import Preparer
from relay.webhook import WebhookExecutor

logger = logging.getLogger("relay.engine")
IDLE_CLIENT_S = 30.0  # a client none of whose places was taken for this long is closed


class Shards:
    """HTTP clients with ``SHARD_CONNECTIONS`` places each, handed out place by place.

    ``acquire`` gives the client of the most recently freed place (last in, first out), so
    requests reuse warm connections of few clients while the others' idle connections
    expire; a client never gets more requests at once than it has connections, so none
    waits in a pool (and times out there) while another client has room. A client is made
    when a place of it is first taken, and closed by ``close_idle`` once none of its places
    has been taken for ``IDLE_CLIENT_S``: httpcore expires a keep-alive connection only when
    its pool is used again, so the clients a burst made kept their sockets (a file
    descriptor each, or a half-closed one once the server hung up) for good.
    """

    def __init__(self, n: int, make: Callable[[], Any]) -> None:  # make(): has ``aclose``
        self.make = make
        self.clients: list[Any] = [None] * max(1, n)
        self.busy = [0] * len(self.clients)  # places taken, per client
        self.freed = [0.0] * len(self.clients)  # when a place of it was last given back
        self.places = collections.deque(
            i for i in range(len(self.clients)) for _ in range(SHARD_CONNECTIONS)
        )

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        if not self.places:  # more requests at once than planned for: one more client
            self.clients.append(None)
            self.busy.append(0)
            self.freed.append(0.0)
            self.places.extend([len(self.clients) - 1] * SHARD_CONNECTIONS)
        i = self.places.popleft()
        self.busy[i] += 1
        try:
            client = self.clients[i]
            if client is None:
                client = self.clients[i] = self.make()
            yield client
        finally:
            self.busy[i] -= 1
            self.freed[i] = time.monotonic()
            self.places.appendleft(i)

    async def close_idle(self, now: float) -> int:
        """Close the clients none of whose places was taken since ``now - IDLE_CLIENT_S``;
        returns how many."""
        idle = [
            i
            for i, client in enumerate(self.clients)
            if client is not None and not self.busy[i] and now - self.freed[i] > IDLE_CLIENT_S
        ]
        for i in idle:
            client, self.clients[i] = self.clients[i], None
            await client.aclose()
        return len(idle)

    async def aclose(self) -> None:
        for client in self.clients:
            if client is not None:
                await client.aclose()


class Engine:
    """The event loop thread of a worker process and the effects running on it.

    ``submit`` (from any thread) starts a task per row; each task's outcome, or a retry if
    its executor crashed, goes to ``finished`` (called on the loop thread), which queues it
    for a completer.
    """

    def __init__(
        self,
        concurrency: int,
        preparer: Preparer,
        threads: Executor,
        finished: Callable[[Claimed, Outcome | None], None],
        started: Callable[[Claimed], bool],
    ) -> None:
        self.shards = -(-concurrency // SHARD_CONNECTIONS)  # ceil
        self.loop = asyncio.new_event_loop()
        self.finished = finished
        self.started = started
        self.tasks: set[asyncio.Task[None]] = set()
        self.network = Connector()  # shared: it paces the opening of connections
        self.http = Shards(self.shards, lambda: Poster(self.network))
        self.models: dict[tuple[str | None, str], Shards] = {}
        tools = ToolExecutor(self.http.acquire, preparer.mark, threads)
        model = ModelExecutor(preparer.turn, self._model_client)
        self.executors: dict[str, Callable[[Claimed], Coroutine[Any, Any, Outcome]]] = {
            "tool_call": tools.run,
            "model_turn": model.run,
            "webhook": WebhookExecutor(self.http.acquire).run,
        }
        self.thread = threading.Thread(target=self._run, name="io", daemon=True)
        self.sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.thread.start()

    def submit(self, rows: list[Claimed]) -> None:
        """Start the effects of ``rows`` (thread-safe; one hop to the loop for all)."""
        self.loop.call_soon_threadsafe(self._spawn, rows)

    def stop(self) -> None:
        """Cancel what still runs, close the clients and end the loop thread (after the
        worker's grace period: effects still running then are released by the worker)."""
        if not self.thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
        try:
            future.result(timeout=5)
        except Exception as err:
            log(logger, logging.WARNING, "engine.close_failed", error=repr(err))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # httpcore2 asks sniffio which event loop runs it for every lock, event and shield
        # of every request; sniffio then looks up the current task. This thread only ever
        # runs asyncio: saying so once spares that lookup (about 4 % of the relay's CPU).
        sniffio.thread_local.name = "asyncio"
        self.sweeper = self.loop.create_task(self._close_idle_clients())
        self.loop.run_forever()
        self.loop.close()

    def _spawn(self, rows: list[Claimed]) -> None:
        for row in rows:
            task = self.loop.create_task(self._perform(row))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _perform(self, row: Claimed) -> None:
        if not self.started(row):  # the worker is stopping: released unrun
            self.finished(row, None)
            return
        try:
            outcome = await self.executors[row.kind](row)
        except asyncio.CancelledError:
            self.finished(row, None)  # shutdown after the grace period: released
            raise
        except Exception as err:
            log(logger, logging.ERROR, "executor.crashed", error=repr(err), **row.context())
            outcome = retry(row, f"executor crashed: {type(err).__name__}: {err}")
        self.finished(row, outcome)

    def _model_client(self, base_url: str | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """A place on a pool for the OpenAI-compatible server at ``base_url`` (else
        ``OPENAI_BASE_URL``, else OpenAI's), as a ``ModelServer`` (a context manager)."""
        api_key = os.environ.get("OPENAI_API_KEY", "not-needed")
        key = (base_url, api_key)
        shards = self.models.get(key)
        if shards is None:
            url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL

            def make() -> ModelServer:
                return ModelServer(Poster(self.network), url, api_key)

            shards = self.models[key] = Shards(self.shards, make)
        return shards.acquire()

    async def _close_idle_clients(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CLIENT_S / 3)
            now = time.monotonic()
            for shards in [self.http, *self.models.values()]:
                try:
                    await shards.close_idle(now)
                except Exception as err:  # a socket that fails to close is closed anyway
                    log(logger, logging.WARNING, "engine.close_idle_failed", error=repr(err))

    async def _close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2)
        await self.http.aclose()
        for shards in self.models.values():
            await shards.aclose()
