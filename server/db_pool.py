"""The server's database access: a connection pool, one transaction per request.

``tenant(tenant_id)`` opens a transaction that acts as the role ``outbox_api`` (``SET
LOCAL ROLE``) and is scoped to the tenant (``outbox.tenant_id``): row-level security shows
and accepts that tenant's rows only, whatever a handler asks for. It commits when the block
succeeds and rolls back on any error, so a refused request stores nothing. Keys are looked
up as ``outbox_api`` too (through ``api_key_tenant_v1``), before any tenant is known: the
pool's login needs no more than membership in ``outbox_api``. The library is
synchronous; handlers call these through the server's thread pool (server.thread_pool).

Nothing a client is told can be lost in a crash. A waiting ``responses.create`` commits
without waiting for its WAL flush (``unanswered``): its client is answered from the relay's
later commit, which is durable and flushes the WAL past it. Such a commit is visible to
other transactions before it is durable, so every other transaction ends with
``durable_reads`` before its answer goes out, a refused one too (after its rollback): its
commit then waits for the flush of everything it could have read. Reads that wait for a
response to settle skip it (``durable_reads=False``): what settles a response is the
relay's durable commit. docs/serve.md, "Durability of a waiting create".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from outbox import db, failpoints, keys, tenancy, writer
from outbox.errors import DatabaseUnavailable
from outbox.server import QUERIES
from outbox.sql import Queries

Q = Queries(QUERIES / "api.sql")
Row = dict[str, Any]
# Seconds a call waits for a free connection before a 503 database_unavailable: with one
# handler thread per connection (server.thread_pool) a call waits only while the pool cannot
# open one, the database unreachable.
POOL_TIMEOUT_S = 10.0


DB_CONNECTIONS = 10  # a server process's connections, LISTEN's included, unless told otherwise
# Seconds a request's transaction may wait on the server's own Python (it never waits on
# anything else: bodies are read before, answers written after) before PostgreSQL ends
# the session: a server paused mid-request (SIGSTOP, a frozen VM) holds its rows' locks no
# longer. A busy server's thread waits milliseconds for the GIL; the paused request, once
# woken, finds its connection gone and is answered 503 database_unavailable, nothing of
# it stored, to be sent again with its Idempotency-Key.
IDLE_IN_TRANSACTION_S = 10.0


class Store:
    """A pool of connections to the outbox database."""

    def __init__(
        self,
        database_url: str,
        *,
        max_connections: int = DB_CONNECTIONS,
        idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S,
    ) -> None:
        self.pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=max_connections,
            timeout=POOL_TIMEOUT_S,
            open=False,
            kwargs={"connect_timeout": db.CONNECT_TIMEOUT_S},
        )
        self._checking = threading.Lock()
        self._idle_ms = str(max(1, round(idle_in_transaction_s * 1000)))  # a setting's text

    def open(self) -> None:
        self.pool.open(wait=True)

    def recheck(self) -> None:
        """After a request met the database gone: test the pool's idle connections in the
        background (one check at a time), so that the requests after it do not each take
        a connection the server has already dropped."""
        if self._checking.acquire(blocking=False):
            threading.Thread(target=self._check, name="pool-check", daemon=True).start()

    def _check(self) -> None:
        try:
            self.pool.check()  # broken ones replaced by the pool's own workers
        except psycopg.Error:
            pass  # still down: the next request that meets it asks again
        finally:
            self._checking.release()

    def close(self) -> None:
        self.pool.close()

    def tenant_of(self, key: str) -> str | None:
        """The tenant an API key acts for; None when it is unknown or revoked."""
        with self.pool.connection() as conn:
            conn.execute(Q.act_as_api)
            return keys.tenant_of(conn, key)

    @contextmanager
    def tenant(
        self, tenant_id: str, *, unanswered: bool = False, durable_reads: bool = True
    ) -> Iterator[psycopg.Connection[Any]]:
        """A transaction as ``outbox_api`` scoped to ``tenant_id`` (committed on success):
        role and scope set by one statement, and not set again by the library functions
        the block calls (``tenancy.bound``).

        ``unanswered``: nobody is answered from what the block commits (a waiting
        ``responses.create``), so it commits without waiting for its WAL flush. Otherwise
        the transaction ends with ``durable_reads`` unless told not to (a block that
        writes, and so commits durably, or that answers from a durable commit only), and
        after any error, once rolled back, always: what it read is durable before its
        answer goes out (the module's docstring)."""
        with self.pool.connection() as conn:
            act = Q.act_for_tenant_unanswered if unanswered else Q.act_for_tenant
            conn.execute(act, {"tenant_id": tenant_id, "idle_ms": self._idle_ms})
            with self._request(conn, tenant_id, unanswered, durable_reads):
                yield conn

    def read_settled(self, tenant_id: str, query: Any, params: dict[str, Any]) -> list[Row]:
        """One statement's rows, read as ``tenant`` reads with ``durable_reads=False`` (for
        an answer that rests on a durable commit only: responses once their runs settled,
        all those one commit woke: server.reads), in one round trip: the transaction's
        ``BEGIN``, its scope, the statement and its ``COMMIT`` sent together (psycopg's
        pipeline mode), where ``tenant`` waits for each."""
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            with conn.pipeline():
                conn.execute(Q.act_for_tenant, {"tenant_id": tenant_id, "idle_ms": self._idle_ms})
                cur.execute(query, params)
                conn.commit()
            return cur.fetchall()

    @contextmanager
    def for_key(
        self, key: str, *, unanswered: bool = False, durable_reads: bool = True
    ) -> Iterator[tuple[psycopg.Connection[Any], str]]:
        """``tenant`` for the tenant of the API key ``key``, looked up by the statement
        that scopes the transaction (one round trip and one connection for both, where
        ``tenant_of`` then ``tenant`` take two connections and five more); yields the
        connection and the tenant. ``UnknownKey`` for an unknown or revoked key, before
        the block runs; its writes take no savepoints (``writer.whole``): any error rolls
        the whole transaction back."""
        with self.pool.connection() as conn:
            found = None
            if key.startswith(keys.PREFIX):
                act = Q.act_for_key_unanswered if unanswered else Q.act_for_key
                scope = {"key_hash": keys.digest(key), "idle_ms": self._idle_ms}
                row = conn.execute(act, scope).fetchone()
                found = None if row is None else row[0]
            if found is None:
                conn.rollback()  # read nothing a client could be told of: keys are durable
                raise UnknownKey(key)
            with self._request(conn, str(found), unanswered, durable_reads), writer.whole(conn):
                yield conn, str(found)

    @contextmanager
    def _request(
        self, conn: psycopg.Connection[Any], tenant_id: str, unanswered: bool, durable_reads: bool
    ) -> Iterator[None]:
        """The request's block on ``conn``, scoped to ``tenant_id`` by its caller: ends it
        as ``tenant`` says."""
        try:
            with tenancy.bound(conn, tenant_id):
                yield
            failpoints.hit("serve.before_commit")
            if durable_reads and not unanswered:
                conn.execute(Q.durable_reads)
        except Exception as err:
            try:
                conn.rollback()  # a refused request stores nothing
                conn.execute(Q.durable_reads)  # its refusal may rest on what it read
                conn.commit()
            except psycopg.Error as cut:
                if isinstance(err, psycopg.Error | DatabaseUnavailable):
                    raise err from None  # the database's own failure, answered as ever
                raise DatabaseUnavailable(  # a refusal that could not be made durable
                    f"the database went away before this answer was durable: {cut}",
                    hint="send the request again",
                ) from err
            raise


class UnknownKey(Exception):
    """An API key that is unknown or revoked: the request is refused (401)."""
