"""``outbox tools``: the tool registry (register versions, list, show), the switch that turns
a tool off and on, and the limits of a tool's calls.

Registering always adds a version, so a new schema or endpoint never changes what a call
in flight was planned against; the switch and the limits act on calls not yet dispatched.
"""

from __future__ import annotations

import json
from typing import Any

import click

from outbox import context, limits, policy, registry
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    inline_or_file,
    json_option,
)
from outbox.commands.limits import LimitValue, merged_limit, show_lane


@click.group("tools", cls=OutboxGroup)
def tools_group() -> None:
    """The tool registry: register versions, list, show, enable, disable."""


@tools_group.command("register")
@click.argument("name")
@click.option("--executor", type=click.Choice(["http", "client", "python"]), default="http")
@click.option("--endpoint", help="URL the relay POSTs arguments to (http tools).")
@click.option(
    "--lookup-endpoint",
    help="URL that answers 'did this call happen?' (lookup mode): POST "
    '{"idempotency_key", "arguments"}, answers 200 {"found": true, "result": ...} or '
    '{"found": false}. See docs/relay.md.',
)
@click.option("--callable", "callable_", help="'package.module:function' (python tools).")
@click.option(
    "--idempotency",
    type=click.Choice(["key", "lookup", "none"]),
    default="key",
    show_default=True,
    help="key: honours Idempotency-Key (retried with the same key); lookup: after an "
    "ambiguous attempt the relay asks --lookup-endpoint before calling again; none: neither "
    "(never re-executed after an ambiguous attempt: outcome_unknown, for an operator).",
)
@click.option("--schema", "schema_", help="JSON Schema of the arguments: inline JSON or @file.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds the relay waits for an answer.",
)
@click.option(
    "--settle",
    "settle_s",
    type=float,
    default=None,
    help="Seconds after the relay gave up on a request (at --timeout, or later) that it may "
    "still take effect at the tool (it was sent before its relay died or stopped waiting): "
    "before then the relay resends no such call of a key tool and trusts no 'not found' of "
    "a lookup. The tool must not act on a request later than that. Default: as long as "
    "--timeout (docs/relay.md, 'What a tool declares').",
)
@click.option(
    "--refuses-key-in-use",
    is_flag=True,
    help="A key tool that answers 409 to a request whose Idempotency-Key belongs to a request "
    "it is still acting on, and never acts on it (as Stripe and the Idempotency-Key draft "
    "do): after a timeout the relay resends at once instead of waiting for --settle.",
)
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option(
    "--deadline",
    "deadline_s",
    type=float,
    default=None,
    help="Seconds after the model asks for a call by which an attempt of it must have been "
    "sent. With it, attempts that never reached the tool (refused connection, "
    "408/429/503) are not charged against --max-attempts; at the deadline a call never "
    "sent ends with an error result the model sees (docs/relay.md, Deadlines). Default: none.",
)
@click.option(
    "--risk",
    type=click.Choice(["low", "medium", "high"]),
    default="low",
    show_default=True,
    help="Risk tier: the tenant's policy for it decides whether a call runs, waits for "
    "approval or is denied (`outbox policy list`; by default high waits for approval).",
)
@click.option(
    "--requires-approval",
    is_flag=True,
    help="Every call waits for a reviewer (`outbox approvals`), whatever its tier's policy.",
)
@click.option(
    "--credential-ref",
    help="The credential the relay sends this tool (`outbox credentials set NAME`).",
)
@click.option(
    "--model-result-cap",
    metavar="BYTES",
    help="The most bytes of a result the model is given: past it, the model sees the "
    "result's first BYTES, a handle and a note, and reads on with the built-in read_result "
    "tool (the stored result is whole). 0 or 'none': no cap. Default: 65536 "
    "(docs/context.md, 'Results past a cap').",
)
@click.option("--description", default="")
@click.option("--tenant", default="*", show_default=True, help="'*' = shared by all tenants.")
@click.option("--disabled", is_flag=True, help="Register the version disabled.")
@click.option(
    "--max-concurrency",
    type=int,
    help="Most calls of NAME in flight at once, across every relay (see `tools limit`).",
)
@click.option(
    "--rate", type=float, help="Most calls of NAME started per second, across every relay."
)
@json_option
def tools_register(
    name: str, schema_: str | None, callable_: str | None, as_json: bool, **opts: Any
) -> None:
    """Register a new version of tool NAME.

    \b
    An http tool receives POST ENDPOINT with the JSON arguments as body and the headers
    Idempotency-Key, X-Outbox-Run-Id, X-Outbox-Tool-Call-Id, X-Outbox-Attempt,
    X-Correlation-Id and traceparent.
    A lookup tool also answers POST LOOKUP_ENDPOINT
      {"idempotency_key": "...", "arguments": {...}}
    with 200 {"found": true, "result": <JSON>} (the effect happened: that result is used,
    no new call), 200 {"found": false, "in_progress": true} (a request is acting there now:
    asked again shortly) or 200 {"found": false} (the call is made, once an earlier request
    can no longer act: --settle).
    """
    schema: Any = {"type": "object"}
    if schema_ is not None:
        schema = inline_or_file(schema_, "--schema")
    cap = opts["model_result_cap"]
    if cap is not None and cap != "none" and not cap.isdigit():
        raise click.BadParameter("a number of bytes, 0 or 'none'", param_hint="--model-result-cap")
    spec = registry.ToolSpec(
        name=name,
        json_schema=schema,
        callable=callable_,
        executor=opts["executor"],
        endpoint=opts["endpoint"],
        lookup_endpoint=opts["lookup_endpoint"],
        idempotency_mode=opts["idempotency"],
        timeout_s=opts["timeout_s"],
        settle_s=opts["settle_s"],
        refuses_key_in_use=opts["refuses_key_in_use"],
        deadline_s=opts["deadline_s"],
        max_attempts=opts["max_attempts"],
        risk_tier=opts["risk"],
        requires_approval=opts["requires_approval"],
        credential_ref=opts["credential_ref"],
        description=opts["description"],
        tenant_id=opts["tenant"],
        enabled=not opts["disabled"],
        model_result_cap=None if cap is None else 0 if cap == "none" else int(cap),
    )
    with connection() as conn:
        row = registry.register(conn, spec)
        if opts["max_concurrency"] is not None or opts["rate"] is not None:
            lane = limits.set_limits(
                conn, "tool", name, max_concurrency=opts["max_concurrency"], rate=opts["rate"]
            )
            row = {**row, "limits": lane}
    if as_json:
        echo_json(row)
        return
    click.echo(
        f"registered {row['name']} v{row['version']} ({row['executor']}, {row['idempotency_mode']})"
    )


