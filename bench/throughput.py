"""Relay overhead: drain N in-process tool calls with 1, 2, 4 relay processes, beside a raw
``SKIP LOCKED`` loop (the ceiling of the pattern) and PgQueuer draining N no-op jobs.

The relay is started as users start it (``python -m outbox.commands relay --processes
P``); the clock starts when the first outbox row is leased, so interpreter start-up is not
counted, and stops when no ``tool_call`` or ``deliver_batch`` row is left in the outbox: results,
fencing, journal, batch bookkeeping and every batch delivery (tool messages in the history,
the submission, the next model turn enqueued) all written. The raw loop and PgQueuer are
timed from the moment their workers are connected and ready to the moment the queue is
empty.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import db as bdb
from outbox.sql import Queries

REPO = Path(__file__).resolve().parent.parent
RAW = Queries(Path(__file__).parent / "queries" / "raw.sql", "bench_raw")
RAW_BATCH = 100  # rows per claim, as in the issue
PGQ_BATCH = 100  # PgQueuer batch size, as in the issue
PGQ_DRAIN_POLL = datetime.timedelta(milliseconds=100)  # see _pgqueuer
POLL_S = 0.01  # how often the drain is checked, seconds
DRAIN_TIMEOUT_S = 1800.0  # give up on a measurement after this long


@dataclass(frozen=True)
class Drain:
    """``n`` items drained in ``seconds``."""

    n: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else 0.0


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the relay ---------------------------------------------------------------------------


def start_relay(
    url: str, processes: int, concurrency: int | None, log_path: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """``outbox relay`` for tool calls and deliveries, at its own ``--concurrency`` when
    ``concurrency`` is None."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "outbox.commands", "relay", "--processes", str(processes)]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    command += ["--kind", "tool_call"]
    command += ["--kind", "deliver_batch", "--log-level", "WARNING", *extra]
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


def stop_relay(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def drain_relay(url: str, n: int, processes: int, concurrency: int | None, log_path: Path) -> Drain:
    """Start a relay on a seeded database and time it from first lease to drained."""
    with psycopg.connect(url, autocommit=True) as conn:
        relay = start_relay(url, processes, concurrency, log_path)
        try:
            deadline = time.monotonic() + 120
            while not conn.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox.outbox WHERE status = 'leased')"
            ).fetchone()[0]:  # type: ignore[index]
                if relay.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the relay did not start; see {log_path}")
                time.sleep(POLL_S)  # waiting for the relay's first claim
            started = time.perf_counter()
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while conn.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox.outbox "
                "WHERE kind IN ('tool_call', 'deliver_batch'))"
            ).fetchone()[0]:  # type: ignore[index]
                if relay.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the relay stopped before draining; see {log_path}")
                time.sleep(POLL_S * 5)  # a drain check every 50 ms
            elapsed = time.perf_counter() - started
        finally:
            stop_relay(relay)
    return Drain(n, elapsed)


def check_relay_outcome(url: str, n: int) -> dict[str, int]:
    """What the drained database holds: every call succeeded, one result each."""
    with psycopg.connect(url, autocommit=True) as conn:
        states: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM outbox.tool_calls GROUP BY 1").fetchall()
        )
        results = conn.execute("SELECT count(*) FROM outbox.tool_results").fetchone()
    if states.get("succeeded") != n or results is None or results[0] != n:
        raise RuntimeError(f"the relay did not complete every call: {states}, {results}")
    return states


# -- the raw psycopg loop ----------------------------------------------------------------


def _raw_worker(url: str, ready: Any, go: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        ready.set()
        go.wait()
        while True:
            ids = [row[0] for row in conn.execute(RAW.claim, {"limit": RAW_BATCH}).fetchall()]
            if not ids:
                return
            conn.execute(RAW.complete, {"ids": ids})


def run_timed(workers: list[Any], readies: list[Any], go: Any) -> float:
    """Start worker processes, wait until each is ready, then time them from go to done."""
    for worker in workers:
        worker.start()
    for ready in readies:
        ready.wait(60)  # seconds a worker may take to start
    started = time.perf_counter()
    go.set()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def drain_raw(url: str, n: int, processes: int) -> Drain:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW.create_jobs)
        conn.execute(RAW.seed_jobs, {"n": n})
        conn.execute("VACUUM ANALYZE bench_raw.jobs")
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    readies = [context.Event() for _ in range(processes)]
    workers = [
        context.Process(target=_raw_worker, args=(url, readies[i], go), name=f"raw-{i}")
        for i in range(processes)
    ]
    elapsed = run_timed(workers, readies, go)
    left = bdb.scalar(url, "SELECT count(*) FROM bench_raw.jobs WHERE status <> 'done'")
    if left:
        raise RuntimeError(f"the raw loop left {left} jobs")
    return Drain(n, elapsed)


# -- PgQueuer ----------------------------------------------------------------------------


async def _pgqueuer(url: str, n: int) -> float:
    # Imported by name: the bench extra is optional, and mypy must pass without it.
    asyncpg = importlib.import_module("asyncpg")
    pgqueuer = importlib.import_module("pgqueuer")
    AsyncpgDriver, Queries, QueueManager = (
        pgqueuer.AsyncpgDriver,
        pgqueuer.Queries,
        pgqueuer.QueueManager,
    )
    QueueExecutionMode = importlib.import_module("pgqueuer.types").QueueExecutionMode

    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        chunk = 10_000
        for first in range(0, n, chunk):
            size = min(chunk, n - first)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    finally:
        await conn.close()
    conn = await asyncpg.connect(url)
    try:
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        async def noop(job: Any) -> None:
            return None

        manager.entrypoint("noop")(noop)
        started = time.perf_counter()
        # In drain mode PgQueuer stops when the queue is empty and no task is in flight; if
        # a task is still finishing at that check, it waits up to dequeue_timeout (30 s by
        # default) for a notification that never comes. That idle tail, not work, made its
        # figure swing from 3k to 11k jobs/s; a short timeout bounds it (while work is
        # queued, PgQueuer re-polls at its minimum interval whatever this is).
        await manager.run(
            batch_size=PGQ_BATCH,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=PGQ_DRAIN_POLL,
        )
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    return elapsed


def drain_pgqueuer(url: str, n: int) -> Drain:
    return Drain(n, asyncio.run(_pgqueuer(url, n)))
