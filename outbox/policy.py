"""The action layer's rules: what may act, decided before anything runs.

A tool result can carry a prompt injection, and no filter stops one; so what a call may do
is decided where actions are taken, by rules the model cannot change:

* **risk policies** (``outbox.risk_policies``): per tenant, with ``'*'`` as the default,
  each risk tier says what a recorded call does: ``allow`` (it runs), ``approve`` (it
  waits for a reviewer, ``outbox.approvals``) or ``deny`` (it never runs; the model sees
  why). A tool registered with ``requires_approval`` waits whatever its tier says. Decided
  when the call is recorded, journaled with the rule that decided it.
* **kill switches** (``outbox.tool_switches``): a tool off for one tenant or for every
  tenant. Calls recorded later are answered "disabled"; calls already queued are answered
  the same when a relay claims them, instead of running. Turning it on again affects calls
  not yet answered.
* **paused tenants** (``outbox.tenant_pauses``): no relay claims a paused tenant's work, so
  its runs hold between steps (effects in flight finish) until it is resumed.

Like the operator actions, the changes here run in the caller's transaction, never commit,
and are journaled with the actor. docs/actions.md tells the whole story.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from outbox import calls
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal

Q = queries("actions.sql")
Row = dict[str, Any]
Action = Literal["allow", "approve", "deny"]
ALL_TENANTS = "*"
TIERS = ("low", "medium", "high")
ACTIONS = ("allow", "approve", "deny")
# What a tier does when a database has no rule for it at all (the default rules' rows say the same).
DEFAULT_ACTIONS: dict[str, Action] = {"low": "allow", "medium": "allow", "high": "approve"}
DEFAULT_APPROVAL_TIMEOUT_S = 24 * 3600.0
NOT_EXECUTED = "the call was not executed"


@dataclass(frozen=True)
class Decision:
    """What a recorded call does, and the rule that said so (journaled with the call)."""

    action: Action
    rule: str
    approvers: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S


def decide(tool: Row) -> Decision:
    """The decision for a call of ``tool``, a row of ``tools_by_name`` (outbox/queries/
    registry.sql), which carries the tier's policy for the run's tenant."""
    tier = tool["risk_tier"]
    action: Action = tool.get("policy_action") or DEFAULT_ACTIONS[tier]
    scope = tool.get("policy_tenant") or "built-in default"
    rule = f"policy {scope}/{tier}: {action}"
    approvers = tuple(tool.get("policy_approvers") or ())
    timeout_s = float(tool.get("policy_timeout_s") or DEFAULT_APPROVAL_TIMEOUT_S)
    if tool.get("requires_approval") and action == "allow":
        return Decision("approve", f"tool {tool['name']} requires approval", approvers, timeout_s)
    return Decision(action, rule, approvers, timeout_s)


def denied_text(tool_name: str, decision: Decision) -> str:
    return f"denied by policy ({decision.rule}): {tool_name!r} may not run; {NOT_EXECUTED}"


def switch_text(tool_name: str, tenant_id: str | None, by: str | None, reason: str | None) -> str:
    """What the model sees for a call of a tool that was switched off."""
    scope = "for every tenant" if tenant_id in (None, ALL_TENANTS) else f"for tenant {tenant_id}"
    because = f": {reason}" if reason else ""
    return (
        f"tool {tool_name!r} is disabled {scope} by {by or 'an operator'}{because}; {NOT_EXECUTED}"
    )


def stop_text(tool_name: str, stop: Row) -> str:
    """Why a claimed call does not run (the claim's ``stop``, relay/queries/relay.sql)."""
    if "switch" in stop:
        return switch_text(tool_name, stop["switch"], stop.get("by"), stop.get("reason"))
    if "disabled_version" in stop:
        return f"tool {tool_name!r} v{stop['disabled_version']} is disabled; {NOT_EXECUTED}"
    status = stop.get("status")
    if status == "denied":
        because = f": {stop['reason']}" if stop.get("reason") else ""
        return f"denied by reviewer {stop.get('by')}{because}; {NOT_EXECUTED}"
    if status == "expired":
        deadline = stop.get("deadline")
        return f"denied by policy: no reviewer approved it before {deadline}; {NOT_EXECUTED}"
    return (
        f"not approved (approval {stop.get('approval')} is {status}, or its arguments changed); "
        f"{NOT_EXECUTED}"
    )


# -- risk policies ----------------------------------------------------------------------


def policies(conn: psycopg.Connection[Any]) -> list[Row]:
    return fetch_all(conn, Q.policies, {})


def set_policy(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    tier: str,
    action: str,
    *,
    approvers: list[str] | None = None,
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
    actor: str | None = None,
) -> Row:
    """Set what ``tenant_id``'s (``'*'``: every tenant's default) calls of ``tier`` do."""
    if tenant_id != ALL_TENANTS:
        calls.check_tenant(tenant_id)
    if tier not in TIERS:
        raise InvalidInput(f"risk tier must be one of {', '.join(TIERS)}, got {tier!r}")
    if action not in ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if not approval_timeout_s > 0:
        raise InvalidInput(f"the approval timeout must be positive, got {approval_timeout_s}")
    row = fetch_one(
        conn,
        Q.set_policy,
        {
            "tenant_id": tenant_id,
            "risk_tier": tier,
            "action": action,
            "approvers": list(approvers or []),
            "approval_timeout_s": approval_timeout_s,
            "actor": actor or "unknown",
        },
    )
    assert row is not None
    journal(conn, "policy.set", tenant_id, actor=actor, detail=_jsonable(row))
    return row


def clear_policy(
    conn: psycopg.Connection[Any], tenant_id: str, tier: str, *, actor: str | None = None
) -> bool:
    """Remove a tenant's own rule for ``tier``; the default applies again."""
    if tenant_id == ALL_TENANTS:
        raise InvalidInput(
            "the default policy ('*') cannot be removed, only set",
            hint="outbox policy set '*' TIER allow|approve|deny",
        )
    removed = fetch_one(conn, Q.clear_policy, {"tenant_id": tenant_id, "risk_tier": tier})
    if removed:
        journal(conn, "policy.cleared", tenant_id, actor=actor, detail={"risk_tier": tier})
    return removed is not None


# -- kill switches ----------------------------------------------------------------------


def disable_tool(
    conn: psycopg.Connection[Any],
    name: str,
    tenant_id: str = ALL_TENANTS,
    *,
    actor: str | None = None,
    reason: str = "",
) -> Row | None:
    """Switch tool ``name`` off for ``tenant_id`` (``'*'``: every tenant). Returns the new
    switch, or None when it was already off (the first record of who did it stays)."""
    _check_visible(conn, name, tenant_id)
    row = fetch_one(
        conn,
        Q.switch_off,
        {"tenant_id": tenant_id, "name": name, "actor": actor or "unknown", "reason": reason},
    )
    if row is not None:
        journal(conn, "tool.disabled", tenant_id, actor=actor, detail=_jsonable(row))
    return row


def enable_tool(
    conn: psycopg.Connection[Any],
    name: str,
    tenant_id: str = ALL_TENANTS,
    *,
    actor: str | None = None,
) -> bool:
    """Switch tool ``name`` on again for ``tenant_id`` (and make versions registered
    disabled in that scope usable). Returns whether anything changed."""
    _check_visible(conn, name, tenant_id)
    switched = fetch_one(conn, Q.switch_on, {"tenant_id": tenant_id, "name": name})
    versions = fetch_all(conn, Q.enable_versions, {"tenant_id": tenant_id, "name": name})
    changed = switched is not None or bool(versions)
    if changed:
        journal(
            conn,
            "tool.enabled",
            tenant_id,
            actor=actor,
            detail={"tool": name, "versions": [v["version"] for v in versions]},
        )
    return changed


def switches(conn: psycopg.Connection[Any]) -> list[Row]:
    return fetch_all(conn, Q.switches, {})


def _check_visible(conn: psycopg.Connection[Any], name: str, tenant_id: str) -> None:
    if tenant_id != ALL_TENANTS:
        calls.check_tenant(tenant_id)
    found = fetch_one(conn, Q.tool_visible, {"name": name, "tenant_id": tenant_id})
    if not (found and found["found"]):
        scope = "" if tenant_id == ALL_TENANTS else f" for tenant {tenant_id} or for all tenants"
        raise NotFound(f"tool {name!r} is not registered{scope}", hint="`outbox tools list`")


# -- paused tenants ---------------------------------------------------------------------


def pause_tenant(
    conn: psycopg.Connection[Any], tenant_id: str, *, actor: str | None = None, reason: str = ""
) -> Row | None:
    """Pause ``tenant_id``: no relay claims its work until it is resumed. Returns the pause,
    or None when it was already paused."""
    calls.check_tenant(tenant_id)
    row = fetch_one(
        conn, Q.pause, {"tenant_id": tenant_id, "actor": actor or "unknown", "reason": reason}
    )
    if row is not None:
        journal(conn, "tenant.paused", tenant_id, actor=actor, detail={"reason": reason})
    return row


def resume_tenant(
    conn: psycopg.Connection[Any], tenant_id: str, *, actor: str | None = None
) -> bool:
    """Resume a paused tenant; its runs go on from where they held."""
    calls.check_tenant(tenant_id)
    row = fetch_one(conn, Q.resume, {"tenant_id": tenant_id})
    if row is not None:
        journal(conn, "tenant.resumed", tenant_id, actor=actor, detail={})
    return row is not None


def pauses(conn: psycopg.Connection[Any]) -> list[Row]:
    return fetch_all(conn, Q.pauses, {})


def _jsonable(row: Row) -> Row:
    return {
        k: v if isinstance(v, str | int | float | list | None) else str(v) for k, v in row.items()
    }