TOOL_COLUMNS = [
    "tenant_id",
    "name",
    "version",
    "executor",
    "idempotency_mode",
    "enabled",
    "endpoint",
    "model_result_cap",
]


@tools_group.command("list")
@json_option
def tools_list(as_json: bool) -> None:
    """List every tool's newest version.

    MODEL_RESULT_CAP is the most bytes of a result the model is given (`register
    --model-result-cap`): "none" for no cap, "(default)" after the platform's default."""
    with connection() as conn:
        rows = registry.list_tools(conn)
    if not as_json:
        rows = [{**row, "model_result_cap": _cap_text(row["model_result_cap"])} for row in rows]
    emit(rows, as_json, TOOL_COLUMNS)


def _cap_text(cap: int | None) -> str:
    if cap is None:
        return f"{context.RESULT_CAP_BYTES} (default)"
    return "none" if cap == 0 else str(cap)


@tools_group.command("show")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@json_option
def tools_show(name: str, tenant: str, as_json: bool) -> None:
    """Show every version of tool NAME."""
    with connection() as conn:
        rows = registry.versions(conn, name, tenant)
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    for row in rows:
        click.echo(f"{row['name']} v{row['version']}")
        for key, value in row.items():
            if key not in ("name", "version"):
                click.echo(f"  {key}: {json.dumps(value, default=str)}")


@tools_group.command("disable")
@click.argument("name")
@click.option(
    "--tenant", default="*", show_default=True, help="Only this tenant's calls ('*': everyone's)."
)
@click.option("--reason", default="", help="Why (the model and the journal see it).")
@actor_option
@json_option
def tools_disable(name: str, tenant: str, reason: str, actor: str, as_json: bool) -> None:
    """Switch tool NAME off: its calls are answered "disabled" instead of running.

    
    Acts on calls not yet dispatched, including those already queued: a relay that claims
    one answers it with an error result the model sees (the batch still completes); calls
    already running finish. Works per tenant for a shared tool. Journaled (tool.disabled)
    with the actor and the reason. `outbox tools enable` turns it back on.
    """
    with connection() as conn:
        row = policy.disable_tool(conn, name, tenant, actor=actor, reason=reason)
    if as_json:
        echo_json({"name": name, "tenant_id": tenant, "enabled": False, "switch": row})
        return
    scope = "for every tenant" if tenant == "*" else f"for tenant {tenant}"
    click.echo(f"disabled {name} {scope}" + ("" if row else " (it was already)"))


@tools_group.command("enable")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@actor_option
@json_option
def tools_enable(name: str, tenant: str, actor: str, as_json: bool) -> None:
    """Switch tool NAME on again (for TENANT, or for every tenant with '*')."""
    with connection() as conn:
        changed = policy.enable_tool(conn, name, tenant, actor=actor)
    if as_json:
        echo_json({"name": name, "tenant_id": tenant, "enabled": True, "changed": changed})
        return
    scope = "for every tenant" if tenant == "*" else f"for tenant {tenant}"
    click.echo(f"enabled {name} {scope}" + ("" if changed else " (it was not disabled)"))


@tools_group.command("switches")
@json_option
def tools_switches(as_json: bool) -> None:
    """Every tool switched off, for which tenant, by whom and why."""
    with connection() as conn:
        rows = policy.switches(conn)
    emit(rows, as_json, ["tool_name", "tenant_id", "switched_by", "switched_at", "reason"])


@tools_group.command("limit")
@click.argument("name")
@click.option(
    "--max-concurrency",
    type=LimitValue(int),
    help="Most calls of NAME in flight at once, across every relay process and machine.",
)
@click.option(
    "--rate",
    type=LimitValue(float),
    help="Most calls of NAME started per second (burst max(1, rate)), across every relay.",
)
@actor_option
@json_option
def tools_limit(name: str, max_concurrency: Any, rate: Any, actor: str, as_json: bool) -> None:
    """Show or set the limits of tool NAME (for every tenant's calls of it).

    \b
    Counted in PostgreSQL when a relay claims, so they hold across every relay process and
    machine. A call over a limit waits in the queue, uncharged, until a claim finds room.
    An option left out keeps its value; 'none' removes that limit. Without options, shows
    the limits.
    """
    with connection() as conn:
        lane = limits.get(conn, "tool", name)
        if max_concurrency is not None or rate is not None:
            current = lane or {}
            lane = limits.set_limits(
                conn,
                "tool",
                name,
                max_concurrency=merged_limit(current.get("max_concurrency"), max_concurrency),
                rate=merged_limit(current.get("rate"), rate),
                actor=actor,
            )
    show_lane("tool", name, lane, as_json)
