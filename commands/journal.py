"""The journal: ``outbox journal tail`` reads it (``--follow`` waits for new events), and
``outbox prune`` deletes events past an age.

The journal refuses UPDATE and DELETE; prune goes through the one SQL function past that
trigger, which only the schema owner may run, and is journaled itself. ``tail`` reads on an
autocommit connection, so a follow that runs for hours holds no transaction open (and no
vacuum back).
"""

from __future__ import annotations

import json

import click

from outbox import db, ops
from outbox.commands.common import OutboxGroup, actor_option, connection, echo_json, json_option


@click.group("journal", cls=OutboxGroup)
def journal_group() -> None:
    """Read the append-only journal."""


@journal_group.command("tail")
@click.option("--run", help="Only this run's events (id or prefix).")
@click.option("-n", "--lines", "limit", type=int, default=20, show_default=True)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events (Ctrl-C stops).")
@json_option
def journal_tail(run: str | None, limit: int, follow: bool, as_json: bool) -> None:
    """Print the newest journal events, oldest first (JSON: one object per line)."""
    with db.connect(autocommit=True) as conn:
        try:
            for event in ops.tail(conn, run=run, limit=limit, follow=follow):
                if as_json:
                    click.echo(json.dumps(event, default=str))
                    continue
                where = " ".join(
                    f"{k}={event[k]}"
                    for k in ("run_id", "batch_id", "tool_call_ref", "attempt", "worker", "actor")
                    if event[k] is not None
                )
                detail = json.dumps(event["detail"], default=str) if event["detail"] else ""
                click.echo(
                    f"{event['at']:%Y-%m-%d %H:%M:%S.%f}  {event['event']:28} {where} {detail}"
                )
        except KeyboardInterrupt:
            pass


@click.command("prune")
@click.option("--older-than", "older_than", required=True, help="Age, e.g. 30d.")
@actor_option
@json_option
def prune_cmd(older_than: str, actor: str, as_json: bool) -> None:
    """Delete journal events older than an age (the schema owner only; journaled)."""
    age = ops.parse_age(older_than)
    with connection() as conn:
        removed = ops.prune(conn, age, actor=actor)
    if as_json:
        echo_json({"removed": removed, "older_than": older_than})
    else:
        click.echo(f"pruned {removed} journal events older than {older_than}")
