"""Maintenance: the side thread that keeps leases alive and takes back what others lost.

Every ``min(lease / 3, rescue interval)`` it heartbeats, in one statement, the leases of
the rows this worker holds with less than half their term and one round left
(rows a completion holds are skipped, not waited for): the worker keeps when each lease
ends by its own clock, counted from before the statement that set it, so it never thinks
a lease ends later than the database does, and it names only those that may be due
rather than every row it holds. Every
rescue interval it takes back expired leases of any worker (``rescue_expired``: ready
again with no attempt charged, or quarantined once leases of a row were lost
``max_lost_leases`` times), re-enqueues deliveries of complete batches that never happened,
expires runs past their ``requires_action`` deadline and denies approvals nobody decided by
their deadline (``outbox.approvals``). Every retention interval it moves idle conversations
out of the hot tables by policy (``outbox.retention``), chunk by chunk for a bounded time so
the next heartbeat is never late; every relay does it, and ``retain_v1``'s SKIP LOCKED
shares the work among them. Every ten minutes it makes the journal's day partitions ahead
(``journal_partitions_v1``). With metrics on, it refreshes
the queue-depth gauges. A database error waits for the link; any other error is logged and
the loop goes on: leases must be kept alive whatever happens.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from outbox import approvals, failpoints, lifecycle, retention, trace_context
from outbox.logs import log
from outbox.relay.config import RelayConfig
from outbox.relay.links import Link
from outbox.relay.metrics import Metrics
from outbox.sql import Queries

logger = logging.getLogger("relay.maintenance")
DEPTH_INTERVAL_S = 2.0  # how often the queue-depth gauges are refreshed (with metrics on)
RETENTION_ROUND_S = 2.0  # longest retention round, seconds (beyond it: the next round)
JOURNAL_PARTITIONS_S = 600.0  # how often the journal's days ahead are made (retention or not)
# Four sweeps a round, each waiting at most a twenty-fourth of the lease for a lock: a round
# delays the next heartbeat by a sixth of the lease at most, however the locks fall.
SWEEPS_SHARE_OF_LEASE = 1 / 24
# A lease is extended once less than this share of its term and one round are left, not at
# every round: each extension rewrites the row (a new entry in each of its indexes; at
# 50,000 runs in flight with minute-long model turns, the largest write a run made). A round
# is late by a sixth of the lease at most (the sweeps above), so the next one comes with at
# least a third of the term left.
RENEW_BELOW_SHARE_OF_LEASE = 1 / 2
T = TypeVar("T")


class Maintenance:
    """``loop()`` is the thread's body. ``due(seconds)`` lists the ids of rows this worker
    holds whose lease may end within that time; ``extended(ids, sent)`` tells it which a
    heartbeat sent at ``sent`` (monotonic) extended; ``wake`` is set when rows became due;
    ``tick()`` runs first on every round (the worker's own checks); the loop ends when
    ``finished`` is set."""

    def __init__(
        self,
        cfg: RelayConfig,
        q: Queries,
        metrics: Metrics,
        make_link: Callable[..., Link],
        due: Callable[[float], list[int]],
        extended: Callable[[list[int], float], None],
        wake: threading.Event,
        finished: threading.Event,
        tick: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.q = q
        self.metrics = metrics
        self.sweep_lock_wait_ms = max(1, round(cfg.lease_s * SWEEPS_SHARE_OF_LEASE * 1000))
        self.interval = min(cfg.lease_s / 3, cfg.rescue_interval_s)
        self.renew_below_s = min(
            cfg.lease_s, cfg.lease_s * RENEW_BELOW_SHARE_OF_LEASE + self.interval
        )
        self.make_link = make_link
        self.due = due
        self.extended = extended
        self.wake = wake
        self.finished = finished
        self.tick = tick

    def loop(self) -> None:
        link = self.make_link("maintenance", prepare=False)
        # The first round does everything: time.monotonic() counts from the machine's boot,
        # so a start of 0.0 would hold back every task whose interval is longer than the
        # uptime (the journal's days ahead for the first ten minutes after a boot).
        last_rescue = last_depth = last_retention = last_journal = -math.inf
        while not self.finished.wait(self.interval):
            self.tick()
            try:
                self._heartbeat(link)
                if time.monotonic() - last_rescue >= self.cfg.rescue_interval_s:
                    self._rescue(link)
                    last_rescue = time.monotonic()
                if time.monotonic() - last_journal >= JOURNAL_PARTITIONS_S:
                    self._journal_partitions(link)
                    last_journal = time.monotonic()
                if self.cfg.retention_interval_s and (
                    time.monotonic() - last_retention >= self.cfg.retention_interval_s
                ):
                    self._retain(link)
                    last_retention = time.monotonic()
                if self.cfg.metrics_port is not None and (
                    time.monotonic() - last_depth >= DEPTH_INTERVAL_S
                ):
                    self._measure_depth(link)
                    last_depth = time.monotonic()
                link.ok()
            except psycopg.Error as err:
                self.finished.wait(link.failed(err))
            except Exception as err:  # keep leases alive and rescues going whatever happens
                log(logger, logging.ERROR, "maintenance.failed", error=repr(err))
        link.close()

    def _journal_partitions(self, link: Link) -> None:
        """Make the journal's day partitions ahead (``journal_partitions_v1``), whether
        retention runs or not: a day without one fills the default partition instead."""
        made = retention.journal_partitions(link.get())
        if made:
            log(logger, logging.INFO, "journal.partitions_made", worker=self.cfg.worker_id, n=made)

    def _retain(self, link: Link) -> None:
        """One retention round. A chunk refused (a lock not granted within retain_v1's
        lock_timeout, a deadlock) changed nothing and is logged; the next round retries."""
        budget = min(RETENTION_ROUND_S, self.cfg.lease_s / 6)
        try:
            done = retention.run(
                link.get(),
                chunk=self.cfg.retention_chunk,
                actor=self.cfg.worker_id,
                budget_s=budget,
            )
        except psycopg.Error as err:
            if link.outage(err):
                raise
            log(
                logger,
                logging.WARNING,
                "retention.failed",
                worker=self.cfg.worker_id,
                error=str(err).strip(),
            )
            return
        for (tenant_id, mode), counts in sorted(done.per_tenant.items()):
            self.metrics.retained.labels(mode).inc(counts["threads"])
            log(
                logger,
                logging.INFO,
                "retention.retained",
                worker=self.cfg.worker_id,
                tenant_id=tenant_id,
                mode=mode,
                **counts,
            )
        for partition in done.partitions_dropped:
            log(
                logger,
                logging.INFO,
                "retention.archive_dropped",
                worker=self.cfg.worker_id,
                partition=partition,
            )

    def _measure_depth(self, link: Link) -> None:
        """Queue depth per status and kind, and the age of the oldest due row (gauges)."""
        conn = link.get()
        with conn.transaction():
            rows = conn.execute(self.q.queue_depth).fetchall()
        self.metrics.depth.clear()
        for status, kind, n, _lag in rows:
            self.metrics.depth.labels(status, kind).set(n)
        self.metrics.oldest_ready.set(max((float(r[3]) for r in rows), default=0.0))
        with conn.transaction():
            waiting = conn.execute(self.q.waiting_for_people).fetchall()
        self.metrics.approvals_waiting.clear()
        self.metrics.runs_parked.clear()
        oldest = 0.0
        for tenant, pending, oldest_s, parked in waiting:
            self.metrics.approvals_waiting.labels(tenant).set(pending)
            self.metrics.runs_parked.labels(tenant).set(parked)
            oldest = max(oldest, float(oldest_s))
        self.metrics.approvals_oldest.set(oldest)
        if trace_context.names_attempts():  # off, nobody exports: the count would only grow
            with conn.transaction():
                due, lag_s = conn.execute(self.q.traces_lag).fetchone() or (0, None)
            self.metrics.spans_due.set(due)
            self.metrics.spans_lag.set(lag_s or 0.0)

    def _heartbeat(self, link: Link) -> None:
        sent = time.monotonic()
        ids = self.due(self.renew_below_s)
        if not ids:
            return
        conn = link.get()
        with conn.transaction():
            extended = conn.execute(
                self.q.heartbeat,
                {
                    "ids": ids,
                    "worker": self.cfg.worker_id,
                    "lease_s": self.cfg.lease_s,
                    "renew_below_s": self.renew_below_s,
                },
            ).fetchall()
            failpoints.hit("heartbeat.before_commit")
        self.extended([row_id for (row_id,) in extended], sent)

    def _sweep(self, link: Link, name: str, work: Callable[[], list[T]]) -> list[T]:
        """One sweep in a transaction of its own that waits at most ``sweep_lock_wait_s``
        for a lock. A sweep meets rows other transactions hold (an application's left
        open, a paused process's), and waiting for them would hold back the next
        heartbeat of every lease of this worker: it gives up instead, changing nothing
        (``maintenance.sweep_waits``), the others go on, and the next round tries again."""
        conn = link.get()
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {self.sweep_lock_wait_ms}")
                return work()
        except psycopg.errors.LockNotAvailable as err:
            self.metrics.sweeps_deferred.labels(name).inc()
            log(
                logger,
                logging.WARNING,
                "maintenance.sweep_waits",
                worker=self.cfg.worker_id,
                sweep=name,
                error=str(err).strip(),
                hint="another transaction holds rows this sweep needs; it tries again "
                "next round (`outbox queue holders` names the holder)",
            )
            return []

    def _rescue(self, link: Link) -> None:
        conn = link.get()
        rescued = self._sweep(
            link,
            "rescue_expired",
            lambda: conn.execute(
                self.q.rescue_expired,
                {
                    "limit": 1000,
                    "worker": self.cfg.worker_id,
                    "max_lost_leases": self.cfg.max_lost_leases,
                },
            ).fetchall(),
        )
        stalled = self._sweep(
            link,
            "rescue_stalled_batches",
            lambda: conn.execute(
                self.q.rescue_stalled_batches,
                {"grace_s": self.cfg.stalled_batch_grace_s, "worker": self.cfg.worker_id},
            ).fetchall(),
        )
        expired = self._sweep(link, "expire_runs", lambda: lifecycle.expire_due_runs(conn))
        denied = self._sweep(
            link, "expire_approvals", lambda: approvals.expire_due(conn, self.cfg.worker_id)
        )
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
        for approval in denied:
            log(
                logger,
                logging.WARNING,
                "approval.expired",
                worker=self.cfg.worker_id,
                tenant_id=approval["tenant_id"],
                thread_id=approval["thread_id"],
                run_id=approval["run_id"],
                batch_id=approval["batch_id"],
                tool_call_ref=approval["tool_call_ref"],
                tool_call_id=approval["tool_call_id"],
                correlation_id=approval["correlation_id"],
                approval_id=approval["id"],
                reason=approval["reason"],
            )
        if denied:
            self.wake.set()
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
