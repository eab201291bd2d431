"""Retention and erasure: idle conversations leave the hot tables by policy; a thread's
content is erased on request.

A policy per tenant (``'*'``: every tenant without its own) says how long a conversation
stays after its last activity and whether it is then archived (one JSON document per run
in ``archived_runs``, partitioned by day and dropped a day at a time past the archive's
keep) or deleted. The unit is the thread with everything under it: a conversation being
continued keeps its whole history, and a run's rows never outlive the messages they pair
with. The work is done by SQL functions (``sql/retention.sql``: ``retain_v1``,
``archive_partitions_v1``, ``prune_archive_v1``, ``erase_thread_v1``; ``sql/journal.sql``:
``journal_partitions_v1``) so that a DBA, the CLI and the relay's maintenance run the same code;
this module calls them.

``run`` commits one bounded chunk per transaction and never waits on a lock the relay or
the server holds (``retain_v1`` skips what is locked). Everything else runs in the caller's
transaction and never commits.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from outbox.errors import InvalidInput, NotFound, OutboxError
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal, pg

Q = queries("retention.sql")
Row = dict[str, Any]

DEFAULT_TENANT = "*"  # the policy of every tenant without its own
MODES = ("archive", "delete")
CHUNK = 200  # threads per retention transaction: a few hundred milliseconds of locks at most
ARCHIVE_DAYS_AHEAD = 2  # archive partitions made ahead of need, in days
JOURNAL_DAYS_AHEAD = 2  # journal partitions made ahead of need, in days


@dataclass
class Retained:
    """What one ``run`` retained: threads and runs per (tenant, mode), chunks committed,
    archive partitions made and dropped."""

    chunks: int = 0
    threads: int = 0
    runs: int = 0
    per_tenant: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    partitions_made: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    payloads_swept: int = 0  # bodies stored by reference that nothing referenced any more
    journal_partitions_made: int = 0
    complete: bool = True  # False: it stopped at max_chunks with more due

    def add(self, rows: list[Row]) -> int:
        """Count one chunk's rows; returns the threads it retained."""
        self.chunks += 1
        n = 0
        for row in rows:
            entry = self.per_tenant.setdefault(
                (row["tenant_id"], row["mode"]), {"threads": 0, "runs": 0}
            )
            entry["threads"] += row["threads"]
            entry["runs"] += row["runs"]
            n += row["threads"]
            self.runs += row["runs"]
        self.threads += n
        return n

    def as_json(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "threads": self.threads,
            "runs": self.runs,
            "complete": self.complete,
            "per_tenant": [
                {"tenant_id": tenant, "mode": mode, **counts}
                for (tenant, mode), counts in sorted(self.per_tenant.items())
            ],
            "archive_partitions_made": self.partitions_made,
            "archive_partitions_dropped": self.partitions_dropped,
            "payloads_swept": self.payloads_swept,
            "journal_partitions_made": self.journal_partitions_made,
        }


def policies(db: Any) -> list[Row]:
    """Every policy, the default (``'*'``) first; ages in seconds."""
    return fetch_all(pg(db), Q.policies, {})


def set_policy(
    db: Any,
    tenant_id: str,
    max_age: timedelta,
    *,
    mode: str = "archive",
    archive_keep: timedelta | None = None,
    actor: str,
) -> Row:
    """Create or replace ``tenant_id``'s policy (journaled as ``retention.policy_set``).

    ``archive_keep`` (how long archived days are kept) belongs to the default policy only:
    the archive is partitioned by day across tenants.
    """
    if max_age <= timedelta(0):
        raise InvalidInput("a retention age must be positive", hint="e.g. --age 30d")
    if mode not in MODES:
        raise InvalidInput(f"retention mode {mode!r} is not one of {', '.join(MODES)}")
    if archive_keep is not None:
        if tenant_id != DEFAULT_TENANT:
            raise InvalidInput(
                "--archive-keep applies to the whole archive, so only to the default policy",
                hint="outbox retention set --tenant '*' --age ... --archive-keep 90d",
            )
        if archive_keep <= timedelta(0):
            raise InvalidInput("an archive keep must be positive", hint="e.g. --archive-keep 90d")
    conn = pg(db)
    row = fetch_one(
        conn,
        Q.set_policy,
        {
            "tenant_id": tenant_id,
            "max_age_s": max_age.total_seconds(),
            "mode": mode,
            "archive_keep_s": None if archive_keep is None else archive_keep.total_seconds(),
            "actor": actor,
        },
    )
    assert row is not None
    journal(
        conn,
        "retention.policy_set",
        tenant_id,
        actor=actor,
        detail={
            "max_age_s": row["max_age_s"],
            "mode": row["mode"],
            "archive_keep_s": row["archive_keep_s"],
        },
    )
    return row


