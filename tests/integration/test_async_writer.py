"""The async writer (``outbox.aio``) through a psycopg AsyncConnection and a SQLAlchemy
AsyncSession, against a real PostgreSQL: the same guarantees as the sync writer.

Every test runs once per flavour. Whatever the async writer wrote is checked from a second,
independent (sync) connection: invisible before the caller's commit, gone after its
rollback, there after its commit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outbox import aio, db
from outbox.errors import ActiveRunExists, InvalidInput, NeedsTransaction, WrongTenant
from outbox.schemas import StartRun
from tests.helpers import TENANT, add_tool, new_run, turn

FLAVOURS = ["psycopg", "sqlalchemy"]


@asynccontextmanager
async def backend(flavour: str, url: str) -> AsyncIterator[Any]:
    """What an asyncio backend holds: an AsyncConnection or an AsyncSession."""
    if flavour == "psycopg":
        async with await psycopg.AsyncConnection.connect(url) as conn:
            yield conn
        return
    engine = create_async_engine(db.sqlalchemy_url(url))
    try:
        async with AsyncSession(engine) as session:
            yield session
    finally:
        await engine.dispose()


async def commit(handle: Any) -> None:
    await handle.commit()


async def rollback(handle: Any) -> None:
    await handle.rollback()


def run(flavour: str, url: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with backend(flavour, url) as handle:
            return await body(handle)

    return asyncio.run(main())


def count(url: str, table: str, where: str = "true") -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM outbox.{table} WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def request(thread_id: uuid.UUID, key: str | None = None) -> StartRun:
    return StartRun(
        tenant_id=TENANT, thread_id=thread_id, model="gpt-5", message="hi", idempotency_key=key
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_nothing_is_visible_before_the_commit_and_nothing_is_left_after_a_rollback(db_url, flavour):
    async def body(handle: Any) -> uuid.UUID:
        thread = await aio.create_thread(handle, TENANT, title="t")
        started = await aio.start_run(handle, request(thread.id))
        assert started.created and started.status == "queued"
        # the writer committed nothing: another connection sees no row
        assert count(db_url, "runs") == 0 and count(db_url, "threads") == 0
        await rollback(handle)
        assert count(db_url, "runs") == 0 and count(db_url, "outbox") == 0
        thread = await aio.create_thread(handle, TENANT)
        started = await aio.start_run(handle, request(thread.id))
        assert count(db_url, "runs") == 0
        await commit(handle)
        return started.id

    run_id = run(flavour, db_url, body)
    assert count(db_url, "runs", f"id = '{run_id}'") == 1
    assert count(db_url, "outbox", f"run_id = '{run_id}' AND kind = 'model_turn'") == 1
    assert count(db_url, "journal", "event = 'run.created'") == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_refusal_leaves_the_callers_transaction_usable(db_url, flavour):
    async def body(handle: Any) -> None:
        thread = await aio.create_thread(handle, TENANT)
        first = await aio.start_run(handle, request(thread.id, key="k1"))
        again = await aio.start_run(handle, request(thread.id, key="k1"))
        assert again.id == first.id and not again.created
        with pytest.raises(ActiveRunExists) as err:
            await aio.start_run(handle, request(thread.id, key="k2"))
        assert err.value.run_id == first.id
        with pytest.raises(WrongTenant):
            await aio.get_run(handle, first.id, "someone-else")
        # still in the same transaction, with everything written before the refusals
        assert (await aio.get_run(handle, first.id, TENANT))["status"] == "queued"
        await commit(handle)

    run(flavour, db_url, body)
    assert count(db_url, "runs") == 1 and count(db_url, "threads") == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_client_outputs_and_cancel(db_url, conn, flavour):
    add_tool(conn, "approve", executor="client", endpoint=None, json_schema={"type": "object"})
    waiting = new_run(conn, tools=["approve"])
    record = writer_turn(conn, waiting, "call_1")
    assert record == "requires_action"
    other = new_run(conn)
    conn.commit()

    async def body(handle: Any) -> None:
        calls = await aio.pending_client_calls(handle, waiting.id)
        assert [c["tool_call_id"] for c in calls] == ["call_1"]
        with pytest.raises(InvalidInput):
            await aio.submit_tool_outputs(handle, TENANT, waiting.id, [{"tool_call_id": "nope"}])
        status = await aio.submit_tool_outputs(
            handle, TENANT, waiting.id, [{"tool_call_id": "call_1", "output": {"ok": True}}]
        )
        assert status == "in_progress"
        ended = await aio.cancel_run(handle, other.id, TENANT, actor="async-test")
        assert ended["status"] == "cancelled"
        await commit(handle)

    run(flavour, db_url, body)
    assert count(db_url, "tool_results", "source = 'client'") == 1
    assert count(db_url, "outbox", f"run_id = '{waiting.id}' AND kind = 'deliver_batch'") == 1
    assert count(db_url, "journal", "event = 'run.cancelled' AND actor = 'async-test'") == 1


def writer_turn(conn: psycopg.Connection[Any], run_ref: Any, call_id: str) -> str:
    from outbox import writer

    record = writer.record_model_turn(conn, turn(run_ref, 1, (call_id, "approve", {})))
    return record.run_status


def test_an_autocommit_connection_outside_a_transaction_is_refused(db_url):
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            with pytest.raises(NeedsTransaction):
                await aio.create_thread(conn, TENANT)
            async with conn.transaction():  # inside an explicit transaction it works
                await aio.create_thread(conn, TENANT)
                assert count(db_url, "threads") == 0

    asyncio.run(main())
    assert count(db_url, "threads") == 1
