"""``outbox retention``: how long conversations stay in the hot tables, and running it now.

``show`` lists the policies (and, with ``--due``, how many threads each tenant has due),
``set`` writes one, ``unset`` removes one, ``run`` retains everything due now, chunk by
chunk, as the relay's maintenance does continuously. Ages are written like ``30d``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from outbox import db, ops, retention
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("retention", cls=OutboxGroup)
def retention_group() -> None:
    """Retention: idle conversations leave the hot tables (archived or deleted) by policy."""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@retention_group.command("show")
@click.option(
    "--due", is_flag=True, help="Also count the threads due now, per tenant (reads every thread)."
)
@json_option
def retention_show(due: bool, as_json: bool) -> None:
    """List the retention policies ('*' is every tenant without its own)."""
    with connection() as conn:
        rows = retention.policies(conn)
        backlog = retention.backlog(conn) if due else None
    if as_json:
        out: dict[str, Any] = {"policies": rows}
        if backlog is not None:
            out["due"] = backlog
        echo_json(out)
        return
    if not rows:
        click.echo("no retention policy: every conversation is kept forever")
    else:
        emit(
            [
                {
                    **r,
                    "age": _age(r["max_age_s"]),
                    "archive_keep": _age(r["archive_keep_s"]) if r["tenant_id"] == "*" else "",
                }
                for r in rows
            ],
            False,
            ["tenant_id", "age", "mode", "archive_keep", "updated_by", "updated_at"],
        )
    if backlog is not None:
        click.echo("")
        emit(backlog, False, ["tenant_id", "threads"])


@retention_group.command("set")
@click.option(
    "--tenant",
    default=retention.DEFAULT_TENANT,
    show_default=True,
    help="The tenant ('*': every tenant without its own policy).",
)
@click.option(
    "--age", required=True, help="How long after its last activity a conversation stays, e.g. 30d."
)
@click.option(
    "--mode",
    type=click.Choice(retention.MODES),
    default="archive",
    show_default=True,
    help="archive: moved to archived_runs; delete: removed.",
)
@click.option(
    "--archive-keep",
    help="How long the archive keeps a day (default policy only), e.g. 365d; default: forever.",
)
@actor_option
@json_option
def retention_set(
    tenant: str, age: str, mode: str, archive_keep: str | None, actor: str, as_json: bool
) -> None:
    """Set a tenant's retention policy (journaled)."""
    keep: timedelta | None = ops.parse_age(archive_keep) if archive_keep else None
    with connection() as conn:
        row = retention.set_policy(
            conn, tenant, ops.parse_age(age), mode=mode, archive_keep=keep, actor=actor
        )
    if as_json:
        echo_json(row)
        return
    kept = f", archive kept {_age(row['archive_keep_s'])}" if tenant == "*" else ""
    click.echo(f"tenant {tenant}: conversations idle for {age} are {mode}d{kept}")


@retention_group.command("unset")
@click.option(
    "--tenant", required=True, help="The tenant whose own policy goes ('*': the default)."
)
@actor_option
@json_option
def retention_unset(tenant: str, actor: str, as_json: bool) -> None:
    """Remove a tenant's policy: it falls back to the default ('*'), or keeps everything."""
    with connection() as conn:
        retention.remove_policy(conn, tenant, actor=actor)
    if as_json:
        echo_json({"removed": tenant})
        return
    click.echo(f"tenant {tenant}: policy removed")


@retention_group.command("run")
@click.option(
    "--chunk",
    type=click.IntRange(1, 10000),
    default=retention.CHUNK,
    show_default=True,
    help="Threads per transaction.",
)
@click.option("--max-chunks", type=click.IntRange(1), help="Stop after this many chunks.")
@actor_option
@json_option
def retention_run(chunk: int, max_chunks: int | None, actor: str, as_json: bool) -> None:
    """Retain every conversation due now, one committed chunk at a time (the relay does
    this continuously), after making the archive's and the journal's days ahead; then drop
    the archive's days past its keep."""
    with db.connect() as conn:
        done = retention.run(conn, chunk=chunk, actor=actor, max_chunks=max_chunks)
    if as_json:
        echo_json(done.as_json())
        return
    click.echo(f"retained {done.threads} threads ({done.runs} runs) in {done.chunks} chunks")
    for (tenant, mode), counts in sorted(done.per_tenant.items()):
        click.echo(f"  {tenant}: {counts['threads']} threads, {counts['runs']} runs {mode}d")
    if done.payloads_swept:
        click.echo(f"bodies no longer referenced, deleted: {done.payloads_swept}")
    if done.journal_partitions_made:
        click.echo(f"journal days made ahead: {done.journal_partitions_made}")
    if done.partitions_dropped:
        click.echo(f"archive days dropped: {', '.join(done.partitions_dropped)}")
    if not done.complete:
        click.echo("more is due: run it again (or let the relay's maintenance do it)")
