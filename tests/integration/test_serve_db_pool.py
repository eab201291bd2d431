"""A request's transaction in ``outbox serve`` (``Store.tenant``) acts as ``outbox_api`` for
the key's tenant, set by one statement, and the writer functions it calls do not set the
tenant again (``tenancy.bound``). What that must never do: skip a scope to another
tenant, or outlive the request's transaction on the pooled connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import db, keys, tenancy, writer
from outbox.errors import ActiveRunExists
from outbox.schemas import StartRun
from outbox.server.db_pool import IDLE_IN_TRANSACTION_S, Store, UnknownKey
from outbox.server.errors import APIError
from tests.helpers import thread_lockable
from tests.relay_harness import wait_until


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    made = Store(db_url, max_connections=1)  # one connection: the next request reuses it
    made.open()
    yield made
    made.close()


def acting(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute("SELECT current_user, current_setting('outbox.tenant_id', true)").fetchone()
    assert row is not None
    return tuple(row)


def test_a_request_acts_as_outbox_api_for_its_tenant_and_another_scope_still_applies(store):
    with store.tenant("acme") as conn:
        assert acting(conn) == ("outbox_api", "acme")
        tenancy.scope(conn, "acme")  # the same tenant: nothing to send
        tenancy.scope(conn, "globex")  # another: applied, never skipped
        assert acting(conn) == ("outbox_api", "globex")


def test_the_bound_tenant_ends_with_the_request(store):
    with store.tenant("acme") as conn:
        thread = writer.create_thread(conn, "acme").id
    with store.pool.connection() as conn:  # the same connection, a new transaction
        assert getattr(conn, tenancy.BOUND, None) is None
        assert acting(conn)[1] in (None, "")
        tenancy.scope(conn, "acme")  # sent again: the setting ended with the request
        assert acting(conn)[1] == "acme"
    for tenant, seen in (("globex", 0), ("acme", 1)):
        with store.tenant(tenant) as conn:
            row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", [thread])
            assert row.fetchone() == (seen,)


def commit_waits_for_flush(conn: psycopg.Connection[Any]) -> str:
    return str(conn.execute("SELECT current_setting('synchronous_commit')").fetchone()[0])  # type: ignore[index]


def test_only_an_unanswered_transaction_commits_without_its_flush(store):
    """A waiting create's transaction (``unanswered``) does not wait for its WAL flush;
    the setting ends with it, and every other transaction waits as configured."""
    with store.tenant("acme", unanswered=True) as conn:
        assert commit_waits_for_flush(conn) == "off"
        assert acting(conn) == ("outbox_api", "acme")
        thread = writer.create_thread(conn, "acme").id
    with store.tenant("acme") as conn:  # the same pooled connection
        assert commit_waits_for_flush(conn) == "on"
        row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", [thread])
        assert row.fetchone() == (1,)


@pytest.mark.parametrize("unanswered", [False, True])
def test_a_refused_transaction_stores_nothing_though_its_reads_are_made_durable(store, unanswered):
    """A refusal rolls back before ``durable_reads`` commits its own transaction: what
    the refused block wrote is never committed with it."""
    made = []
    with pytest.raises(APIError), store.tenant("acme", unanswered=unanswered) as conn:
        made.append(writer.create_thread(conn, "acme").id)
        raise APIError(400, "refused")
    with store.tenant("acme") as conn:
        row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", made)
        assert row.fetchone() == (0,)
        assert commit_waits_for_flush(conn) == "on"


def a_key(db_url: str, tenant: str) -> str:
    with psycopg.connect(db_url) as conn:
        made = keys.create_key(conn, tenant, name="test")
        conn.commit()
    return made[1]


@pytest.mark.parametrize("unanswered", [False, True])
def test_a_request_by_key_acts_for_the_keys_tenant_and_no_other(store, db_url, unanswered):
    """``for_key``: the key's lookup and the scope in one statement; the block acts as
    outbox_api for the key's tenant, commits as ``tenant`` would, and an unknown or
    revoked key never runs the block."""
    acme, globex = a_key(db_url, "acme"), a_key(db_url, "globex")
    with store.for_key(globex, unanswered=unanswered) as (conn, tenant):
        assert (tenant, acting(conn)) == ("globex", ("outbox_api", "globex"))
        assert commit_waits_for_flush(conn) == ("off" if unanswered else "on")
        thread = writer.create_thread(conn, tenant).id
    with store.for_key(acme) as (conn, tenant):  # the same pooled connection
        assert (tenant, acting(conn)) == ("acme", ("outbox_api", "acme"))
        assert commit_waits_for_flush(conn) == "on"
        row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", [thread])
        assert row.fetchone() == (0,)  # globex's, and committed: row-level security
    with psycopg.connect(db_url) as conn:
        (listed,) = [k for k in keys.list_keys(conn, "acme")]
        keys.revoke_key(conn, listed["id"], actor="test")
        conn.commit()
    for refused in (acme, "ob-not-a-key", "sk-something", ""):
        with pytest.raises(UnknownKey), store.for_key(refused):
            raise AssertionError("the block ran for a key that acts for nobody")
    with store.pool.connection() as conn:  # nothing of a refused key outlives it
        assert acting(conn)[1] in (None, "")


def test_a_refusal_by_key_rolls_back_everything_without_savepoints(store, db_url):
    """Writes in a ``for_key`` block take no savepoint (``writer.whole``): a refusal, of
    the database or of the request, rolls the whole transaction back, never part of it."""
    key = a_key(db_url, "acme")
    made: list[Any] = []
    with pytest.raises(ActiveRunExists), store.for_key(key) as (conn, tenant):
        assert getattr(conn, writer.WHOLE) is True
        thread = writer.create_thread(conn, tenant).id
        made.append(thread)
        start = StartRun(tenant_id=tenant, thread_id=thread, model="m", message="hi")
        writer.start_run(conn, start)
        writer.start_run(conn, start)  # refused by the database: one active run a thread
    with store.tenant("acme") as conn:
        assert getattr(conn, writer.WHOLE, False) is False  # ended with the request
        row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", made)
        assert row.fetchone() == (0,)


def test_a_settled_read_acts_for_its_tenant_and_ends_its_transaction(store):
    """``read_settled`` (one round trip, pipelined) reads as ``tenant`` does: as
    outbox_api for one tenant, in a transaction that ends with it."""
    with store.tenant("acme") as conn:
        thread = writer.create_thread(conn, "acme").id
    query = "SELECT count(*) AS n, current_user AS acting FROM outbox.threads WHERE id = %(id)s"
    assert store.read_settled("acme", query, {"id": thread}) == [{"n": 1, "acting": "outbox_api"}]
    assert store.read_settled("globex", query, {"id": thread}) == [{"n": 0, "acting": "outbox_api"}]
    with store.pool.connection() as conn:  # the same connection: nothing of it outlives it
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert acting(conn)[0] != "outbox_api" and acting(conn)[1] in (None, "")


def test_a_request_paused_in_its_transaction_holds_its_locks_no_longer_than_the_bound(
    store, db_url
):
    """A server paused mid-request (SIGSTOP, a frozen VM) is, to PostgreSQL, a session idle
    in its transaction: the server ends the session after ``idle_in_transaction_s`` and the
    row the request locked is free again; the paused request, once woken, finds its
    connection gone (a 503 database_unavailable), nothing of it stored. The bound is the
    transaction's own (SET LOCAL): a healthy request's connection keeps none of it."""
    with store.tenant("acme") as conn:
        thread = writer.create_thread(conn, "acme").id
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == (
            f"{IDLE_IN_TRANSACTION_S:g}s",
        )
    with store.pool.connection() as conn:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("0",)
    paused = Store(db_url, max_connections=1, idle_in_transaction_s=0.5)
    paused.open()
    try:
        with pytest.raises(psycopg.Error) as ended, paused.tenant("acme") as conn:
            made = writer.create_thread(conn, "acme").id
            conn.execute("SELECT 1 FROM outbox.threads WHERE id = %s FOR UPDATE", [thread])
            assert not thread_lockable(db_url, thread)
            wait_until(
                lambda: thread_lockable(db_url, thread), what="the paused request's lock to go"
            )
            conn.execute("SELECT 1")  # the request wakes
    finally:
        paused.close()
    assert db.unreachable(ended.value)  # answered 503 database_unavailable, to send again
    with store.tenant("acme") as conn:
        row = conn.execute("SELECT count(*) FROM outbox.threads WHERE id = %s", [made])
        assert row.fetchone() == (0,)
