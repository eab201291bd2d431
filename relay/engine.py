"""The I/O engine: every effect in flight is a task on one event loop, none a connection.

Agent work is latency-bound: a model turn waits seconds for its model, a tool call for its
service. A relay process therefore holds its effects in flight as asyncio tasks on one
event loop thread (model calls and HTTP tools, each a POST through ``relay.poster``), as
many as ``--concurrency`` allows, while the database is reached through the process's few
fixed links (``relay.links``): what a task needs from PostgreSQL
before its effect is batched with other tasks' by ``relay.preparer``, and its outcome goes to
a completer thread that writes many per transaction (``relay.completer``).

HTTP goes through one ``relay.poster.Poster`` per process: kept-alive connections per
origin, shared by tool calls, model calls and webhooks. MCP tools go through the sessions
``relay.mcpclient`` keeps per server, on this loop too.

In-process tools do not run here: they are calls into Python code, run on threads by
``relay.inprocess``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from outbox import config as outbox_config
from outbox.logs import log
from outbox.relay.executors import ToolExecutor
from outbox.relay.model_turns import DEFAULT_BASE_URL, ModelExecutor, ModelServer
from outbox.relay.outcomes import Claimed, Outcome, retry
from outbox.relay.poster import IDLE_S, Poster
from outbox.relay.preparer import Preparer
from outbox.relay.webhook import WebhookExecutor

logger = logging.getLogger("relay.engine")


class Engine:
    """The event loop thread of a worker process and the effects running on it.

    ``submit`` (from any thread) starts a task per row; each task's outcome, or a retry if
    its executor crashed, goes to ``finished`` (called on the loop thread), which queues it
    for a completer.
    """

    def __init__(
        self,
        preparer: Preparer,
        threads: Executor,
        finished: Callable[[Claimed, Outcome | None], None],
        started: Callable[[Claimed], bool],
        *,
        max_model_answer_bytes: int = outbox_config.MAX_MODEL_ANSWER_BYTES,
        affinity_headers: dict[str | None, str] | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.max_model_answer_bytes = max_model_answer_bytes
        self.affinity_headers = affinity_headers or {}
        self.finished = finished
        self.started = started
        # The effects running, each with its row: a task of the executor's coroutine itself,
        # no coroutine of ours around it (its frame would be kept by every effect in flight).
        self.tasks: dict[asyncio.Task[Outcome], Claimed] = {}
        self._when_done = self._done  # one bound method for every task's callback
        self.http = Poster()
        self.models: dict[tuple[str | None, str], ModelServer] = {}
        self.tools = ToolExecutor(self.http, preparer.mark, threads, preparer.read)
        model = ModelExecutor(preparer.turn, self._model_server)
        preparer.held_until = model.held_until  # read by the routing of turns
        self.executors: dict[str, Callable[[Claimed], Coroutine[Any, Any, Outcome]]] = {
            "tool_call": self.tools.run,
            "model_turn": model.run,
            "webhook": WebhookExecutor(self.http).run,
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
        self.sweeper = self.loop.create_task(self._close_idle_connections())
        self.loop.run_forever()
        self.loop.close()

    def _spawn(self, rows: list[Claimed]) -> None:
        for row in rows:
            if not self.started(row):  # the worker is stopping: released unrun
                self.finished(row, None)
                continue
            task = self.loop.create_task(self.executors[row.kind](row))
            self.tasks[task] = row
            task.add_done_callback(self._when_done)

    def _done(self, task: asyncio.Task[Outcome]) -> None:
        """An effect ended: its outcome, or a retry if its executor crashed, to ``finished``;
        cancelled (shutdown after the grace period), its row is released (None)."""
        row = self.tasks.pop(task)
        if task.cancelled():
            self.finished(row, None)
            return
        err = task.exception()
        if err is None:
            self.finished(row, task.result())
        elif isinstance(err, Exception):
            log(logger, logging.ERROR, "executor.crashed", error=repr(err), **row.context())
            self.finished(row, retry(row, f"executor crashed: {type(err).__name__}: {err}"))

    def _model_server(self, base_url: str | None) -> ModelServer:
        """The OpenAI-compatible server at ``base_url`` (else ``OPENAI_BASE_URL``, else
        OpenAI's), reached through this process's poster."""
        api_key = os.environ.get("OPENAI_API_KEY", "not-needed")
        key = (base_url, api_key)
        server = self.models.get(key)
        if server is None:
            url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
            affinity = self.affinity_headers.get(url.rstrip("/"), self.affinity_headers.get(None))
            server = ModelServer(
                self.http, url, api_key, self.max_model_answer_bytes, affinity_header=affinity
            )
            self.models[key] = server
        return server

    async def _close_idle_connections(self) -> None:
        while True:  # a connection past REPEATABLE_IDLE_S is never reused: closed within IDLE_S
            await asyncio.sleep(IDLE_S)
            self.http.close_idle(time.monotonic())

    async def _close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2)
        await self.http.aclose()
        await self.tools.mcp.sessions.aclose()
