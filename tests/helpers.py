"""Small builders shared by the tests: register tools, open threads and runs."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from outbox import registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

TENANT = "acme"

# One autocommit connection per test database for the helpers that read it again and again
# (a check polled until a deadline): a new connection per look costs the server a backend
# each time. The ``db_url`` fixture closes it before it drops the database.
_KEPT: dict[str, psycopg.Connection[Any]] = {}


def kept(db_url: str) -> psycopg.Connection[Any]:
    """The kept autocommit connection to ``db_url`` (a new one if it was cut)."""
    conn = _KEPT.get(db_url)
    if conn is None or conn.closed or conn.broken:
        conn = _KEPT[db_url] = psycopg.connect(db_url, autocommit=True)
    return conn


def look(db_url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """The rows of ``query`` read on the kept connection; once more on a new one when the
    kept one was cut since (a test that restarts the server or kills backends)."""
    conn = kept(db_url)
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.OperationalError:
        if not conn.broken:
            raise
    return kept(db_url).execute(query, params).fetchall()


def forget(db_url: str) -> None:
    """Close the kept connection to ``db_url``, if any."""
    conn = _KEPT.pop(db_url, None)
    if conn is not None:
        conn.close()


def add_tool(
    conn: psycopg.Connection[Any], name: str = "lookup_order", **kw: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "executor": "http",
        "endpoint": f"http://127.0.0.1:9/tools/{name}",
        "json_schema": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    }
    spec.update(kw)
    return registry.register(conn, registry.ToolSpec(**spec))


def new_run(
    conn: psycopg.Connection[Any],
    *,
    tenant: str = TENANT,
    tools: list[str] | None = None,
    key: str | None = None,
    thread_id: uuid.UUID | None = None,
    **kw: Any,
) -> writer.RunRef:
    if thread_id is None:
        thread_id = writer.create_thread(conn, tenant).id
    return writer.start_run(
        conn,
        StartRun(
            tenant_id=tenant,
            thread_id=thread_id,
            model="scripted",
            message="hello",
            tools=tools or [],
            idempotency_key=key,
            **kw,
        ),
    )


def turn(run: writer.RunRef, step: int, *calls: tuple[str, str, Any], text: str | None = None):
    return ModelTurnIn(
        tenant_id=run.tenant_id,
        run_id=run.id,
        step_no=step,
        content=text,
        tool_calls=[ToolCallIn(tool_call_id=cid, name=n, arguments=a) for cid, n, a in calls],
        input_tokens=10,
        output_tokens=5,
    )
