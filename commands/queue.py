"""The work queue: ``outbox queue stats``, and the operator's hands on queued work,
``requeue``, ``quarantine``, ``release`` and ``reconcile`` (top-level commands, as operators
type them).

They name a tool call (``12``, ``call:12``) or an outbox row (``outbox:7``) and print what
changed one way (``echo_changes``), so a dry run reads like the change it would make.
"""

from __future__ import annotations

from typing import Any

import click

from outbox import ops
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    inline_or_file,
    json_option,
)


def echo_changes(changes: list[ops.Change], as_json: bool) -> None:
    if as_json:
        echo_json([c.as_dict() for c in changes])
        return
    if not changes:
        click.echo("nothing matched")
    for c in changes:
        verb = c.action if c.applied else f"would {c.action}"
        if not c.applied and c.note and c.note != "dry run":
            click.echo(f"skipped {c.target}: {c.note}")
            continue
        click.echo(f"{verb} {c.target}: {c.from_state} -> {c.to_state}")


@click.group("queue", cls=OutboxGroup)
def queue_group() -> None:
    """Inspect the work queue."""


@queue_group.command("stats")
@click.option(
    "--window",
    "window_min",
    type=int,
    default=15,
    show_default=True,
    help="Minutes of claims to compute claim-to-start latency over.",
)
@json_option
def queue_stats(window_min: int, as_json: bool) -> None:
    """Ready, delayed, held (waiting for approval), in flight and quarantined work per kind
    and tool; lag; claim latency."""
    with connection() as conn:
        stats = ops.queue_stats(conn, window_min)
    if as_json:
        echo_json(stats)
        return
    emit(
        stats["by_kind"],
        False,
        ["kind", "ready", "delayed", "held", "in_flight", "quarantined", "lag_s"],
    )
    if stats["by_tool"]:
        click.echo("")
        columns = ["tool", "ready", "delayed", "held", "in_flight", "quarantined"]
        emit(stats["by_tool"], False, columns)
    claim = stats["claim_to_start"]
    click.echo(f"\noldest ready row waits: {stats['oldest_ready_lag_s']}s")
    click.echo(
        f"claim-to-start over {claim['window_min']} min: p50 {claim['p50_s'] or 0}s, "
        f"p99 {claim['p99_s'] or 0}s ({claim['samples']} claims)"
    )


@queue_group.command("holders")
@click.option(
    "--older-than",
    "older_than",
    default="10s",
    show_default=True,
    help="Only transactions open this long (90s, 5m), besides those others wait on.",
)
@json_option
def queue_holders(older_than: str, as_json: bool) -> None:
    """Sessions whose open transaction holds outbox rows: what holds a run back.

    An application's transaction left open on a run (a slow call before its commit, a
    session leaked idle in transaction) holds that run's outcomes back (the relay logs
    complete.run_held) and makes writers of it wait. Listed: each session whose transaction,
    open longer than --older-than, has locked or written rows of the outbox's tables (a
    transaction that only reads, a pg_dump, holds none back), or that another session waits
    on; with the tables, how many wait on it and its last statement. SELECT
    pg_terminate_backend(PID) ends one: its transaction rolls back.
    """
    with connection() as conn:
        found = ops.transaction_holders(conn, ops.parse_age(older_than).total_seconds())
    if as_json:
        echo_json(found)
        return
    sessions = [{**s, "tables": ", ".join(s["tables"])} for s in found["sessions"]]
    if sessions:
        columns = ["pid", "user_name", "application_name", "state", "open_s", "in_state_s"]
        emit(sessions, False, [*columns, "waiting", "tables", "last_query"])
    else:
        click.echo(f"no transaction has held outbox rows for {older_than} or more")
    if found["hidden"]:
        click.echo(
            f"\n{found['hidden']} session(s) of other roles hold outbox rows now and their "
            "times are hidden from you: a superuser, or a member of pg_read_all_stats, sees "
            "them"
        )


@click.command("requeue")
@click.argument("ident", metavar="[ID]", required=False)
@click.option("--tool", help="Bulk: only calls of this tool.")
@click.option("--status", "state", help="Bulk: quarantined or delayed rows.")
@click.option("--since", help="Bulk: last claimed (or queued) since an age or ISO time.")
@click.option("--dry-run", is_flag=True, help="Say what would change, change nothing.")
@actor_option
@json_option
def requeue_cmd(
    ident: str | None,
    tool: str | None,
    state: str | None,
    since: str | None,
    dry_run: bool,
    actor: str,
    as_json: bool,
) -> None:
    """Put quarantined or delayed work back in the queue, due now.

    ID is a tool call (12 or call:12) or an outbox row (outbox:7); or select many with
    --status (and --tool, --since). Attempts stay counted.
    """
    if (ident is None) == (state is None):
        raise click.UsageError("give an ID, or --status (with --tool/--since) for many")
    if ident is not None and (tool or since):
        raise click.UsageError("--tool and --since select many rows: use them with --status")
    with connection() as conn:
        if ident is not None:
            changes = [ops.requeue(conn, ident, actor=actor, dry_run=dry_run)]
        else:
            assert state is not None
            when = ops.parse_since(since) if since else None
            changes = ops.requeue_matching(
                conn, state=state, tool=tool, since=when, actor=actor, dry_run=dry_run
            )
    echo_changes(changes, as_json)


@click.command("quarantine")
@click.argument("ident", metavar="ID")
@click.option("--reason", required=True, help="Why (recorded on the row and in the journal).")
@actor_option
@json_option
def quarantine_cmd(ident: str, reason: str, actor: str, as_json: bool) -> None:
    """Hold queued work (a tool call or outbox:N) so no worker claims it."""
    with connection() as conn:
        change = ops.quarantine(conn, ident, reason=reason, actor=actor)
    echo_changes([change], as_json)


@click.command("release")
@click.argument("ident", metavar="ID")
@actor_option
@json_option
def release_cmd(ident: str, actor: str, as_json: bool) -> None:
    """Take quarantined work (a tool call or outbox:N) out of quarantine."""
    with connection() as conn:
        change = ops.release(conn, ident, actor=actor)
    echo_changes([change], as_json)


@click.command("reconcile")
@click.argument("ident", metavar="TOOL_CALL")
@click.option(
    "--happened/--not-happened",
    default=None,
    required=True,
    help="Whether the call's side effect took place.",
)
@click.option("--result", "result_text", help="The call's output as JSON (or @file).")
@actor_option
@json_option
def reconcile_cmd(
    ident: str, happened: bool, result_text: str | None, actor: str, as_json: bool
) -> None:
    """Settle an outcome_unknown TOOL_CALL: record its result, or run it again."""
    result: Any = None
    if happened:
        if result_text is None:
            raise click.UsageError("--happened needs --result JSON (the call's output)")
        result = inline_or_file(result_text, "--result")
    elif result_text is not None:
        raise click.UsageError("--result goes with --happened")
    with connection() as conn:
        change = ops.reconcile(conn, ident, happened=happened, result=result, actor=actor)
    echo_changes([change], as_json)
