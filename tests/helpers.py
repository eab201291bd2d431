"""Small builders shared by the tests: register tools, open threads and runs."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from outbox import registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

TENANT = "acme"


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
