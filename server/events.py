"""A run's journal as Server-Sent Events, resumable with ``Last-Event-ID``.

The events are the journal rows of the run (what ``outbox journal tail --run`` shows),
each sent with its journal id as the SSE id; a client that reconnects with
``Last-Event-ID: N`` gets every event after N, none twice, none skipped.

Journal ids are taken when a row is inserted but commit in any order, so "every id above N"
is only a correct cursor if an event is sent once no smaller id of it can still commit.
Each poll reads the run's events and its snapshot's ``xmin`` (oldest running transaction)
and ``xmax`` (next transaction id). Every id up to the largest one a poll saw was taken
before that poll, by a transaction that had a transaction id below the poll's ``xmax``;
once a later poll's ``xmin`` reaches that ``xmax``, all of them have ended, and every event
up to that id is final: it is sent, in id order, and the cursor moves on. The price is one
poll interval of delay, and a write transaction left open anywhere on the server holds the
stream back until it ends (reads never do: they take no transaction id).

The stream reads the journal when the run's events change: every journal event of a run
sends ``NOTIFY outbox_journal`` at its commit, and the server's one ``LISTEN`` connection
wakes the streams of that run (server.wakeups). It reads again after ``POLL_S`` only while
some event it saw is not final yet, or its run's end is not, or the listener is
disconnected; otherwise, once every ``wakeups.FALLBACK_S`` (a notification switched off with
``outbox.run_notify = 'off'`` is then late, not lost).

The stream ends with an ``end`` event once the run has ended and its events up to its end
are sent; events that arrive later (a result of a call still in flight when the run was
cancelled) are there for the next request.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from outbox import constants
from outbox.server import shapes
from outbox.server.db_pool import Q, Store
from outbox.server.errors import not_found
from outbox.server.thread_pool import in_thread
from outbox.server.wakeups import FALLBACK_S, Wakeups, Watch
from outbox.statements import fetch_one

POLL_S = 0.2  # seconds between two reads of the journal while not woken by notifications
BATCH = 500  # events read per poll at most
ENDED = constants.ENDED


@dataclass
class Poll:
    status: str
    xmin: int
    xmax: int
    events: list[dict[str, Any]]


def read(store: Store, tenant: str, run_id: uuid.UUID, after_id: int) -> Poll:
    with store.tenant(tenant) as conn:
        row = fetch_one(
            conn, Q.run_events, {"run_id": run_id, "after_id": after_id, "limit": BATCH}
        )
    if row is None:
        raise not_found("run", run_id)
    return Poll(row["status"], row["snapshot_xmin"], row["snapshot_xmax"], row["events"])


@dataclass
class Cursor:
    """What has been sent (``last_id``) and what earlier polls saw (``seen``: the largest
    id of a poll and its ``xmax``, until a later ``xmin`` makes it final)."""

    last_id: int
    seen: list[tuple[int, int]] = field(default_factory=list)
    end_xmax: int | None = None  # xmax of the first poll that saw the run ended

    def final_up_to(self, poll: Poll) -> int:
        """The largest id below which every event is final as of ``poll``."""
        horizon = self.last_id
        for high, xmax in self.seen:
            if poll.xmin >= xmax:
                horizon = max(horizon, high)
        self.seen = [(high, xmax) for high, xmax in self.seen if poll.xmin < xmax]
        if poll.events:
            self.seen.append((poll.events[-1]["id"], poll.xmax))
        return horizon


async def stream(
    store: Store, tenant: str, run_id: uuid.UUID, after_id: int, hub: Wakeups
) -> AsyncIterator[dict[str, Any]]:
    """The SSE events of a run after ``after_id`` (see the module's docstring). Reads
    again at once when the run's journal or status changes (``hub``, server.wakeups)."""
    with hub.watch(run_id, journal=True) as watch:
        async for event in _events(store, tenant, run_id, after_id, watch):
            yield event


async def _events(
    store: Store, tenant: str, run_id: uuid.UUID, after_id: int, watch: Watch
) -> AsyncIterator[dict[str, Any]]:
    cursor = Cursor(after_id)
    while True:
        watch.clear()  # before the read: a change during it wakes the wait below
        poll = await in_thread(read, store, tenant, run_id, cursor.last_id)
        horizon = cursor.final_up_to(poll)
        sent = 0
        for event in poll.events:
            if event["id"] > horizon:
                break
            cursor.last_id = event["id"]
            sent += 1
            yield {
                "id": str(event["id"]),
                "event": event["event"],
                "data": shapes.event_data(event),
            }
        if cursor.end_xmax is None and poll.status in ENDED:
            cursor.end_xmax = poll.xmax
        finished = cursor.end_xmax is not None and poll.xmin >= cursor.end_xmax
        if finished and len(poll.events) < BATCH and not cursor.seen:
            yield {
                "event": "end",
                "data": shapes.event_data({"run_id": str(run_id), "status": poll.status}),
            }
            return
        if len(poll.events) < BATCH or sent == 0:  # a full batch sent: read on at once
            settling = bool(cursor.seen) or cursor.end_xmax is not None
            await watch.changed(POLL_S, listened_s=None if settling else FALLBACK_S)
