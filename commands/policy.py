"""``outbox policy``: per tenant and risk tier, whether a tool call runs, waits for a
reviewer, or never runs.

A call's fate is decided when it is recorded, by the rule in force then, and journaled with
that rule; changing a rule does not move calls already recorded.
"""

from __future__ import annotations

import click

from outbox import ops, policy
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("policy", cls=OutboxGroup)
def policy_group() -> None:
    """Risk policies: per tenant and risk tier, whether a tool call runs, waits, or not."""


@policy_group.command("list")
@json_option
def policy_list(as_json: bool) -> None:
    """Every rule: the default ('*') and each tenant's own."""
    with connection() as conn:
        rows = policy.policies(conn)
    emit(
        rows,
        as_json,
        ["tenant_id", "risk_tier", "action", "approvers", "approval_timeout_s", "updated_by"],
    )


@policy_group.command("set")
@click.argument("tenant")
@click.argument("tier", type=click.Choice(policy.TIERS))
@click.argument("action", type=click.Choice(policy.ACTIONS))
@click.option(
    "--approver",
    "approvers",
    multiple=True,
    help="Who may decide (repeat; none: anyone who can run `outbox approvals`).",
)
@click.option(
    "--timeout", default="24h", show_default=True, help="How long a call waits: 90s, 15m, 12h."
)
@actor_option
@json_option
def policy_set(
    tenant: str,
    tier: str,
    action: str,
    approvers: tuple[str, ...],
    timeout: str,
    actor: str,
    as_json: bool,
) -> None:
    """Say what TENANT's ('*': every tenant's default) calls of risk TIER do.

    
    allow    the call runs;
    approve  the call waits for a reviewer's decision (`outbox approvals`); with no
             decision by --timeout it is denied, never run;
    deny     the call never runs: the model sees "denied by policy".
    Decided when a call is recorded and journaled with the rule that decided it. A tool
    registered with --requires-approval waits whatever its tier says.
    """
    timeout_s = ops.parse_age(timeout).total_seconds()
    with connection() as conn:
        row = policy.set_policy(
            conn,
            tenant,
            tier,
            action,
            approvers=list(approvers),
            approval_timeout_s=timeout_s,
            actor=actor,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(f"policy {tenant}/{tier}: {action}")


@policy_group.command("clear")
@click.argument("tenant")
@click.argument("tier", type=click.Choice(policy.TIERS))
@actor_option
@json_option
def policy_clear(tenant: str, tier: str, actor: str, as_json: bool) -> None:
    """Remove TENANT's own rule for TIER: the default ('*') applies again."""
    with connection() as conn:
        removed = policy.clear_policy(conn, tenant, tier, actor=actor)
    if as_json:
        echo_json({"tenant_id": tenant, "risk_tier": tier, "removed": removed})
        return
    click.echo(f"cleared {tenant}/{tier}" if removed else f"{tenant} had no rule for {tier}")
