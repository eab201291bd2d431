"""``outbox tenants``: a tenant's budget, limit and pause, and the login roles bound to it.

A role bound to a tenant acts for that tenant only, whatever its sessions set: the password
of a role created here is read from stdin, never from the command line, which other users
of the machine can see.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from outbox import budgets, limits, policy, tenancy, writer
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
    refuse,
)
from outbox.commands.limits import LimitValue, merged_limit, show_lane


@click.group("tenants", cls=OutboxGroup)
def tenants_group() -> None:
    """Per-tenant settings."""


@tenants_group.command("budget")
@click.argument("tenant")
@click.option("--max-tokens", type=int, help="Tokens over all the tenant's runs.")
@click.option(
    "--max-cost",
    type=str,
    help="Money over all the tenant's runs, by each model's price (`outbox prices set`).",
)
@actor_option
@json_option
def tenants_budget(
    tenant: str, max_tokens: int | None, max_cost: str | None, actor: str, as_json: bool
) -> None:
    """Set TENANT's budget in tokens and/or money: once one is used up, no new model turns
    start for it (its runs fail with `budget`). An option left out means no limit of that
    kind. Journaled (tenant.budget_set) with the actor."""
    cost = None if max_cost is None else budgets.money(max_cost, "--max-cost")
    with connection() as conn:
        row = writer.set_tenant_budget(conn, tenant, max_tokens, cost, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(
        f"tenant {tenant}: budget {row['max_tokens'] or 'unlimited'} tokens (used "
        f"{row['tokens_used']}), {row['max_cost'] if row['max_cost'] is not None else 'unlimited'}"
        f" in money (spent {writer.money_text(row['cost_used'])})"
    )


@tenants_group.command("limit")
@click.argument("tenant")
@click.option(
    "--max-concurrency",
    type=LimitValue(int),
    help="Most of TENANT's rows in flight at once (model turns, tool calls, deliveries), "
    "across every relay.",
)
@actor_option
@json_option
def tenants_limit(tenant: str, max_concurrency: Any, actor: str, as_json: bool) -> None:
    """Show or set how much of TENANT's work may be in flight at once.

    \b
    Counted in PostgreSQL when a relay claims, so it holds across every relay process and
    machine; the rest waits in the queue, uncharged. Claims are fair across tenants
    whatever the limits: one tenant's backlog never holds another's work back for more than
    one claim. 'none' removes the limit; without options, shows it.
    """
    with connection() as conn:
        lane = limits.get(conn, "tenant", tenant)
        if max_concurrency is not None:
            lane = limits.set_limits(
                conn,
                "tenant",
                tenant,
                max_concurrency=merged_limit(None, max_concurrency),
                actor=actor,
            )
    show_lane("tenant", tenant, lane, as_json)


@tenants_group.command("pause")
@click.argument("tenant")
@click.option("--reason", default="", help="Why (recorded in the journal).")
@actor_option
@json_option
def tenants_pause(tenant: str, reason: str, actor: str, as_json: bool) -> None:
    """Pause TENANT: its runs hold between steps until `outbox tenants resume`.

    
    No relay claims the tenant's work any more (model turns, tool calls, deliveries):
    effects already in flight finish and their results are stored; nothing new starts.
    Nothing is charged or lost: resuming continues every run where it held.
    """
    with connection() as conn:
        row = policy.pause_tenant(conn, tenant, actor=actor, reason=reason)
    if as_json:
        echo_json({"tenant_id": tenant, "paused": True, "pause": row})
        return
    click.echo(f"paused tenant {tenant}" + ("" if row else " (it was already)"))


@tenants_group.command("resume")
@click.argument("tenant")
@actor_option
@json_option
def tenants_resume(tenant: str, actor: str, as_json: bool) -> None:
    """Resume a paused TENANT: its runs go on from where they held."""
    with connection() as conn:
        changed = policy.resume_tenant(conn, tenant, actor=actor)
    if as_json:
        echo_json({"tenant_id": tenant, "paused": False, "changed": changed})
        return
    click.echo(f"resumed tenant {tenant}" + ("" if changed else " (it was not paused)"))


@tenants_group.command("paused")
@json_option
def tenants_paused(as_json: bool) -> None:
    """Every paused tenant, by whom and why."""
    with connection() as conn:
        rows = policy.pauses(conn)
    emit(rows, as_json, ["tenant_id", "paused_by", "paused_at", "reason"])


@tenants_group.command("grant")
@click.argument("tenant")
@click.option("--role", required=True, help="The login role a backend of TENANT connects as.")
@click.option(
    "--create",
    is_flag=True,
    help="Create the role first (LOGIN), with the password read from stdin (never from the "
    "command line, which other users of the machine can see).",
)
@actor_option
@json_option
def tenants_grant(tenant: str, role: str, create: bool, actor: str, as_json: bool) -> None:
    """Bind login ROLE to TENANT: its sessions act for TENANT only, whatever they set.

    \b
    The role gets the writer's rights (outbox_writer). Row-level security and the SQL
    functions ask which tenant a session's login role is bound to before the setting
    outbox.tenant_id, so a backend's database credential decides what it can see and
    change. Refused for a role that sees every tenant anyway (superuser, BYPASSRLS, a
    relay, the schema owner) or that is bound to another tenant.
    """
    password = sys.stdin.read().strip() if create else None
    if create and not password:
        refuse("--create read no password", hint="pipe it in: ... | outbox tenants grant --create")
    with connection() as conn:
        row = tenancy.grant_role(conn, tenant, role, actor=actor, create_with_password=password)
    if as_json:
        echo_json(row)
        return
    click.echo(f"role {role} acts for tenant {tenant} only")


@tenants_group.command("revoke")
@click.option("--role", required=True)
@actor_option
@json_option
def tenants_revoke(role: str, actor: str, as_json: bool) -> None:
    """Unbind login ROLE from its tenant and take the writer's rights back."""
    with connection() as conn:
        tenant = tenancy.revoke_role(conn, role, actor=actor)
    if as_json:
        echo_json({"role_name": role, "tenant_id": tenant, "revoked": True})
        return
    click.echo(f"role {role} no longer acts for tenant {tenant}")


@tenants_group.command("roles")
@json_option
def tenants_roles(as_json: bool) -> None:
    """Every login role bound to a tenant."""
    with connection() as conn:
        rows = tenancy.roles(conn)
    emit(rows, as_json, ["role_name", "tenant_id", "granted_by", "granted_at"])
