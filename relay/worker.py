"""One relay worker process: claim due outbox rows, perform their effects, record outcomes.

Concurrency model: effects are tasks, the database is a few threads with a link each.
Model turns and HTTP tool calls wait seconds on the network, so they run as asyncio tasks
on the I/O engine's event loop (``relay.engine``), as many as ``--concurrency`` allows; none
holds a database connection. The work that matters for correctness happens in Postgres, on
a fixed set of links (``relay.links``) however much is in flight:

- the *claim loop* (the caller's thread, here): claims as many rows as
  ``relay.capacity`` allows, in one statement, and hands them out. When it gets fewer rows
  than it asked for, it sleeps until a NOTIFY, a finished effect, the next due row or the
  poll interval; an idle relay does not busy-loop.
- the *preparer* (``relay.preparer``): what effects need before they start (a model
  turn's history, a dispatch mark), for all waiting tasks at once.
- *in-process chunks*: tool calls of ``python`` tools that honour keys run 32 per thread
  hop (``relay.inprocess``): ``--inprocess-slots`` of them may be in flight.
- the *completers* (``relay.completer``, 4 by default): write queued outcomes, many per
  transaction, each on its own link, fenced on (lease holder, attempt).
- *maintenance* (``relay.maintenance``): heartbeats every lease in flight in one
  statement, rescues expired leases of any worker, re-enqueues lost batch deliveries.
- the *listener* (``relay.listener``): ``LISTEN outbox_ready`` (off with ``listen=False``
  for transaction-mode poolers); polling is always the fallback.

A lost connection is the relay's problem, not the row's: the statement is tried again on a
new connection and no attempt is charged (``failures`` counts only effects that failed).

Shutdown: the first SIGTERM/SIGINT stops claiming, lets effects in flight finish within the
grace period, cancels the rest, flushes outcomes and releases what is left (no attempt
charged); a second signal exits at once (leases then expire and any worker rescues the
rows).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox import failpoints, trace_context
from outbox.logs import log
from outbox.relay import inprocess
from outbox.relay.capacity import Capacity
from outbox.relay.completer import Completer
from outbox.relay.config import (
    RelayConfig,
    affinity_headers,
    open_files_limit,
    raise_open_files_limit,
)
from outbox.relay.engine import Engine
from outbox.relay.links import Link
from outbox.relay.listener import listen
from outbox.relay.maintenance import Maintenance
from outbox.relay.metrics import Metrics
from outbox.relay.outcomes import Claimed, Outcome, retry, runs_in_chunks, stopped
from outbox.relay.preparer import Preparer
from outbox.sql import Queries

logger = logging.getLogger("relay.worker")
BUSY_ROW_WAIT_S = 0.02  # idle wait when the only due rows are being claimed by others
DELIVERY_POLL_S = 0.1  # while the slots are full, how often deliveries alone are claimed
DELIVERY = "deliver_batch"  # the kind with no effect outside the database
DELIVERIES = [DELIVERY]
INPROCESS_CHUNK = 32  # in-process tool calls run one after the other per thread hop
WEDGED_EXIT_CODE = 75  # EX_TEMPFAIL: every in-process tool thread is kept; restart me
WEDGED_FOR_S = 60.0  # how long every in-process tool thread must stay kept before a restart
MARKED_CALL_THREADS = 8  # threads for in-process calls of tools that need a dispatch mark
SATURATION_CHECK_S = 1.0  # while every place is busy, how often the loop asks if rows are due
SATURATION_LOG_S = 60.0  # one line a minute about a relay that every place holds back


class Worker:
    """A relay worker; ``run()`` blocks until stopped (``stop()`` or SIGTERM/SIGINT)."""

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg = cfg
        self.q = Queries(Path(__file__).parent / "queries" / "relay.sql", cfg.schema)
        self.metrics = Metrics()
        self.capacity = Capacity(cfg.concurrency, cfg.inprocess_slots, cfg.tenant_share)
        self.stopping = threading.Event()  # no more claims
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.executing = 0  # claimed rows whose effect is not done yet
        self.io_executing = 0  # of which on the engine (the rest are in-process tool calls)
        self.claims_inprocess = False  # did the last claim hold in-process tool calls?
        self.inflight: dict[int, Claimed] = {}  # claimed, outcome not yet written
        # When each of their leases ends by this process's clock, never later than by the
        # database's: counted from before the statement that set it (``_due``).
        self.lease_ends: dict[int, float] = {}
        self.held: collections.Counter[str] = collections.Counter()  # of inflight, by tenant
        # One queue per completer; a run's outcomes always go to the same one, so completers
        # of one process never wait for each other's run and batch locks.
        self.outcomes = [queue.Queue[Outcome]() for _ in range(cfg.completers)]
        self.done = threading.Event()  # completer and side threads may finish
        self.kinds = list(cfg.kinds)
        self.deliveries_claimed_at = 0.0  # monotonic; see _delivery_room
        self.notified = threading.Event()  # a NOTIFY since deliveries were last claimed
        self.chunk_waiters = ThreadPoolExecutor(
            max(1, cfg.inprocess_slots // INPROCESS_CHUNK), thread_name_prefix="inprocess"
        )
        self.marked_calls = ThreadPoolExecutor(MARKED_CALL_THREADS, thread_name_prefix="marked")
        self.preparer = Preparer(self.link("prepare"), self.q, cfg.worker_id, self.done)
        self.engine = Engine(
            self.preparer,
            self.marked_calls,
            self._effect_done,
            self._start,
            max_model_answer_bytes=cfg.max_model_answer_bytes,
            affinity_headers=affinity_headers(cfg.affinity_headers),
        )
        self.completer = Completer(cfg, self.q, self.metrics, self.link, self._written, self.done)
        self.maintenance = Maintenance(
            cfg,
            self.q,
            self.metrics,
            self.link,
            self._due,
            self._extended,
            self.wake,
            self.done,
            self._tick,
        )
        self.wedged_since: float | None = None  # monotonic; see _tick
        # Saturation (``_watch_saturation``), all monotonic and touched by the claim loop only.
        self.effect_kinds = [kind for kind in self.kinds if kind != DELIVERY]
        self.saturated_since: float | None = None
        self.saturation_checked_at = self.saturation_counted_at = 0.0
        self.saturation_logged_at: float | None = None
        self.saturation_announced = False  # this episode was logged: say when it ends
        self.metrics.concurrency.set(cfg.concurrency)
        self.metrics.in_flight.set_function(lambda: self.io_executing)
        self.signals = 0
        self.exit_code = 0
        inprocess.configure(cfg.inprocess_threads)

    def link(self, name: str, *, autocommit: bool = False, prepare: bool = True) -> Link:
        """A new link of this worker (``relay.links``), reporting outages to the metrics."""
        return Link(
            self.cfg.database_url,
            name,
            autocommit=autocommit,
            prepare=prepare,
            on_outage=self.metrics.outage,
            worker=self.cfg.worker_id,
            idle_in_transaction_s=self.cfg.lease_s,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():  # a process of its own
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if self.cfg.metrics_port is not None:
            self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host)
        sides = [
            threading.Thread(target=self.completer.loop, args=(q,), name=f"completer-{i}")
            for i, q in enumerate(self.outcomes)
        ]
        sides.append(threading.Thread(target=self.maintenance.loop, name="maintenance"))
        if self.cfg.listen:
            listening = (self.link, self.done, self.notified, self.wake)
            sides.append(threading.Thread(target=listen, args=listening, name="listener"))
        for thread in sides:
            thread.start()
        self.preparer.start()
        self.engine.start()
        log(
            logger,
            logging.INFO,
            "relay.started",
            worker=self.cfg.worker_id,
            kinds=self.kinds,
            concurrency=self.cfg.concurrency,
            inprocess_slots=self.cfg.inprocess_slots,
            db_connections=self.cfg.db_connections,
            open_files=open_files_limit(),
        )
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
        # Effects still running after the grace period are cancelled (their rows are
        # released below); a cancelled call of a tool that cannot dedup keeps its dispatch
        # mark, so its next attempt follows the tool's mode, never a blind repeat.
        self.engine.stop()
        # Let the completer write what finished before deciding what to release, within the
        # grace period: if the database is gone, the leases expire and others rescue the rows.
        flush_deadline = time.monotonic() + self.cfg.grace_s
        for outcomes in self.outcomes:
            with outcomes.all_tasks_done:
                while outcomes.unfinished_tasks and time.monotonic() < flush_deadline:
                    outcomes.all_tasks_done.wait(timeout=flush_deadline - time.monotonic())
        with self.lock:
            unfinished = list(self.inflight)
        if unfinished:
            self._release(unfinished)
        self.done.set()
        for thread in sides:
            thread.join()
        self.preparer.join()
        self.chunk_waiters.shutdown(wait=False, cancel_futures=True)
        self.marked_calls.shutdown(wait=False, cancel_futures=True)
        log(
            logger,
            logging.INFO,
            "relay.stopped",
            worker=self.cfg.worker_id,
            released=len(unfinished),
        )

    # -- claiming -------------------------------------------------------------------------

    def _free(self) -> int:
        """How many rows the next claim may take (``relay.capacity`` says why)."""
        with self.lock:
            return self.capacity.room(
                io_executing=self.io_executing,
                inprocess_executing=self.executing - self.io_executing,
                unwritten=len(self.inflight),
                claims_inprocess=self.claims_inprocess,
            )

    def _tenant_capped(self) -> bool:
        """Whether a tenant holds as many rows as this relay lets one tenant hold."""
        with self.lock:
            cap = self.capacity.tenant_cap(self.claims_inprocess)
            return any(n >= cap for n in self.held.values())

    def _delivery_room(self) -> int:
        """How many deliveries a claim may take while the slots leave no room, or a tenant
        is at its cap (``_tenant_capped``): they take no slot (the claim loop hands them to
        their completer), so only the rows claimed and not yet written bound them. A
        complete batch must not wait for other runs' slow tool calls (nor its tenant's:
        with 10,000 runs of one tenant, 3,000 deliveries waited behind its tool calls for
        seconds), but an empty claim costs as much as a small one: deliveries alone are
        claimed after a NOTIFY (a row was enqueued somewhere: a delivery when a batch
        completes) or after a claim that found as many as it could take, at most every
        ``DELIVERY_POLL_S``, and otherwise once a poll interval."""
        since = time.monotonic() - self.deliveries_claimed_at
        if DELIVERY not in self.kinds or since < DELIVERY_POLL_S:
            return 0
        if not self.notified.is_set() and since < self.cfg.poll_interval_s:
            return 0
        with self.lock:  # as many as a completer writes in one transaction
            room = self.capacity.total - len(self.inflight)
            return max(0, min(self.cfg.completion_batch, room))

    def _claim_loop(self) -> None:
        link = self.claim_link()
        empty = 0  # claims in a row that found nothing they could take
        while not self.stopping.is_set():
            places = self._free()
            if places <= 0:
                self._watch_saturation(link)
            free, kinds = places, self.kinds
            if free <= 0 or self._tenant_capped():
                # Deliveries take no place: neither full places nor a tenant at its cap
                # (whose other rows the claim passes over) may hold them back.
                room = self._delivery_room()
                if room > 0 or free <= 0:
                    free, kinds = room, DELIVERIES
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
            if kinds is not DELIVERIES and len(rows) < free:
                self._saturation_over()  # it took every row it could: places were enough
            self._dispatch(rows)
            empty = 0 if rows else empty + 1
            # Deliveries claimed while a tenant is at its cap: other tenants' rows next, at
            # once (the wake that brought one may have been spent on the deliveries).
            if len(rows) < free and not (kinds is DELIVERIES and places > 0):
                self.wake.wait(
                    DELIVERY_POLL_S if kinds is DELIVERIES else self._idle_wait(link, empty)
                )
        link.close()

    def _watch_saturation(self, link: Link) -> None:
        """No row can be claimed: when it is for want of places (``Capacity.io_full``) while
        rows are due, ``--concurrency`` holds this relay back, and it says so, in the
        ``outbox_relay_saturated`` gauge and in a ``relay.saturated`` line at most once per
        ``SATURATION_LOG_S``: a fixed 1,000 places once made 10,000 runs take six times as
        long as they needed, and the relay said nothing. Asked at most once per
        ``SATURATION_CHECK_S`` (one index probe, ``next_due``); over at the first claim
        that finds fewer rows than it could take (``_saturation_over``)."""
        now = time.monotonic()
        if not self.effect_kinds or now - self.saturation_checked_at < SATURATION_CHECK_S:
            return
        self.saturation_checked_at = now
        with self.lock:
            in_flight = self.io_executing
        if not self.capacity.io_full(in_flight):
            return  # full for another reason: outcomes not yet written (the completers)
        try:
            row = link.get().execute(self.q.next_due, {"kinds": self.effect_kinds}).fetchone()
        except psycopg.Error:
            return  # the next claim meets it and waits for the link
        due_in = row[0] if row else None
        if due_in is None or due_in > 0:
            self._saturation_over()
            return
        if self.saturated_since is None:
            self.saturated_since = self.saturation_counted_at = now
            self.saturation_announced = False
            self.metrics.saturated.set(1)
        self.metrics.saturated_seconds.inc(now - self.saturation_counted_at)
        self.saturation_counted_at = now
        if self.saturation_logged_at is not None and (
            now - self.saturation_logged_at < SATURATION_LOG_S
        ):
            return
        self.saturation_logged_at = now
        self.saturation_announced = True
        log(
            logger,
            logging.WARNING,
            "relay.saturated",
            worker=self.cfg.worker_id,
            concurrency=self.cfg.concurrency,
            in_flight=in_flight,
            oldest_due_s=round(-float(due_in), 1),
            saturated_for_s=round(now - self.saturated_since, 1),
            hint="every --concurrency place of this process is busy while rows are due: raise "
            "--concurrency (its default follows the open-files limit and the memory) or run "
            "more relay processes",
        )

    def _saturation_over(self) -> None:
        if self.saturated_since is None:
            return
        now = time.monotonic()
        self.metrics.saturated_seconds.inc(now - self.saturation_counted_at)
        self.metrics.saturated.set(0)
        if self.saturation_announced:
            log(
                logger,
                logging.INFO,
                "relay.saturation_ended",
                worker=self.cfg.worker_id,
                lasted_s=round(now - self.saturated_since, 1),
            )
        self.saturated_since = None

    def claim_link(self) -> Link:
        """The claim loop's connection: in autocommit, so a claim (one statement) is one
        round trip, not three (BEGIN and COMMIT each waited for the GIL again, in a process
        whose completers keep it busy)."""
        return self.link("claim", autocommit=True)

    def _claim(self, link: Link, limit: int, kinds: list[str] | None = None) -> list[Claimed]:
        conn = link.get()
        assert conn.autocommit, "a claim must commit by itself: use Worker.claim_link()"
        with self.lock:
            held = dict(self.held)
            tenant_cap = self.capacity.tenant_cap(self.claims_inprocess)
        if kinds is DELIVERIES:  # they take no place: no tenant's cap binds them
            held, tenant_cap = {}, limit
        sent = time.monotonic()
        with conn.cursor() as cur:
            cur.execute(
                self.q.claim,
                {
                    "limit": limit,
                    "worker": self.cfg.worker_id,
                    "lease_s": self.cfg.lease_s,
                    "kinds": kinds or self.kinds,
                    "tenant_cap": tenant_cap,
                    "held": Jsonb(held),
                },
            )
            now = time.monotonic()
            found = cur.fetchall()
            # An older claim query (bench.claim_cost) may leave the last columns out.
            missing = Claimed._fields[len(found[0]) : -1] if found else ()
            fill = tuple(Claimed._field_defaults[name] for name in missing)
            rows = [Claimed._make(_shared((*r, *fill, now))) for r in found]
        if rows:
            failpoints.hit("claim.after_commit")
        io_rows = sum(1 for row in rows if not runs_in_chunks(row))
        lease_end = sent + self.cfg.lease_s
        with self.lock:
            for row in rows:
                self.inflight[row.id] = row
                self.lease_ends[row.id] = lease_end
                if row.kind != DELIVERY:
                    self.held[row.tenant_id] += 1
            self.executing += len(rows)
            self.io_executing += io_rows
            # Deliveries take no slot either way; the other rows say what the queue holds.
            effects = [row for row in rows if row.kind != DELIVERY]
            if effects:
                self.claims_inprocess = any(runs_in_chunks(row) for row in effects)
        for kind, n in collections.Counter(row.kind for row in rows).items():
            self.metrics.claimed.labels(kind).inc(n)
        if self.cfg.metrics_port is not None:  # relay.metrics: only when served
            for row in rows:
                self.metrics.queue_lag.observe(max(0.0, row.lag_s))
        return rows

    def _idle_wait(self, link: Link, empty: int = 0) -> float:
        """Seconds to sleep when nothing is due: until the next due row, at most a poll.

        Rows due but not claimed are locked by another worker's claim (leased in a moment)
        or held back by a limit of their tool or tenant (``outbox.lanes``: free once a row
        of that lane, maybe another process's, is done). Either way the wait is short, and
        doubles with every claim in a row (``empty``) that found nothing, up to a poll: a
        lane at its limit is not claimed for fifty times a second. A completion here or a
        NOTIFY wakes the loop sooner."""
        try:
            row = link.get().execute(self.q.next_due, {"kinds": self.kinds}).fetchone()
        except psycopg.Error:
            return self.cfg.poll_interval_s
        due_in = row[0] if row and row[0] is not None else None
        if due_in is None:
            return self.cfg.poll_interval_s
        busy = min(self.cfg.poll_interval_s, BUSY_ROW_WAIT_S * 2.0 ** min(empty, 8))
        return max(busy, min(self.cfg.poll_interval_s, float(due_in)))

    def _dispatch(self, rows: list[Claimed]) -> None:
        chunked = [row for row in rows if runs_in_chunks(row)]
        for first in range(0, len(chunked), INPROCESS_CHUNK):
            self.chunk_waiters.submit(self._execute_chunk, chunked[first : first + INPROCESS_CHUNK])
        effects = []
        for row in rows:
            if row.stop is not None:
                # Switched off or not approved: answered without running, like a delivery.
                self._queue(stopped(row))
                self._finished(1, 1, wake=False)
            elif row.kind == DELIVERY:
                # Nothing to perform outside the database: straight to its completer. This
                # is the claim loop: it needs no wake-up.
                self._queue(Outcome(row, "deliver"))
                self._finished(1, 1, wake=False)
            elif not runs_in_chunks(row):
                effects.append(row)
        if effects:
            self.engine.submit(effects)

    def _effect_done(self, row: Claimed, outcome: Outcome | None) -> None:
        """An engine task ended: queue its outcome (None: not run, or cancelled at shutdown;
        the row is released), then count it finished. Queued before it counts as finished:
        shutdown, once nothing executes, writes the queued outcomes before it releases what
        is left, so none is refused as stale."""
        if outcome is not None:
            if self.cfg.metrics_port is not None:  # relay.metrics: only when served
                self._claim_to_start(
                    row, max(0.0, time.monotonic() - outcome.duration_s - row.claimed_at_monotonic)
                )
            self._queue(outcome)
        self._finished(1, 1)

    def _claim_to_start(self, row: Claimed, seconds: float) -> None:
        self.metrics.claim_to_start.labels(self.metrics.tenant(row.tenant_id)).observe(seconds)

    def _execute_chunk(self, rows: list[Claimed]) -> None:
        if self.stopping.is_set():  # queued behind other chunks: shutdown releases them
            self._finished(len(rows), 0)
            return
        if self.cfg.metrics_port is not None:
            now = time.monotonic()
            for row in rows:
                self._claim_to_start(row, now - row.claimed_at_monotonic)
        try:
            try:
                outcomes = inprocess.run_calls(rows)
            except Exception as err:
                log(logger, logging.ERROR, "executor.crashed", error=repr(err), n=len(rows))
                outcomes = [
                    retry(r, f"executor crashed: {type(err).__name__}: {err}") for r in rows
                ]
            ended = time.time()
            for outcome in outcomes:
                if not outcome.started_at:
                    # Timed for its span: as long as it took, ending as the chunk ended (a
                    # call that ran is timed when it was judged: inprocess._judge).
                    outcome = dataclasses.replace(outcome, started_at=ended - outcome.duration_s)
                self._queue(outcome)  # before finished: see _execute
        finally:
            self._finished(len(rows), 0)

    def _due(self, within_s: float) -> list[int]:
        """The rows held whose lease may end within ``within_s`` (by the database's clock:
        ours says they end no later): the only ones the heartbeat reads. In steady state a
        round finds about one held row in six due, and reading every held row cost as
        much as extending the due ones (docs/how-it-works.md)."""
        before = time.monotonic() + within_s
        with self.lock:
            return [row_id for row_id, end in self.lease_ends.items() if end < before]

    def _extended(self, ids: list[int], sent: float) -> None:
        """``ids`` were extended by a heartbeat sent at ``sent`` (monotonic, before its
        transaction began: their new lease ends no sooner than a lease from then)."""
        lease_end = sent + self.cfg.lease_s
        with self.lock:
            for row_id in ids:
                if row_id in self.lease_ends:
                    self.lease_ends[row_id] = lease_end

    def _tick(self) -> None:
        """Maintenance's round: when every in-process tool thread has stayed kept by a call
        that overran its timeout for ``WEDGED_FOR_S``, stop to be restarted."""
        if not inprocess.wedged():
            self.wedged_since = None
            return
        now = time.monotonic()
        if self.wedged_since is None:
            self.wedged_since = now
        elif now - self.wedged_since >= WEDGED_FOR_S and not self.exit_code:
            self._stop_wedged()

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

    def _start(self, row: Claimed) -> bool:
        """Whether an effect may start: not once the worker is stopping (shutdown releases
        the row, no attempt charged)."""
        return not self.stopping.is_set()

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

    def _written(self, outcomes: list[Outcome]) -> None:
        """Outcomes written (or abandoned): their rows free claim capacity."""
        with self.lock:
            for outcome in outcomes:
                row = self.inflight.pop(outcome.row.id, None)
                self.lease_ends.pop(outcome.row.id, None)
                if row is not None and row.kind != DELIVERY:
                    self.held[row.tenant_id] -= 1
                    if not self.held[row.tenant_id]:
                        del self.held[row.tenant_id]
        self.wake.set()

    def _release(self, ids: list[int]) -> None:
        """Give back rows at shutdown, no attempt charged (``release`` in relay.sql)."""
        link = self.link("release", prepare=False)
        try:
            conn = link.get()
            with conn.transaction():
                released = conn.execute(
                    self.q.release, {"ids": ids, "worker": self.cfg.worker_id}
                ).fetchall()
            log(logger, logging.INFO, "relay.released", worker=self.cfg.worker_id, n=len(released))
        except psycopg.Error as err:
            log(logger, logging.WARNING, "relay.release_failed", error=str(err))
        finally:
            link.close()


# Columns of a claimed row that take few values (a kind, a tenant, a tool and its mode,
# executor and endpoint, a model): each row a string of its own otherwise, kept by every
# effect in flight.
SHARED = ("kind", "tenant_id", "tool_name", "idempotency_mode", "executor", "endpoint", "model")
SHARED_COLUMNS = tuple(Claimed._fields.index(name) for name in SHARED)


def _shared(values: tuple[Any, ...]) -> list[Any]:
    """A claimed row's values with the strings of ``SHARED_COLUMNS`` interned: a row of
    thousands in flight shares them with the others (hundreds of bytes a tool call)."""
    row = list(values)
    for i in SHARED_COLUMNS:
        value = row[i]
        if value.__class__ is str:
            row[i] = sys.intern(value)
    return row


# The collector's thresholds in a relay worker process (gc.set_threshold): a young
# collection after 100,000 net allocations instead of 700, so the rarer.
GC_THRESHOLDS = (100_000, 20, 10)


def freeze_startup_heap() -> None:
    """Put what start-up imported out of the garbage collector's sight, and collect less
    often, in a process that is only a relay worker (an application embedding ``Worker``
    keeps its own collector).

    Those objects (tens of thousands: modules, pydantic models, compiled queries) live as
    long as the process, and a full collection walks them all with every thread stopped;
    young collections triggered by a claim's rows cost more too (decoding a claim
    took 4.6 us a row with the collector off, 9-13 us with it on). With thousands of runs
    in flight the default thresholds collected all the time (4,000 runs in flight: 37 full
    collections took 11 of the relay's 38 CPU seconds); nearly everything a relay
    allocates is freed by reference counting, so collecting after 100,000 allocations
    instead of 700 costs no memory (peak RSS the same) and a third of the CPU
    (docs/benchmarks.md, "The garbage collector").
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_worker(cfg: RelayConfig) -> int:
    """Entry point of a worker process."""
    raise_open_files_limit()
    freeze_startup_heap()
    return leave_process(run_traced(Worker(cfg)))


def run_traced(worker: Worker) -> int:
    """``worker.run()`` in a process of its own. It records no span: with OpenTelemetry's
    variables asking for traces it names each attempt's span to its tool or model and
    journals its timing, and the trace exporter (``outbox.trace_export``, which ``outbox relay``
    starts beside it) builds the spans. An unsupported ``OTEL_TRACES_EXPORTER`` stops it
    here, before any work is claimed."""
    trace_context.check_exporters()
    return worker.run()


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
