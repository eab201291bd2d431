"""Statements in the caller's transaction: the helpers every module that touches the tables uses.

The writer, the registry, the operator actions and the faces all read and write rows the
same way: on the caller's connection (a psycopg ``Connection`` or a SQLAlchemy ``Session``,
checked to be inside a transaction), as dicts, never committing. They journal their changes
the same way too. These helpers sit at the bottom of the library, below every module that
uses them and importing none of them, so a module that needs ``fetch_one`` imports no
writer and the import graph stays free of circles (the layers contract in pyproject.toml).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outbox.errors import NeedsTransaction, NotFound, WrongTenant
from outbox.sql import queries

Q = queries("statements.sql")
Row = dict[str, Any]

# A statement that joins another table to an array of ids is never prepared: a prepared
# statement may drift to a generic plan that cannot see how many ids the array holds and
# scans the joined table (measured: 2 ms instead of 0.1 ms to read one batch's outputs).
UNPREPARED = False


def pg(db: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``db``, checked to be inside a transaction."""
    conn = db
    if not isinstance(conn, psycopg.Connection):
        get_connection = getattr(db, "connection", None)
        if get_connection is None:
            raise TypeError(f"expected a psycopg Connection or SQLAlchemy Session, got {db!r}")
        sa_conn = get_connection() if callable(get_connection) else get_connection
        conn = sa_conn.connection.driver_connection
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(
                "the SQLAlchemy engine must use the psycopg 3 driver "
                "(URL scheme postgresql+psycopg://)"
            )
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise NeedsTransaction("the connection is in autocommit mode outside a transaction")
    return conn


def fetch_one(conn: psycopg.Connection[Any], query: Any, params: Row) -> Row | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchone()


def fetch_all(
    conn: psycopg.Connection[Any], query: Any, params: Row, *, prepare: bool | None = None
) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params, prepare=prepare)
        return cur.fetchall()


def journal(conn: psycopg.Connection[Any], event: str, tenant_id: str, **fields: Any) -> None:
    """Append one journal event (in the caller's transaction)."""
    detail = fields.pop("detail", None) or {}
    params: Row = dict.fromkeys(
        (
            "thread_id",
            "run_id",
            "batch_id",
            "tool_call_ref",
            "tool_call_id",
            "outbox_id",
            "correlation_id",
            "attempt",
            "worker",
            "actor",
        )
    )
    params.update(fields, tenant_id=tenant_id, event=event, detail=Jsonb(detail))
    conn.execute(Q.journal, params)


def owned(row: Row | None, what: str, ident: object, tenant_id: str) -> Row:
    """``row``, the ``what`` called ``ident``, as the caller's: ``NotFound`` when there is
    none, ``WrongTenant`` when it belongs to another tenant."""
    if row is None:
        raise NotFound(f"{what} {ident} does not exist", hint=f"check the {what} id")
    if row["tenant_id"] != tenant_id:
        raise WrongTenant(f"{what} {ident} does not belong to tenant {tenant_id!r}")
    return row
