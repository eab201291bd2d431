"""``outbox approvals``: the tool calls waiting for a reviewer, and the reviewer's decision.

A decision is taken once, by one of the approvers the call's policy lists, before its
deadline. ``--digest`` ties it to the exact arguments the reviewer read (``approvals
show``): a decision about other arguments is refused.
"""

from __future__ import annotations

import json

import click

from outbox import approvals
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("approvals", cls=OutboxGroup)
def approvals_group() -> None:
    """Tool calls waiting for a reviewer: list, show, approve, deny."""


APPROVAL_COLUMNS = ["id", "tenant_id", "tool_name", "status", "deadline", "approvers", "run_id"]


@approvals_group.command("list")
@click.option(
    "--status",
    type=click.Choice(["pending", "approved", "denied", "expired", "all"]),
    default="pending",
    show_default=True,
)
@click.option("--tenant", help="Only this tenant's.")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
def approvals_list(status: str, tenant: str | None, limit: int, as_json: bool) -> None:
    """Approvals, oldest first (by default the pending ones)."""
    with connection() as conn:
        rows = approvals.list_approvals(
            conn,
            None if status == "all" else status,
            tenant,
            limit,
        )
    emit(rows, as_json, APPROVAL_COLUMNS)


@approvals_group.command("show")
@click.argument("approval_id", type=int)
@json_option
def approvals_show(approval_id: int, as_json: bool) -> None:
    """One approval with the exact arguments it is for and their digest."""
    with connection() as conn:
        row = approvals.get(conn, approval_id)
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        shown = json.dumps(value, indent=2) if key == "arguments" else value
        click.echo(f"{key}: {shown}")


def _decide(
    approval_id: int, decision: str, actor: str, reason: str, digest: str | None, as_json: bool
) -> None:
    with connection() as conn:
        row = approvals.decide(
            conn,
            approval_id,
            decision,
            actor=actor,
            reason=reason,
            digest=digest,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(f"approval {approval_id}: {row['status']} by {row['decided_by']}")


@approvals_group.command("approve")
@click.argument("approval_id", type=int)
@click.option(
    "--digest",
    help="The arguments digest you reviewed (from `approvals show`): refused if it differs.",
)
@click.option("--reason", default="", help="Recorded in the journal.")
@actor_option
@json_option
def approvals_approve(
    approval_id: int, digest: str | None, reason: str, actor: str, as_json: bool
) -> None:
    """Approve a waiting call: a relay runs it once.

    
    Decided once: approving again, or denying after, is refused. Only one of the
    approvers its policy lists may decide (as --actor), and only before its deadline.
    """
    _decide(approval_id, "approve", actor, reason, digest, as_json)


@approvals_group.command("deny")
@click.argument("approval_id", type=int)
@click.option("--reason", default="", help="Why: the model sees it, and the journal keeps it.")
@click.option("--digest", help="The arguments digest you reviewed (from `approvals show`).")
@actor_option
@json_option
def approvals_deny(
    approval_id: int, reason: str, digest: str | None, actor: str, as_json: bool
) -> None:
    """Deny a waiting call: it never runs; the model sees "denied by reviewer" and the run
    goes on."""
    _decide(approval_id, "deny", actor, reason, digest, as_json)
