"""Requests that wait on a run wake when the run changes, not on a timer.

A waiting ``responses.create``, a ``stream=true`` reader and ``GET /v1/runs/{id}/events``
read their run again when something changed. What changed is told by the database: every
change of a run's status sends ``NOTIFY outbox_runs`` with the run's id
when its transaction commits. One ``LISTEN`` connection per server process (``Wakeups``,
an asyncio task started with the app) fans each notification out to the requests watching
that run (``watch``), so N waiting requests cost one connection and no polling.

Polling stays as the fallback, slow while the listener is connected (``FALLBACK_S``: a
notification lost with a dropped connection, a status change made with
``outbox.run_notify = 'off'``), at the callers' own pace otherwise: ``listen=False``
(``LISTEN`` does not work through a pooler in transaction mode, as the relay's
``--no-listen``), or while the listener reconnects. After a reconnect every watcher wakes
once, since a notification sent meanwhile was lost.

A watcher clears its flag before it reads the run and waits after: a notification that
arrives during the read sets the flag again, so none falls between read and wait.

A request that just made its run need not read it before it waits (a waiting
``responses.create``: its run was queued by the create's commit) when the listener was
connected from before that commit until its watch was in place (``mark`` before the
create, ``watch(..., since=mark)`` after it: ``Watch.primed``). Every notification of the
run then reached this process: those that came before the watch are kept (``recent``,
the last ``RECENT`` runs' statuses) and wake it at once, the later ones wake it as any.

The same connection listens on ``outbox_approvals`` (an approval requested or decided):
the console's inbox watches a tenant (``watch_tenant``; ``*``: every tenant), and each such
notification wakes the watchers of its tenant, so N open inboxes cost no more connections.

And on ``outbox_journal`` (a journal event of a run committed): it wakes the watchers of
that run that follow its journal (``watch(..., journal=True)``: a run's timeline, the run
event stream), not those that wait for its status alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterator

import psycopg

from outbox import db
from outbox.logs import log

logger = logging.getLogger("server.wakeups")  # JSON lines as every server log (outbox.logs)
CHANNEL = "outbox_runs"  # the channel a run's status change notifies
APPROVALS = "outbox_approvals"  # the channel an approval requested or decided notifies
JOURNAL = "outbox_journal"  # the channel a journal event of a run notifies
FALLBACK_S = 5.0  # seconds between reads of a watched run while the listener is connected
RECONNECT_S = (0.5, 10.0)  # first and longest wait before the listener connects again
RECENT = 20_000  # runs whose last notified status is kept for watches placed after it came


class Watch:
    """One request's view of one run: ``changed`` returns when the run changed (or the
    fallback poll is due). ``quiet``: statuses whose notification does not wake it (a
    request waiting for its response to settle has nothing to read at ``in_progress``).
    ``journal``: every journal event of the run wakes it too."""

    def __init__(
        self, hub: Wakeups, quiet: frozenset[str] = frozenset(), *, journal: bool = False
    ) -> None:
        self.hub = hub
        self.quiet = quiet
        self.journal = journal
        self.flag = asyncio.Event()
        # Every notification of the run since its maker's commit wakes this watch: no read
        # is needed before the first wait (the module's docstring).
        self.primed = False

    def clear(self) -> None:
        """Call before reading the run: a change from here on wakes the next wait."""
        self.flag.clear()

    async def changed(self, poll_s: float, *, listened_s: float | None = None) -> None:
        """Wait for a change of the run, at most ``poll_s``; ``listened_s`` instead while
        the listener is connected, for a caller that needs no read but on a change."""
        timeout = listened_s if listened_s is not None and self.hub.listening else poll_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flag.wait(), timeout)


class Wakeups:
    """The process's one ``LISTEN`` connection (``outbox_runs``, ``outbox_approvals``,
    ``outbox_journal``) and the watchers per run and per tenant."""

    def __init__(self, database_url: str, *, listen: bool = True) -> None:
        self.database_url = database_url
        self.listen = listen
        self.listening = False  # connected and listening now
        self.epoch = 0  # how many times the listener connected
        self.watchers: dict[uuid.UUID, set[Watch]] = {}
        self.tenants: dict[str, set[Watch]] = {}  # watchers of a tenant's approvals
        self.recent: OrderedDict[uuid.UUID, str | None] = OrderedDict()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.listen:
            self.task = asyncio.create_task(self._listen(), name="outbox-serve-listener")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def mark(self) -> int | None:
        """Before a request makes a run: what ``watch`` is given ``since`` once it did."""
        return self.epoch if self.listening else None

    @contextlib.contextmanager
    def watch(
        self,
        run_id: uuid.UUID,
        quiet: frozenset[str] = frozenset(),
        *,
        since: int | None = None,
        journal: bool = False,
    ) -> Iterator[Watch]:
        """Watch ``run_id`` for the block; a change to a status in ``quiet`` wakes nobody.
        ``since``: ``mark()`` taken before the run was made; when the listener has been
        connected since, the watch is ``primed`` and the run's notifications that came
        before it wake it at once. ``journal``: each journal event of the run wakes it."""
        watch = Watch(self, quiet, journal=journal)
        if since is not None and self.listening and self.epoch == since:
            watch.primed = True
            if run_id in self.recent:
                status = self.recent[run_id]
                if status is None or status not in quiet:
                    watch.flag.set()
        self.watchers.setdefault(run_id, set()).add(watch)
        try:
            yield watch
        finally:
            watchers = self.watchers.get(run_id, set())
            watchers.discard(watch)
            if not watchers:
                self.watchers.pop(run_id, None)

    @contextlib.contextmanager
    def watch_tenant(self, tenant_id: str) -> Iterator[Watch]:
        """Watch the approvals of ``tenant_id`` (``*``: of every tenant) for the block."""
        watch = Watch(self)
        self.tenants.setdefault(tenant_id, set()).add(watch)
        try:
            yield watch
        finally:
            watchers = self.tenants.get(tenant_id, set())
            watchers.discard(watch)
            if not watchers:
                self.tenants.pop(tenant_id, None)

    def wake_tenant(self, tenant_id: str | None) -> None:
        """Wake the watchers of ``tenant_id``'s approvals and of every tenant's (None: every
        watcher: the tenant is not known)."""
        if tenant_id is None:
            targets = [w for ws in self.tenants.values() for w in ws]
        else:
            targets = [*self.tenants.get(tenant_id, ()), *self.tenants.get("*", ())]
        for watch in targets:
            watch.flag.set()

    def wake_journal(self, run_id: uuid.UUID | None) -> None:
        """Wake the watchers of ``run_id`` that follow its journal (every such watcher for
        None: the run is not known)."""
        if run_id is None:
            targets = [w for ws in self.watchers.values() for w in ws]
        else:
            targets = list(self.watchers.get(run_id, ()))
        for watch in targets:
            if watch.journal:
                watch.flag.set()

    def wake(self, run_id: uuid.UUID | None, status: str | None = None) -> None:
        """Wake the watchers of ``run_id`` (every watcher for None) that care for its new
        ``status`` (None: any watcher, the status is not known)."""
        if run_id is None:
            targets = [w for ws in self.watchers.values() for w in ws]
            self.epoch += 1  # a run unknown: no watch placed after this one is primed
        else:
            targets = list(self.watchers.get(run_id, ()))
            self.recent[run_id] = status
            self.recent.move_to_end(run_id)
            if len(self.recent) > RECENT:
                self.recent.popitem(last=False)
        for watch in targets:
            if status is None or status not in watch.quiet:
                watch.flag.set()

    async def _listen(self) -> None:
        pause = RECONNECT_S[0]
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.database_url, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_S
                )
                async with conn:
                    await conn.execute(f"LISTEN {APPROVALS}")
                    await conn.execute(f"LISTEN {JOURNAL}")
                    await conn.execute(f"LISTEN {CHANNEL}")  # last: what pg_stat_activity shows
                    self.epoch += 1
                    self.recent.clear()  # a watch primed by an earlier epoch is refused anyway
                    self.listening, pause = True, RECONNECT_S[0]
                    self.wake(None)  # what changed while nobody listened was not told
                    self.wake_tenant(None)
                    async for note in conn.notifies():
                        if note.channel == APPROVALS:
                            self.wake_tenant(_tenant_of(note.payload))
                        elif note.channel == JOURNAL:
                            self.wake_journal(_run_of(note.payload)[0])
                        else:
                            self.wake(*_run_of(note.payload))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any failure of the connection: poll, then reconnect
                log(logger, logging.WARNING, "serve.listener_lost", error=str(err), polling=True)
            finally:
                self.listening = False
            await asyncio.sleep(pause)
            pause = min(RECONNECT_S[1], pause * 2)


def _run_of(payload: str) -> tuple[uuid.UUID | None, str | None]:
    """The run a notification names and its new status; (None, None), wake everyone, when
    it cannot be read."""
    try:
        told = json.loads(payload)
        status = told.get("status")
        return uuid.UUID(told["run_id"]), status if isinstance(status, str) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None


def _tenant_of(payload: str) -> str | None:
    """The tenant an approval's notification names; None, wake every tenant's watchers,
    when it cannot be read."""
    try:
        tenant = json.loads(payload)["tenant_id"]
        return tenant if isinstance(tenant, str) else None
    except (ValueError, KeyError, TypeError):
        return None
