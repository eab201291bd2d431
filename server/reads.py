"""Requests that wait on their responses read them together.

One commit of the relay settles many runs at once (a batch of model turns), and its
notifications wake every request waiting on one of them in the same turn of the event
loop (server.wakeups). Each read on its own was a transaction of its own: a pooled
connection, a trip to the thread pool, the statement's start-up in PostgreSQL and the
tenant's row-level security set up again, for a row of some forty buffers. Here the
reads a tenant's requests ask in one turn of the loop go in one statement
(``responses.get_settled``), sent at the next turn: one transaction per tenant and
wake-up, not one per request. A read asked later goes in a statement of its own turn,
never queued behind one under way (the thread pool may hold it a while under load).

Only reads that answer from a durable commit of the relay go here (``durable_reads=False``
in server.db_pool): a request's answer once its response settled, and a stream's events.
Tenants never share a statement: each turn's reads are grouped by tenant, each group read
under its own scope.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from outbox.errors import NotFound
from outbox.server import responses
from outbox.server.db_pool import Store
from outbox.server.thread_pool import begun, in_thread

Row = dict[str, Any]
Asked = dict[uuid.UUID, list["asyncio.Future[Row | None]"]]  # a response: who waits for it


class SettledReads:
    """The process's reads of responses for the requests waiting on them, a statement per
    tenant and turn of the event loop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.asked: dict[str, Asked] = {}  # per tenant: asked in this turn, not sent yet
        self.reading: set[asyncio.Task[None]] = set()  # statements on their way

    async def get(self, tenant: str, ident: uuid.UUID) -> Row:
        """The response as OpenAI shows it (``responses.get_settled``), read with the
        tenant's other responses asked in the same turn. ``NotFound`` when it is not (or no
        longer) there."""
        answer: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        asked = self.asked.get(tenant)
        if asked is None:
            # Its first step runs at the next turn: after every request woken with this
            # one asked.
            asked = self.asked[tenant] = {}
            reading = asyncio.create_task(self._read(tenant, asked), name="outbox-serve-reads")
            self.reading.add(reading)
            reading.add_done_callback(self.reading.discard)
        asked.setdefault(ident, []).append(answer)
        shown = await answer
        if shown is None:
            raise NotFound(f"Response with id 'resp_{ident.hex}' not found.")
        return shown

    async def _read(self, tenant: str, asked: Asked) -> None:
        """One statement for the responses ``asked``; each request gets its answer."""
        waiting: list[tuple[uuid.UUID, list[asyncio.Future[Row | None]]]] = []
        try:
            if self.asked.get(tenant) is asked:
                del self.asked[tenant]  # asked from now on: the next statement's
            waiting = [(i, fs) for i, fs in asked.items() if not all(f.done() for f in fs)]
            if not waiting:
                return
            begun()  # these answer requests whose runs exist: never shed (server.thread_pool)
            try:
                shown = await in_thread(
                    responses.get_settled, self.store, tenant, [i for i, _ in waiting]
                )
            except Exception as err:  # each request fails as its own read would have
                _settle(waiting, error=err)
            else:
                _settle(waiting, shown=shown)
        finally:
            if self.asked.get(tenant) is asked:  # cancelled before its first step
                del self.asked[tenant]
                waiting = list(asked.items())
            _settle(waiting, error=None)  # only a cancelled read leaves requests waiting


def _settle(
    waiting: list[tuple[uuid.UUID, list[asyncio.Future[Row | None]]]],
    *,
    shown: dict[uuid.UUID, Row] | None = None,
    error: Exception | None = None,
) -> None:
    """Answer each request still waiting: its response (None: not found), or ``error``;
    cancelled when there is neither."""
    for ident, answers in waiting:
        for answer in answers:
            if answer.done():
                continue
            if shown is not None:
                answer.set_result(shown.get(ident))
            elif error is not None:
                answer.set_exception(error)
            else:
                answer.cancel()
