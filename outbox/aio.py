"""The writer API for asyncio backends: a psycopg ``AsyncConnection`` or a SQLAlchemy
``AsyncSession`` / ``AsyncConnection`` (``postgresql+psycopg://``).

Same guarantee as ``outbox.writer``: every function runs its statements on the connection
you pass and never commits, rolls back your work or opens a transaction of its own.
Nothing is visible to anyone else before *your* commit, and a rollback leaves no trace. A
refusal (``ActiveRunExists``, ``BudgetExceeded``, ``InvalidInput``...) is rolled back to a
savepoint taken just before the call, so your transaction stays usable.

Design choice: no second implementation. Each function runs the very statements the sync
writer runs, built once in ``outbox.calls``, and those call the versioned SQL functions of
``sql/runs.sql`` and ``sql/results.sql``; only the waiting differs. It covers what a backend calls;
recording model turns and tool results stays the relay's (sync) business.

    async with await psycopg.AsyncConnection.connect(url) as conn:
        thread = await aio.create_thread(conn, "tenant-a")
        run = await aio.start_run(conn, StartRun(tenant_id="tenant-a", thread_id=thread.id,
                                                 model="gpt-5", message="Refund order 42"))
        await conn.commit()
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox import calls, tenancy
from outbox.calls import Row, RunRef, ThreadRef
from outbox.errors import NeedsTransaction
from outbox.schemas import NewMessage, StartRun

__all__ = [
    "RunRef",
    "ThreadRef",
    "cancel_run",
    "connection",
    "create_thread",
    "get_run",
    "pending_client_calls",
    "start_run",
    "submit_tool_outputs",
]


async def connection(db: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` behind ``db``, checked to be inside a transaction."""
    conn = db
    if not isinstance(conn, psycopg.AsyncConnection):
        if callable(getattr(db, "get_raw_connection", None)):  # SQLAlchemy AsyncConnection
            raw = await db.get_raw_connection()
        elif callable(getattr(db, "connection", None)):  # SQLAlchemy AsyncSession
            raw = await (await db.connection()).get_raw_connection()
        else:
            raise TypeError(f"expected a psycopg AsyncConnection or an AsyncSession, got {db!r}")
        conn = raw.driver_connection
        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(
                "the SQLAlchemy engine must use the psycopg 3 driver "
                "(URL scheme postgresql+psycopg://)"
            )
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise NeedsTransaction("the connection is in autocommit mode outside a transaction")
    return conn


async def run_call(db: Any, call: calls.Call) -> list[Row]:
    """``writer.run_call``, awaited: one call of ``outbox.calls``, never committing."""
    conn = await connection(db)
    if call.savepoint:
        await conn.execute(calls.SAVEPOINT)
    try:
        if call.scope is not None:
            await conn.execute(tenancy.Q.scope, {"tenant_id": call.scope})
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(call.query, call.params)
            rows = await cur.fetchall()
    except psycopg.Error as err:
        if call.savepoint and not conn.closed:
            await conn.execute(calls.ROLLBACK)
        raise calls.refusal(err) or err from err
    if call.savepoint:
        await conn.execute(calls.RELEASE)
    return rows


async def create_thread(
    db: Any,
    tenant_id: str,
    *,
    title: str | None = None,
    metadata: dict[str, Any] | None = None,
    messages: list[NewMessage] | None = None,
) -> ThreadRef:
    """``writer.create_thread``: a thread, with optional opening messages."""
    (row,) = await run_call(db, calls.create_thread(tenant_id, title, metadata, messages))
    return ThreadRef(row["id"], tenant_id)


async def start_run(db: Any, request: StartRun) -> RunRef:
    """``writer.start_run``: the user message, the run and its first model turn, all or
    nothing; the same idempotency key returns the existing run (``created=False``)."""
    (started,) = await run_call(db, calls.start_run(request))
    (row,) = await run_call(db, calls.get_run(started["run_id"], None))
    return calls.run_ref(row, started["created"])


async def get_run(db: Any, run_id: uuid.UUID, tenant_id: str | None = None) -> Row:
    """``writer.get_run``: the run's row (``NotFound``/``WrongTenant`` when not yours)."""
    rows = await run_call(db, calls.get_run(run_id, tenant_id))
    return calls.found_run(rows[0] if rows else None, run_id, tenant_id)


async def cancel_run(
    db: Any, run_id: uuid.UUID, tenant_id: str | None = None, *, actor: str | None = None
) -> Row:
    """``lifecycle.cancel_run``: no new claims; in-flight results are orphaned."""
    if tenant_id is None:
        rows = await run_call(db, calls.run_tenant(run_id))
        tenant_id = calls.found_run(rows[0] if rows else None, run_id, None)["tenant_id"]
    (row,) = await run_call(db, calls.cancel_run(run_id, tenant_id, actor))
    return row


async def pending_client_calls(db: Any, run_id: uuid.UUID) -> list[Row]:
    """``lifecycle.pending_client_calls``: the client calls a run is waiting for."""
    return await run_call(db, calls.pending_client_calls(run_id))


async def submit_tool_outputs(
    db: Any, tenant_id: str, run_id: uuid.UUID, outputs: list[dict[str, Any]]
) -> str:
    """``lifecycle.submit_tool_outputs``: client outputs, all or nothing; the run's status."""
    (row,) = await run_call(db, calls.submit_tool_outputs(tenant_id, run_id, outputs))
    return str(row["status"])
