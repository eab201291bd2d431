"""``outbox demo``: the newest end-to-end path that really works, on a real database.

Today: provision the database, migrate it, write a thread, a run and a model turn with two
parallel tool calls through the writer API in one transaction, and print the stored
history and the journal. (The incident replay with the relay and fake services replaces
this when the relay and agent-loop pieces land.)
"""

from __future__ import annotations

import json

import click

from outbox import db, history, migrate, registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

TENANT = "demo"


def run() -> int:
    url = db.database_url()
    click.echo(f"database: {db.redact(url)}")
    migrate.upgrade(url)
    with db.connect(url) as conn:
        for name in ("create_ticket", "send_email"):
            if not any(t["name"] == name for t in registry.list_tools(conn)):
                registry.register(
                    conn,
                    registry.ToolSpec(name=name, endpoint=f"http://127.0.0.1:9/tools/{name}"),
                )
        thread = writer.create_thread(conn, TENANT, title="duplicate ticket incident")
        run_ref = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted",
                message="My order 42 arrived broken. Open a ticket and e-mail me.",
                tools=["create_ticket", "send_email"],
                idempotency_key=f"turn-{thread.id}",
            ),
        )
        record = writer.record_model_turn(
            conn,
            ModelTurnIn(
                tenant_id=TENANT,
                run_id=run_ref.id,
                step_no=1,
                tool_calls=[
                    ToolCallIn(
                        tool_call_id="call_1", name="create_ticket", arguments='{"order": 42}'
                    ),
                    ToolCallIn(tool_call_id="call_2", name="send_email", arguments='{"to": "me"}'),
                ],
                input_tokens=120,
                output_tokens=30,
            ),
        )
        conn.commit()
        click.echo(f"run {run_ref.id}: {record.run_status}, batch {record.batch_id}")
        messages, _ = history.replay(conn, thread.id, TENANT)
        click.echo("history (chat format, unanswered calls closed on replay):")
        click.echo(json.dumps(messages, indent=2))
        click.echo("journal:")
        s = db.quote_ident(db.schema_name())
        events = conn.execute(
            f"SELECT at, event, detail FROM {s}.journal WHERE run_id = %s OR thread_id = %s "
            "ORDER BY id",
            [run_ref.id, thread.id],
        ).fetchall()
        for at, event, detail in events:
            click.echo(f"  {at:%H:%M:%S.%f}  {event:22} {json.dumps(detail)}")
        outbox_rows = conn.execute(
            f"SELECT kind, dedup_key, status FROM {s}.outbox WHERE run_id = %s ORDER BY id",
            [run_ref.id],
        ).fetchall()
        click.echo("outbox rows waiting for a relay:")
        for kind, key, status in outbox_rows:
            click.echo(f"  {kind:12} {key:40} {status}")
    return 0
