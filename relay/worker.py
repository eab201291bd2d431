"""One relay worker process: claim due outbox rows, perform their effects, record outcomes.

Concurrency model: threads, not asyncio. The writer API that backends call is synchronous
psycopg, and the relay records outcomes through that very code, so a result written by the
relay and one submitted by a backend take the same path. Effects are blocking I/O (HTTP, a
model call), so K execution slots are K threads of a pool; the work that matters for
correctness happens in Postgres. Each thread that talks to the database owns its connection.

Threads in a worker:

- the *claim loop* (the caller's thread): claims at most as many rows as there are free
  slots, in one statement, and hands them to the slots. When it gets fewer rows than it
  asked for, it sleeps until a NOTIFY, a freed slot, the next due row or the poll interval;
  an idle relay does not busy-loop.
- K *slots*: perform effects and queue ``Outcome``s.
- *in-process chunks*: tool calls of ``python`` tools that honour keys run 32 per thread hop
  (``relay.inprocess``) and take no slot: ``--inprocess-slots`` of them may be in flight.
- the *completers* (``--completers``, 2): write queued outcomes, many per transaction, each
  on its own connection. A run's outcomes always go to the same completer, so completers of
  one process never queue on each other's run and batch locks. Every write that completes
  a row is fenced on (lease holder, attempt); a refused write is journaled, never applied.
- *maintenance*: heartbeats the leases of rows in flight, rescues expired leases of any
  worker, re-enqueues deliveries of complete batches that never happened.
- the *listener*: ``LISTEN outbox_ready`` (off with ``listen=False`` for transaction-mode
  poolers); polling is always the fallback.

Shutdown: the first SIGTERM/SIGINT stops claiming, lets effects in flight finish within the
grace period, releases the rest and flushes outcomes; a second signal exits at once (leases
then expire and any worker rescues the rows).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import psycopg
from psycopg.types.json import Jsonb

from outbox import db, lifecycle, writer
from outbox.schemas import ToolResultIn
from outbox.sql import Queries
from relay import failpoints, inprocess
from relay.config import RelayConfig
from relay.executors import ToolExecutor
from relay.logs import log
from relay.metrics import Metrics
from relay.model import ModelExecutor
from relay.outcomes import Claimed, Outcome, retry, runs_in_chunks

logger = logging.getLogger("relay.worker")
RECONNECT_MAX_S = 5.0  # longest wait between reconnection attempts
DEPTH_INTERVAL_S = 2.0  # how often the queue-depth gauges are refreshed (with metrics on)
BUSY_ROW_WAIT_S = 0.02  # idle wait when the only due rows are being claimed by others
DELIVERY_POLL_S = 0.1  # while the slots are full, how often deliveries alone are claimed
DELIVERY = "deliver_batch"  # the kind with no effect outside the database
DELIVERIES = [DELIVERY]
INPROCESS_CHUNK = 32  # in-process tool calls run one after the other per thread hop
WEDGED_EXIT_CODE = 75  # EX_TEMPFAIL: every in-process tool thread is kept; restart me
WEDGED_FOR_S = 60.0  # how long every in-process tool thread must stay kept before a restart
PREFETCH = 1  # claimed I/O rows that may wait behind each busy slot
PREPARE_THRESHOLD = 0  # prepared at once: the first execution runs the generic plan too
# Settings of a link that prepares (see Link).
GENERIC_PLANS = ("SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off")
Executor = Callable[[Claimed], Outcome]


class Link:
    """One thread's database connection, reopened after the server or network fails.

    A link that prepares (the claim loop, the completers, the slots) runs each statement on
    one *generic* plan (``plan_cache_mode = force_generic_plan``), planned once per
    connection: planning the completion statements cost about 20 us a call, as much as
    running some of them. A generic plan keeps the choices it made with the statistics of
    its moment, and results, messages and the journal start empty and grow by thousands a
    second (a repeat check planned as a scan of an "empty" tool_results went quadratic:
    313 us a call). So these links also turn sequential scans off: wherever an index can
    find the rows, it does (a table with no usable index is still scanned). Every relay
    statement finds its rows by an index, and ``tests/integration/test_hot_path.py``
    checks the very plans the relay runs. The maintenance side (rescue, depth gauges) runs
    a few statements a second: it keeps custom plans.
    """

    def __init__(
        self, url: str, name: str, *, autocommit: bool = False, prepare: bool = True
    ) -> None:
        self.url = url
        self.name = name
        self.autocommit = autocommit
        self.prepare = prepare
        self.conn: psycopg.Connection[Any] | None = None
        self.failures = 0

    def get(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(
                self.url,
                autocommit=self.autocommit,
                connect_timeout=db.CONNECT_TIMEOUT_S,
                application_name=f"outbox-relay-{self.name}",
                prepare_threshold=PREPARE_THRESHOLD if self.prepare else None,
            )
            if self.prepare:
                for setting in GENERIC_PLANS:
                    self.conn.execute(setting, prepare=False)
                if not self.autocommit:
                    self.conn.commit()
        return self.conn

    def failed(self, err: Exception) -> float:
        """Drop the connection after ``err``; returns how long to wait before trying again."""
        self.failures += 1
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None
        log(logger, logging.WARNING, "db.connection_lost", link=self.name, error=str(err))
        return float(min(RECONNECT_MAX_S, 0.05 * 2**self.failures))

    def ok(self) -> None:
        self.failures = 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Worker:
    """A relay worker; ``run()`` blocks until stopped (``stop()`` or SIGTERM/SIGINT)."""

    def __init__(self, cfg: RelayConfig, executors: dict[str, Executor] | None = None) -> None:
        self.cfg = cfg
        self.q = Queries(Path(__file__).parent / "queries" / "relay.sql", cfg.schema)
        self.metrics = Metrics()
        self.stopping = threading.Event()  # no more claims
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.executing = 0  # claimed rows whose effect is not done yet
        self.io_executing = 0  # of which on I/O slots (the rest are in-process tool calls)
        self.claims_inprocess = False  # did the last claim hold in-process tool calls?
        self.inflight: dict[int, Claimed] = {}  # claimed, outcome not yet written
        # (id, attempt) of claimed rows whose effect has not started: those left when the
        # worker stops never ran, and shutdown releases them with their attempt given back.
        self.waiting: set[tuple[int, int]] = set()
        # One queue per completer; a run's outcomes always go to the same one, so completers
        # of one process never wait for each other's run and batch locks.
        self.outcomes = [queue.Queue[Outcome]() for _ in range(cfg.completers)]
        self.done = threading.Event()  # completer and side threads may finish
        self.http = httpx2.Client(
            limits=httpx2.Limits(
                max_connections=cfg.concurrency * 2, max_keepalive_connections=cfg.concurrency
            )
        )
        self.dispatch_link = threading.local()
        tools = ToolExecutor(self.http, self._mark_dispatched)
        model = ModelExecutor(self._thread_connection)
        self.executors: dict[str, Executor] = {
            "tool_call": tools.run,
            DELIVERY: lambda row: Outcome(row, "deliver"),
            "model_turn": model.run,
        }
        self.executors.update(executors or {})
        self.kinds = [k for k in cfg.kinds if k in self.executors]
        self.deliveries_claimed_at = 0.0  # monotonic; see _delivery_room
        self.notified = threading.Event()  # a NOTIFY since deliveries were last claimed
        self.slots = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="slot")
        self.chunk_waiters = ThreadPoolExecutor(
            max(1, cfg.inprocess_slots // INPROCESS_CHUNK), thread_name_prefix="inprocess"
        )
        self.signals = 0
        self.exit_code = 0
        inprocess.configure(cfg.inprocess_threads)

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():  # a process of its own
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if self.cfg.metrics_port is not None:
            self.metrics.serve(self.cfg.metrics_port)
        sides = [
            threading.Thread(target=self._complete_loop, args=(q,), name=f"completer-{i}")
            for i, q in enumerate(self.outcomes)
        ]
        sides.append(threading.Thread(target=self._maintenance_loop, name="maintenance"))
        if self.cfg.listen:
            sides.append(threading.Thread(target=self._listen_loop, name="listener"))
        for thread in sides:
            thread.start()
        log(logger, logging.INFO, "relay.started", worker=self.cfg.worker_id, kinds=self.kinds)
        try:
            self._claim_loop()
        finally:
            self._shutdown(sides)
        return self.exit_code

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        if self.signals > 1:
            os._exit(128 + signum)
        log(logger, logging.INFO, "relay.stopping", worker=self.cfg.worker_id, signal=signum)
        self.stop()

    def _shutdown(self, sides: list[threading.Thread]) -> None:
        deadline = time.monotonic() + self.cfg.grace_s
        with self.idle:
            while self.executing and time.monotonic() < deadline:
                self.idle.wait(timeout=max(0.0, deadline - time.monotonic()))
        # Let the completer write what finished before deciding what to release, within the
        # grace period: if the database is gone, the leases expire and others rescue the rows.
        flush_deadline = time.monotonic() + self.cfg.grace_s
        for outcomes in self.outcomes:
            with outcomes.all_tasks_done:
                while outcomes.unfinished_tasks and time.monotonic() < flush_deadline:
                    outcomes.all_tasks_done.wait(timeout=flush_deadline - time.monotonic())
        with self.lock:
            unfinished = list(self.inflight)
            unstarted = [i for i, row in self.inflight.items() if (i, row.attempt) in self.waiting]
        if unfinished:
            self._release(unfinished, unstarted)
        self.done.set()
        for thread in sides:
            thread.join()
        self.slots.shutdown(wait=False, cancel_futures=True)
        self.chunk_waiters.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        log(
            logger,
            logging.INFO,
            "relay.stopped",
            worker=self.cfg.worker_id,
            released=len(unfinished),
        )

    # -- claiming -------------------------------------------------------------------------

    def _free(self) -> int:
        """How many rows the next claim may take.

        I/O rows: each slot may have one more claimed row waiting behind it (``PREFETCH``),
        so a slot that frees up starts its next row at once. While rows are executing, the
        claim waits until half a round of slots has room (``_gulp``): claiming one row per
        freed slot made claims and completions of one or two rows, whose fixed cost per
        statement dominated (PostgreSQL spent 440 us a call over HTTP, 100 us in bulk). A
        row waiting for a slot is leased and heartbeated like one executing; once stopping,
        it is not started, and shutdown releases it with its attempt given back.

        In-process tool calls take no I/O slot (they run in chunks, see
        ``relay.inprocess``), so while the last claim held some, the claim also takes as
        many as the in-process capacity has room for. Rows claimed and not yet written
        never exceed both capacities together.
        """
        io_capacity = self._io_capacity()
        with self.lock:
            io_room = max(0, io_capacity - self.io_executing)
            if self.io_executing and io_room < self._gulp():
                io_room = 0
            free = io_room
            if self.claims_inprocess:
                inprocess = self.executing - self.io_executing
                free += max(0, self.cfg.inprocess_slots - inprocess)
            # Backpressure from the completer: a row counts until its outcome is written,
            # so fast tools cannot let the claims run ahead of the writes.
            unwritten = len(self.inflight)
        return min(free, self._capacity() - unwritten)

    def _io_capacity(self) -> int:
        """I/O rows claimed and not yet finished: one per slot and one waiting behind it."""
        return self.cfg.concurrency * (1 + PREFETCH)

    def _capacity(self) -> int:
        """Rows claimed and not yet written, at most: I/O places and in-process slots."""
        return self._io_capacity() + self.cfg.inprocess_slots

    def _gulp(self) -> int:
        """The fewest I/O rows worth a claim while others are executing."""
        return max(1, self.cfg.concurrency // 2)

    def _delivery_room(self) -> int:
        """How many deliveries a claim may take while the slots leave no room: they take no
        slot (the claim loop hands them to their completer), so only the rows claimed and
        not yet written bound them. A complete batch must not wait for other runs' slow
        tool calls, but an empty claim costs as much as a small one: deliveries alone are
        claimed after a NOTIFY (a row was enqueued somewhere: a delivery when a batch
        completes) or after a claim that found as many as it could take, at most every
        ``DELIVERY_POLL_S``, and otherwise once a poll interval."""
        since = time.monotonic() - self.deliveries_claimed_at
        if DELIVERY not in self.kinds or since < DELIVERY_POLL_S:
            return 0
        if not self.notified.is_set() and since < self.cfg.poll_interval_s:
            return 0
        with self.lock:
            return max(0, min(INPROCESS_CHUNK, self._capacity() - len(self.inflight)))

    def _claim_loop(self) -> None:
        link = self.claim_link()
        while not self.stopping.is_set():
            free, kinds = self._free(), self.kinds
            if free <= 0:
                free, kinds = self._delivery_room(), DELIVERIES
            if free <= 0:
                self.wake.wait(
                    DELIVERY_POLL_S if DELIVERY in self.kinds else self.cfg.poll_interval_s
                )
                self.wake.clear()
                continue
            self.wake.clear()
            if kinds is DELIVERIES:
                self.notified.clear()
                self.deliveries_claimed_at = time.monotonic()
            try:
                rows = self._claim(link, free, kinds)
                link.ok()
            except psycopg.Error as err:
                if kinds is DELIVERIES:
                    self.notified.set()  # what woke us is still there
                self.stopping.wait(link.failed(err))
                continue
            if kinds is DELIVERIES and len(rows) == free:
                self.notified.set()  # there may be more
            self._dispatch(rows)
            if len(rows) < free:
                self.wake.wait(DELIVERY_POLL_S if kinds is DELIVERIES else self._idle_wait(link))
        link.close()

    def claim_link(self) -> Link:
        """The claim loop's connection: in autocommit, so a claim (one statement) is one
        round trip, not three (BEGIN and COMMIT each waited for the GIL again, in a process
        whose completers keep it busy)."""
        return Link(self.cfg.database_url, "claim", autocommit=True)

    def _claim(self, link: Link, limit: int, kinds: list[str] | None = None) -> list[Claimed]:
        conn = link.get()
        assert conn.autocommit, "a claim must commit by itself: use Worker.claim_link()"
        with conn.cursor() as cur:
            cur.execute(
                self.q.claim,
                {
                    "limit": limit,
                    "worker": self.cfg.worker_id,
                    "lease_s": self.cfg.lease_s,
                    "kinds": kinds or self.kinds,
                },
            )
            now = time.monotonic()
            rows = [Claimed._make((*r, now)) for r in cur.fetchall()]
        if rows:
            failpoints.hit("claim.after_commit")
        io_rows = sum(1 for row in rows if not runs_in_chunks(row))
        with self.lock:
            for row in rows:
                self.inflight[row.id] = row
            self.executing += len(rows)
            self.io_executing += io_rows
            # Deliveries take no slot either way; the other rows say what the queue holds.
            effects = [row for row in rows if row.kind != DELIVERY]
            if effects:
                self.claims_inprocess = any(runs_in_chunks(row) for row in effects)
        for kind, n in collections.Counter(row.kind for row in rows).items():
            self.metrics.claimed.labels(kind).inc(n)
        for row in rows:
            self.metrics.queue_lag.observe(max(0.0, row.lag_s))
        return rows

    def _idle_wait(self, link: Link) -> float:
        """Seconds to sleep when nothing is due: until the next due row, at most a poll."""
        try:
            row = link.get().execute(self.q.next_due, {"kinds": self.kinds}).fetchone()
        except psycopg.Error:
            return self.cfg.poll_interval_s
        due_in = row[0] if row and row[0] is not None else None
        if due_in is None:
            return self.cfg.poll_interval_s
        # A row already due that our claim did not get is locked by another worker's claim:
        # it will be leased in a moment, so wait briefly instead of spinning on it.
        return max(BUSY_ROW_WAIT_S, min(self.cfg.poll_interval_s, float(due_in)))

    def _dispatch(self, rows: list[Claimed]) -> None:
        with self.lock:
            self.waiting.update((row.id, row.attempt) for row in rows)
        chunked = [row for row in rows if runs_in_chunks(row)]
        for first in range(0, len(chunked), INPROCESS_CHUNK):
            self.chunk_waiters.submit(self._execute_chunk, chunked[first : first + INPROCESS_CHUNK])
        for row in rows:
            if row.kind == DELIVERY:
                # Nothing to perform outside the database: straight to its completer, never
                # queued behind a busy slot (a claimed row may wait there for other runs'
                # slow tool calls). This is the claim loop: it needs no wake-up.
                self._execute(row, wake=False)
            elif not runs_in_chunks(row):
                self.slots.submit(self._execute, row)

    def _execute(self, row: Claimed, wake: bool = True) -> None:
        if not self._start([row]):  # claimed ahead of its slot: shutdown releases it, unrun
            self._finished(1, 1, wake)
            return
        self.metrics.claim_to_start.observe(time.monotonic() - row.claimed_at_monotonic)
        # Queued before it counts as finished: shutdown, once nothing executes, writes the
        # queued outcomes before it releases what is left, so none is refused as stale.
        try:
            try:
                outcome = self.executors[row.kind](row)
            except Exception as err:
                log(logger, logging.ERROR, "executor.crashed", error=repr(err), **row.context())
                outcome = retry(row, f"executor crashed: {type(err).__name__}: {err}")
            self._queue(outcome)
        finally:
            self._finished(1, 1, wake)

    def _execute_chunk(self, rows: list[Claimed]) -> None:
        if not self._start(rows):  # queued behind other chunks: shutdown releases them
            self._finished(len(rows), 0)
            return
        now = time.monotonic()
        for row in rows:
            self.metrics.claim_to_start.observe(now - row.claimed_at_monotonic)
        try:
            try:
                outcomes = inprocess.run_calls(rows)
            except Exception as err:
                log(logger, logging.ERROR, "executor.crashed", error=repr(err), n=len(rows))
                outcomes = [
                    retry(r, f"executor crashed: {type(err).__name__}: {err}") for r in rows
                ]
            for outcome in outcomes:
                self._queue(outcome)  # before finished: see _execute
        finally:
            self._finished(len(rows), 0)

    def _check_wedged(self, wedged_since: float | None) -> float | None:
        """When every in-process tool thread has stayed kept by a call that overran its
        timeout for ``WEDGED_FOR_S``, stop to be restarted; returns since when they are."""
        if not inprocess.wedged():
            return None
        now = time.monotonic()
        if wedged_since is None:
            return now
        if now - wedged_since >= WEDGED_FOR_S and not self.exit_code:
            self._stop_wedged()
        return wedged_since

    def _stop_wedged(self) -> None:
        """Python cannot stop a thread: with every in-process tool thread kept, no
        in-process tool can run here until one returns, which may be never (a slow tool's
        calls return within a minute: ``WEDGED_FOR_S``). Stop like on SIGTERM (outcomes
        written, the rest released) and exit with ``WEDGED_EXIT_CODE`` for the supervisor
        or the process manager to start a fresh process."""
        log(
            logger,
            logging.ERROR,
            "inprocess.wedged",
            worker=self.cfg.worker_id,
            threads=self.cfg.inprocess_threads,
            overrunning=inprocess.overrunning(),
            exit_code=WEDGED_EXIT_CODE,
        )
        self.exit_code = WEDGED_EXIT_CODE
        self.stop()

    def _start(self, rows: list[Claimed]) -> bool:
        """Whether the effects of ``rows`` may start: not once the worker is stopping. Taken
        under the lock shutdown reads ``waiting`` with, so a row is either started or
        released with its attempt given back, never both."""
        with self.lock:
            if self.stopping.is_set():
                return False
            self.waiting.difference_update((row.id, row.attempt) for row in rows)
            return True

    def _queue(self, outcome: Outcome) -> None:
        """Hand an outcome to the completer of its run."""
        self.outcomes[hash(outcome.row.run_id) % len(self.outcomes)].put(outcome)

    def _finished(self, n: int, io: int, wake: bool = True) -> None:
        with self.idle:
            self.executing -= n
            self.io_executing -= io
            self.idle.notify_all()
        if wake:
            self.wake.set()

    def _thread_connection(self) -> psycopg.Connection[Any]:
        """This slot thread's own connection (reopened when it broke)."""
        link: Link | None = getattr(self.dispatch_link, "link", None)
        if link is None:
            link = Link(self.cfg.database_url, "slot")
            self.dispatch_link.link = link
        return link.get()

    def _mark_dispatched(self, row: Claimed) -> bool:
        link: Link | None = getattr(self.dispatch_link, "link", None)
        if link is None:
            link = Link(self.cfg.database_url, "dispatch")
            self.dispatch_link.link = link
        try:
            conn = link.get()
            with conn.transaction():
                marked = conn.execute(
                    self.q.mark_dispatched,
                    {
                        "tool_call_ref": row.tool_call_ref,
                        "id": row.id,
                        "worker": self.cfg.worker_id,
                        "attempt": row.attempt,
                    },
                ).fetchone()
            link.ok()
        except psycopg.Error as err:
            link.failed(err)
            return False
        return marked is not None

    # -- completing -----------------------------------------------------------------------

    def completion_link(self) -> Link:
        """A completer's connection: it prepares its statements, on generic plans (Link)."""
        return Link(self.cfg.database_url, "complete")

    def _complete_loop(self, outcomes: queue.Queue[Outcome]) -> None:
        link = self.completion_link()
        pending: list[Outcome] = []
        while True:
            if not pending:
                try:
                    pending.append(outcomes.get(timeout=0.1))
                except queue.Empty:
                    if self.done.is_set():
                        break
                    continue
            while len(pending) < self.cfg.completion_batch:
                try:
                    pending.append(outcomes.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(link, pending)
                link.ok()
            except psycopg.OperationalError as err:
                if self.done.is_set():  # shutting down and still unreachable: leave to rescue
                    log(logger, logging.WARNING, "complete.abandoned", n=len(pending))
                    for _ in pending:
                        outcomes.task_done()
                    break
                # The database went away: keep the outcomes and write them once it is back
                # (if our leases expired meanwhile, the fence refuses them, as it should).
                time.sleep(link.failed(err))
                continue
            except Exception as err:  # a bad outcome must not stop the others being written
                log(logger, logging.ERROR, "complete.batch_failed", error=repr(err), n=len(pending))
                if isinstance(err, psycopg.Error):
                    link.failed(err)
                for outcome in pending:
                    self._write_alone(link, outcome)
            for _ in pending:
                outcomes.task_done()
            pending = []
        link.close()

    def _write(self, link: Link, outcomes: list[Outcome]) -> None:
        # One lock order for every completer in every process (batch, then row), so two
        # transactions completing calls of the same batches queue up instead of deadlocking.
        outcomes.sort(key=lambda o: (o.row.batch_id or 0, o.row.id))
        conn = link.get()
        with conn.transaction():
            applied = self._apply_all(conn, outcomes)
            failpoints.hit("complete.before_commit")
        failpoints.hit("complete.after_commit")
        self._after_commit(outcomes, applied)

    def _apply_all(self, conn: psycopg.Connection[Any], outcomes: list[Outcome]) -> list[str]:
        """Write sorted outcomes in the completer's transaction; what happened to each.

        First the runs, then the batches of the whole transaction are locked, each in id
        order: the one lock order of every writer path (run before batch), so completers,
        cancels and client submissions queue up instead of deadlocking. Terminal tool
        results and batch deliveries then take set-based paths, a fixed number of
        statements however many there are: their rows are fenced together (lease holder
        and attempt per row); ``store_results`` does what ``writer.record_tool_result``
        does per row, and ``enqueue_deliveries`` enqueues (once, by dedup key) and
        journals each batch this transaction completed; ``writer.deliver_batches``
        delivers every batch at once. Fenced rows and every other action go through
        ``_apply``, which journals a refused write.
        """
        results = [
            i
            for i, o in enumerate(outcomes)
            if o.action == "result"
            and o.row.kind == "tool_call"
            and o.row.tool_call_ref is not None
            and o.row.batch_id is not None
            and (o.status == "ok" or (o.status == "error" and o.error))
        ]
        deliveries = [
            i
            for i, o in enumerate(outcomes)
            if o.action == "deliver" and o.row.batch_id is not None
        ]
        run_ids = sorted({o.row.run_id for o in outcomes if o.row.run_id is not None})
        conn.execute(writer.Q.lock_runs, {"run_ids": run_ids})
        batch_ids = sorted({o.row.batch_id for o in outcomes if o.row.batch_id is not None})
        conn.execute(writer.Q.lock_batches, {"batch_ids": batch_ids})
        applied: list[str | None] = [None] * len(outcomes)
        if results:
            self._store_results(conn, outcomes, results, applied)
        if deliveries:
            self._deliver(conn, outcomes, deliveries, applied)
        return [
            what if what is not None else self._apply(conn, outcome)
            for outcome, what in zip(outcomes, applied, strict=True)
        ]

    def _fence_many(
        self, conn: psycopg.Connection[Any], outcomes: list[Outcome], positions: list[int]
    ) -> list[tuple[Outcome, int]]:
        """Finish the rows at ``positions`` where this worker still holds their lease; the
        outcomes (and positions) that passed. The others are left to ``_apply``."""
        chosen = [outcomes[i] for i in positions]
        kept = {
            r[0]
            for r in conn.execute(
                self.q.finish_many,
                {
                    "ids": [o.row.id for o in chosen],
                    "attempts": [o.row.attempt for o in chosen],
                    "worker": self.cfg.worker_id,
                },
            ).fetchall()
        }
        return [(o, i) for o, i in zip(chosen, positions, strict=True) if o.row.id in kept]

    def _deliver(
        self,
        conn: psycopg.Connection[Any],
        outcomes: list[Outcome],
        positions: list[int],
        applied: list[str | None],
    ) -> None:
        """Deliver the batches of fenced ``deliver`` rows at once (``writer.deliver_batches``)."""
        passed = self._fence_many(conn, outcomes, positions)
        if not passed:
            return
        delivered = writer.deliver_batches(
            conn, [o.row.batch_id for o, _ in passed if o.row.batch_id]
        )
        for outcome, i in passed:
            assert outcome.row.batch_id is not None
            applied[i] = "delivered_" + delivered[outcome.row.batch_id].outcome
        self.metrics.succeeded.labels("deliver_batch").inc(len(passed))

    def _store_results(
        self,
        conn: psycopg.Connection[Any],
        outcomes: list[Outcome],
        positions: list[int],
        applied: list[str | None],
    ) -> None:
        """Store the fenced tool results at ``positions``; leaves ``applied`` None for the
        rows whose lease this worker lost."""
        worker = self.cfg.worker_id
        passed = self._fence_many(conn, outcomes, positions)
        if not passed:
            return
        results = [
            {
                "ref": o.row.tool_call_ref,
                "status": o.status,
                "output": o.output,
                "error": o.error,
                "source": o.source,
                "attempt": o.row.attempt,
                "lag_s": round(max(0.0, o.row.lag_s), 4),
            }
            for o, _ in passed
        ]
        refs = [o.row.tool_call_ref for o, _ in passed]
        rows = conn.execute(
            self.q.store_results, {"results": Jsonb(results), "refs": refs, "worker": worker}
        ).fetchall()
        stored = {ref: what for ref, what, _ in rows}
        completed = {ref: batch for ref, _, batch in rows if batch is not None}
        for outcome, i in passed:
            applied[i] = "result_" + stored.get(outcome.row.tool_call_ref, "duplicate")
        self.metrics.succeeded.labels("tool_call").inc(len(passed))
        self.metrics.failed.inc(sum(1 for o, _ in passed if o.status == "error"))
        if completed:
            attempts = {o.row.tool_call_ref: o.row.attempt for o, _ in passed}
            conn.execute(
                self.q.enqueue_deliveries,
                {
                    "batch_ids": list(completed.values()),
                    "refs": list(completed),
                    "attempts": [attempts[ref] for ref in completed],
                    "worker": worker,
                },
            )

    def _write_alone(self, link: Link, outcome: Outcome) -> None:
        """Write one outcome on its own; if even that fails, leave the row to lease expiry."""
        try:
            self._write(link, [outcome])
        except Exception as err:
            if isinstance(err, psycopg.Error):
                link.failed(err)
            log(logger, logging.ERROR, "complete.failed", error=repr(err), **outcome.row.context())
            with self.lock:
                self.inflight.pop(outcome.row.id, None)

    def _after_commit(self, outcomes: list[Outcome], applied: list[str]) -> None:
        with self.lock:
            for outcome in outcomes:
                self.inflight.pop(outcome.row.id, None)
        self.wake.set()  # written rows free claim capacity (see _free)
        info = logger.isEnabledFor(logging.INFO)  # asked once: thousands of outcomes a second
        for outcome, what in zip(outcomes, applied, strict=True):
            row = outcome.row
            level = (
                logging.WARNING if what in ("fenced", "quarantined", "unknown") else logging.INFO
            )
            if level == logging.INFO and not info:
                continue
            log(
                logger,
                level,
                f"{row.kind}.{what}",
                worker=self.cfg.worker_id,
                error=outcome.error,
                duration_s=round(outcome.duration_s, 4),
                **row.context(),
            )

    def _fence(
        self, conn: psycopg.Connection[Any], query: Any, outcome: Outcome, **extra: Any
    ) -> bool:
        row = outcome.row
        params = {"id": row.id, "worker": self.cfg.worker_id, "attempt": row.attempt, **extra}
        if conn.execute(query, params).fetchone() is not None:
            return True
        self.metrics.fenced.inc()
        writer.journal(
            conn,
            "write.fenced",
            row.tenant_id,
            **self._ids(row),
            detail={"action": outcome.action, "status": outcome.status, "error": outcome.error},
        )
        if outcome.action == "result" and row.tool_call_ref is not None:
            conn.execute(
                writer.Q.insert_orphan,
                {
                    "tenant_id": row.tenant_id,
                    "run_id": row.run_id,
                    "batch_id": row.batch_id,
                    "tool_call_ref": row.tool_call_ref,
                    "tool_call_id": row.tool_call_id,
                    "status": outcome.status,
                    "output": Jsonb(outcome.output),
                    "error": outcome.error,
                    "reason": "fenced",
                    "source": outcome.source,
                    "attempt": row.attempt,
                },
            )
        return False

    def _ids(self, row: Claimed) -> dict[str, Any]:
        return {
            "thread_id": row.thread_id,
            "run_id": row.run_id,
            "batch_id": row.batch_id,
            "tool_call_ref": row.tool_call_ref,
            "tool_call_id": row.tool_call_id,
            "outbox_id": row.id,
            "correlation_id": row.correlation_id,
            "attempt": row.attempt,
            "worker": self.cfg.worker_id,
        }

    def _apply(self, conn: psycopg.Connection[Any], outcome: Outcome) -> str:
        """Write one outcome inside the completer's transaction; returns what happened."""
        row = outcome.row
        if outcome.action == "lost":
            return "lost"
        if outcome.action in ("turn", "fail_run", "skip"):
            return self._apply_model(conn, outcome)
        if outcome.action in ("result", "deliver"):
            if not self._fence(conn, self.q.finish, outcome):
                return "fenced"
            self.metrics.succeeded.labels(row.kind).inc()
            if outcome.action == "deliver":
                assert row.batch_id is not None
                return "delivered_" + writer.deliver_batch(conn, row.batch_id).outcome
            assert row.tool_call_ref is not None and outcome.status is not None
            if outcome.status == "error":
                self.metrics.failed.inc()
            stored = writer.record_tool_result(
                conn,
                ToolResultIn(
                    tenant_id=row.tenant_id,
                    tool_call_ref=row.tool_call_ref,
                    status=outcome.status,
                    output=outcome.output,
                    error=outcome.error,
                    source=outcome.source,
                    attempt=row.attempt,
                    worker=self.cfg.worker_id,
                ),
            )
            return f"result_{stored.outcome}"
        if outcome.action == "retry" and row.attempt < row.max_attempts:
            delay = self._backoff(row.attempt)
            if not self._fence(
                conn, self.q.retry_later, outcome, error=outcome.error, delay_s=delay
            ):
                return "fenced"
            self._call_status(conn, row, "pending", outcome.error, outcome.unsent)
            self.metrics.retried.inc()
            writer.journal(
                conn,
                f"{row.kind}.retry_scheduled",
                row.tenant_id,
                **self._ids(row),
                detail={"error": outcome.error, "delay_s": round(delay, 3)},
            )
            return "retry_scheduled"
        reason = "outcome_unknown" if outcome.action == "unknown" else "max_attempts"
        if not self._fence(conn, self.q.quarantine, outcome, error=outcome.error):
            return "fenced"
        status = "outcome_unknown" if reason == "outcome_unknown" else "quarantined"
        self._call_status(conn, row, status, outcome.error, outcome.unsent)
        self.metrics.quarantined.labels(reason).inc()
        writer.journal(
            conn,
            f"{row.kind}.{status}",
            row.tenant_id,
            **self._ids(row),
            detail={"error": outcome.error, "reason": reason},
        )
        return "quarantined" if reason == "max_attempts" else "unknown"

    def _apply_model(self, conn: psycopg.Connection[Any], outcome: Outcome) -> str:
        """Record a model turn's response, or end its run, or just finish the row."""
        if not self._fence(conn, self.q.finish, outcome):
            return "fenced"
        row = outcome.row
        self.metrics.succeeded.labels(row.kind).inc()
        if outcome.action == "turn":
            record = writer.record_model_turn(conn, outcome.output)
            return f"recorded_{record.run_status}" if record.created else "already_recorded"
        if outcome.action == "skip":
            return "skipped"
        run = writer.lock_run(conn, row.run_id, None)
        if run["status"] in writer.ENDED:
            return "skipped"
        writer.end_run(conn, run, "failed", "model_error", outcome.error)
        return "run_failed"

    def _call_status(
        self,
        conn: psycopg.Connection[Any],
        row: Claimed,
        status: str,
        error: str | None,
        unsent: bool = False,
    ) -> None:
        """Record a call's state after an attempt (``unsent``: take its dispatch mark back)."""
        if row.tool_call_ref is not None:
            conn.execute(
                self.q.call_status,
                {
                    "tool_call_ref": row.tool_call_ref,
                    "status": status,
                    "attempt": row.attempt,
                    "error": error,
                    "unsent": unsent,
                },
            )

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half the nominal delay, plus up to as much again."""
        nominal = float(min(self.cfg.retry_cap_s, self.cfg.retry_base_s * 2 ** (attempt - 1)))
        return nominal / 2 + random.uniform(0, nominal / 2)

    def _release(self, ids: list[int], unstarted: list[int]) -> None:
        """Give back rows at shutdown; those in ``unstarted`` never ran and give back their
        attempt too (``release`` in relay.sql says why that is safe)."""
        link = Link(self.cfg.database_url, "release", prepare=False)
        try:
            conn = link.get()
            with conn.transaction():
                released = conn.execute(
                    self.q.release,
                    {"ids": ids, "unstarted": unstarted, "worker": self.cfg.worker_id},
                ).fetchall()
            log(logger, logging.INFO, "relay.released", worker=self.cfg.worker_id, n=len(released))
        except psycopg.Error as err:
            log(logger, logging.WARNING, "relay.release_failed", error=str(err))
        finally:
            link.close()

    # -- side threads ---------------------------------------------------------------------

    def _maintenance_loop(self) -> None:
        link = Link(self.cfg.database_url, "maintenance", prepare=False)
        interval = min(self.cfg.lease_s / 3, self.cfg.rescue_interval_s)
        last_rescue = last_depth = 0.0
        wedged_since: float | None = None
        while not self.done.wait(interval):
            wedged_since = self._check_wedged(wedged_since)
            try:
                self._heartbeat(link)
                if time.monotonic() - last_rescue >= self.cfg.rescue_interval_s:
                    self._rescue(link)
                    last_rescue = time.monotonic()
                if self.cfg.metrics_port is not None and (
                    time.monotonic() - last_depth >= DEPTH_INTERVAL_S
                ):
                    self._measure_depth(link)
                    last_depth = time.monotonic()
                link.ok()
            except psycopg.Error as err:
                self.done.wait(link.failed(err))
            except Exception as err:  # keep leases alive and rescues going whatever happens
                log(logger, logging.ERROR, "maintenance.failed", error=repr(err))
        link.close()

    def _measure_depth(self, link: Link) -> None:
        """Queue depth per status and kind, and the age of the oldest due row (gauges)."""
        conn = link.get()
        with conn.transaction():
            rows = conn.execute(self.q.queue_depth).fetchall()
        self.metrics.depth.clear()
        for status, kind, n, _lag in rows:
            self.metrics.depth.labels(status, kind).set(n)
        self.metrics.oldest_ready.set(max((float(r[3]) for r in rows), default=0.0))

    def _heartbeat(self, link: Link) -> None:
        with self.lock:
            ids = list(self.inflight)
        if not ids:
            return
        conn = link.get()
        with conn.transaction():
            kept = conn.execute(
                self.q.heartbeat,
                {"ids": ids, "worker": self.cfg.worker_id, "lease_s": self.cfg.lease_s},
            ).fetchall()
        if len(kept) < len(ids):
            log(
                logger,
                logging.DEBUG,
                "lease.not_extended",
                worker=self.cfg.worker_id,
                n=len(ids) - len(kept),
            )

    def _rescue(self, link: Link) -> None:
        conn = link.get()
        with conn.transaction():
            rescued = conn.execute(
                self.q.rescue_expired, {"limit": 1000, "worker": self.cfg.worker_id}
            ).fetchall()
            stalled = conn.execute(
                self.q.rescue_stalled_batches,
                {"grace_s": self.cfg.stalled_batch_grace_s, "worker": self.cfg.worker_id},
            ).fetchall()
            expired = lifecycle.expire_due_runs(conn)
        for run in expired:
            log(
                logger,
                logging.WARNING,
                "run.expired",
                worker=self.cfg.worker_id,
                tenant_id=run["tenant_id"],
                thread_id=run["thread_id"],
                run_id=run["id"],
                correlation_id=run["correlation_id"],
            )
        if rescued:
            self.metrics.rescued.inc(len(rescued))
            self.wake.set()
            log(logger, logging.WARNING, "lease.rescued", worker=self.cfg.worker_id, n=len(rescued))
        if stalled:
            self.wake.set()
            log(
                logger,
                logging.WARNING,
                "batch.delivery_rescued",
                worker=self.cfg.worker_id,
                batches=[r[0] for r in stalled],
            )

    def _listen_loop(self) -> None:
        link = Link(self.cfg.database_url, "listen", autocommit=True, prepare=False)
        while not self.done.is_set():
            try:
                conn = link.get()
                conn.execute("LISTEN outbox_ready")
                link.ok()
                self.notified.set()  # anything committed while we were not listening
                self.wake.set()
                while not self.done.is_set():
                    for _ in conn.notifies(timeout=0.5):
                        self.notified.set()
                        self.wake.set()
            except psycopg.Error as err:
                self.done.wait(link.failed(err))
        link.close()


def freeze_startup_heap() -> None:
    """Put what start-up imported out of the garbage collector's sight, in a process that
    is only a relay worker (an application embedding ``Worker`` keeps its own collector).

    Those objects (about 140,000, the openai SDK's models among them) live as long as the
    process, and a full collection walked them all with every thread stopped (about
    76 ms); young collections triggered by a claim's rows cost more too (decoding a claim
    took 4.6 us a row with the collector off, 9-13 us with it on).
    """
    gc.collect()
    gc.freeze()


def run_worker(cfg: RelayConfig) -> int:
    """Entry point of a worker process."""
    freeze_startup_heap()
    return leave_process(Worker(cfg).run())


def leave_process(code: int) -> int:
    """``code``, or an immediate exit with it while a tool thread is kept by a call that
    overran (a wedged worker's are all kept): the interpreter would wait at exit for that
    thread, maybe forever. The worker has written and released everything by now."""
    if inprocess.overrunning():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