def remove_policy(db: Any, tenant_id: str, *, actor: str) -> None:
    """Remove ``tenant_id``'s policy (it falls back to the default's; journaled)."""
    conn = pg(db)
    if fetch_one(conn, Q.remove_policy, {"tenant_id": tenant_id}) is None:
        raise NotFound(
            f"tenant {tenant_id!r} has no retention policy", hint="see `outbox retention show`"
        )
    journal(conn, "retention.policy_removed", tenant_id, actor=actor)


def backlog(db: Any) -> list[Row]:
    """Threads due to leave the hot tables now, per tenant (reads every thread: an
    operator's question, not the relay's)."""
    return fetch_all(pg(db), Q.backlog, {})


def retain_chunk(
    db: Any, *, limit: int = CHUNK, actor: str, after: datetime | None = None
) -> list[Row]:
    """One chunk of ``retain_v1`` in the caller's transaction (which must be a top-level
    one: the journal guard's door is bound to it): per tenant and mode, the threads and
    runs retained, and ``horizon``: pass it as ``after`` to the next chunk of the same round,
    which then does not read again the old threads this one passed over (not idle)."""
    return fetch_all(pg(db), Q.retain, {"limit": limit, "actor": actor, "after": after})


def journal_partitions(conn: psycopg.Connection[Any], days_ahead: int = JOURNAL_DAYS_AHEAD) -> int:
    """Make the journal's day partitions for today and ``days_ahead`` days after it
    (``journal_partitions_v1``), in a transaction of its own; how many were made. Rows of a
    day with no partition land in the journal's default partition: nothing fails, but they
    are then pruned by row instead of a day at a time."""
    with conn.transaction():
        made = fetch_one(conn, Q.journal_partitions, {"days_ahead": days_ahead})
    return int(made["made"]) if made else 0


def run(
    conn: psycopg.Connection[Any],
    *,
    chunk: int = CHUNK,
    actor: str,
    max_chunks: int | None = None,
    budget_s: float | None = None,
) -> Retained:
    """Retain everything due, one committed transaction per chunk, until a chunk takes
    fewer than ``chunk`` threads (or ``max_chunks`` were run, or ``budget_s`` seconds
    passed: ``complete`` is then False); make the archive's and the journal's partitions
    ahead first and drop the archive's days past the keep last.

    ``conn`` must not be inside a transaction: each chunk commits, so what is done stays
    done if a later chunk fails, and no chunk holds its locks longer than itself.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise OutboxError("retention.run commits chunk by chunk: call it outside a transaction")
    done = Retained()
    with conn.transaction():
        made = fetch_one(conn, Q.archive_partitions, {"days_ahead": ARCHIVE_DAYS_AHEAD})
    done.partitions_made = int(made["made"]) if made else 0
    done.journal_partitions_made = journal_partitions(conn)
    started = time.monotonic()
    after: datetime | None = None  # the horizon: each chunk goes on where the last stopped
    while True:
        with conn.transaction():
            rows = retain_chunk(conn, limit=chunk, actor=actor, after=after)
            taken = done.add(rows)
        after = rows[0]["horizon"] if rows else after
        if taken < chunk:
            break
        out_of_chunks = max_chunks is not None and done.chunks >= max_chunks
        if out_of_chunks or (budget_s is not None and time.monotonic() - started >= budget_s):
            done.complete = False
            break
    # Bodies a chunk's own sweep left (none, but a row refused after its trigger stored
    # its body leaves one): swept in their own transaction, after the chunks.
    with conn.transaction():
        swept = fetch_one(conn, Q.sweep_payloads, {})
    done.payloads_swept = int(swept["swept"]) if swept else 0
    with conn.transaction():
        done.partitions_dropped = [
            r["partition"] for r in fetch_all(conn, Q.prune_archive, {"actor": actor})
        ]
    return done


def erase_thread(db: Any, thread_id: uuid.UUID, tenant_id: str | None = None, *, actor: str) -> Row:
    """Erase a thread's content (``erase_thread_v1``): its run in flight is cancelled
    first; messages, arguments, results, orphaned results and response items lose their
    content; metadata, counts and digests stay; journaled as ``thread.erased``. Without
    ``tenant_id`` (an operator), the thread's own tenant. Returns what was removed."""
    conn = pg(db)
    if tenant_id is None:
        found = fetch_one(conn, Q.thread_tenant, {"thread_id": thread_id})
        if found is None:
            raise NotFound(f"thread {thread_id} does not exist", hint="check the thread id")
        tenant_id = str(found["tenant_id"])
    try:
        row = fetch_one(
            conn, Q.erase_thread, {"tenant_id": tenant_id, "thread_id": thread_id, "actor": actor}
        )
    except psycopg.errors.NoDataFound as err:
        raise NotFound(str(err.diag.message_primary), hint=err.diag.message_hint or "") from err
    assert row is not None
    detail: Row = row["detail"]
    return detail
