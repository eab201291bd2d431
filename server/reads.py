"""Requests that wait on their responses read them together.

One commit of the relay settles many runs at once (a batch of model turns), and its
notifications wake every request waiting on one of them in the same turn of the event
loop (server.wakeups). Each read on its own was a transaction of its own: a pooled
connection, a trip to the thread pool, the statement's start-up in PostgreSQL and the
tenant's row-level security set up again, for a row of some forty buffers. Here a read
asked while the tenant's last one is under way (or in the same turn of the event loop as
another) waits for the next statement, which reads every response asked for meanwhile
(``responses.get_settled``): one transaction per tenant and wake-up, not one per request.

Only reads that answer from a durable commit of the relay go here (``durable_reads=False``
in server.store): a request's answer once its response settled, and a stream's events.
Tenants never share a statement: each has its own queue, read under its own scope.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from outbox.errors import NotFound
from outbox.server import responses
from outbox.server.store import Store
from outbox.server.threads import in_thread

Row = dict[str, Any]


class SettledReads:
    """The process's batched reads of responses, one queue per tenant."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Per tenant: the responses asked for since its last read began, each with the
        # requests waiting for it.
        self.asked: dict[str, dict[uuid.UUID, list[asyncio.Future[Row | None]]]] = {}
        self.readers: dict[str, asyncio.Task[None]] = {}  # the tenant's reading task

    async def get(self, tenant: str, ident: uuid.UUID) -> Row:
        """The response as OpenAI shows it (``responses.get`` with ``durable_reads=False``),
        read with every other response of the tenant asked for meanwhile. ``NotFound``
        when it is not (or no longer) there."""
        answer: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self.asked.setdefault(tenant, {}).setdefault(ident, []).append(answer)
        if tenant not in self.readers:
            self.readers[tenant] = asyncio.create_task(
                self._read(tenant), name="outbox-serve-reads"
            )
        shown = await answer
        if shown is None:
            raise NotFound(f"Response with id 'resp_{ident.hex}' not found.")
        return shown

    async def _read(self, tenant: str) -> None:
        """Read the tenant's asked responses until none is left, a statement at a time."""
        waiting: list[tuple[uuid.UUID, list[asyncio.Future[Row | None]]]] = []
        try:
            while self.asked.get(tenant):
                # The requests one notification burst woke ask in this same turn of the
                # loop: let them all ask before the statement goes.
                await asyncio.sleep(0)
                batch = self.asked.pop(tenant)
                waiting = [(i, fs) for i, fs in batch.items() if not all(f.done() for f in fs)]
                if not waiting:
                    continue
                try:
                    shown = await in_thread(
                        responses.get_settled, self.store, tenant, [i for i, _ in waiting]
                    )
                except Exception as err:  # each request fails as its own read would have
                    _settle(waiting, error=err)
                else:
                    _settle(waiting, shown=shown)
                waiting = []
        finally:
            # Only a cancelled reader (the server stopping) leaves requests here.
            del self.readers[tenant]
            _settle(waiting + list(self.asked.pop(tenant, {}).items()), error=None)


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
