"""``outbox mcp``: MCP tool servers, registered once, their tools discovered into the registry.

``add`` reaches the server, lists its tools and registers server and tools in one
transaction: a server that cannot be reached, or lists no tool that can be registered, is
refused and nothing is written. ``sync`` lists again and registers new versions of what
changed. How the relay calls these tools, and what the modes mean, is docs/mcp.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from outbox import credentials, mcpservers
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)
from outbox.errors import InvalidInput

SERVER_COLUMNS = ["tenant_id", "name", "transport", "trusted", "tools", "synced_at", "where"]


@click.group("mcp", cls=OutboxGroup)
def mcp_group() -> None:
    """MCP tool servers: add, sync, set, list, show, remove."""


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, eq, rest = value.partition("=")
        if not eq or not key:
            raise InvalidInput(f"{option} {value!r} is not KEY=VALUE", hint=f"e.g. {option} A=b")
        pairs[key] = rest
    return pairs


def _overrides(modes: dict[str, str], risks: dict[str, str]) -> dict[str, Any]:
    return {
        tool: {
            k: v
            for k, v in (("idempotency_mode", modes.get(tool)), ("risk_tier", risks.get(tool)))
            if v is not None
        }
        for tool in sorted(set(modes) | set(risks))
    }


def discover(server: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's tools/list as JSON, or a refusal saying why it could not be had."""
    from outbox.relay import mcpclient  # the SDK is imported by the commands that talk

    headers: dict[str, str] = {}
    if server.get("credential_ref"):
        with connection() as conn:
            stored = mcpservers.credential_row(conn, server["credential_ref"], server["tenant_id"])
        try:
            headers = credentials.resolve(server["credential_ref"], stored).headers()
        except LookupError as err:
            raise InvalidInput(str(err), hint="`outbox credentials --help`") from err
    where = server.get("url") or " ".join(server.get("command") or [])
    try:
        tools = asyncio.run(mcpclient.list_tools(mcpclient.Server.of(server), headers))
    except Exception as err:
        raise InvalidInput(
            f"could not list the tools of MCP server {server['name']} at {where}: "
            f"{mcpclient.describe(err)}",
            hint="check that the server runs and answers MCP there (nothing was registered)",
        ) from err
    return [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in tools]


def _report(row: dict[str, Any], verb: str, as_json: bool) -> None:
    if as_json:
        echo_json(mcpservers.public(row))
        return
    click.echo(f"{verb} MCP server {row['name']} ({row['transport']})")
    for key in ("added", "changed", "disabled"):
        for name in row.get(key) or []:
            click.echo(f"  {key}: {name}")
    if row.get("unchanged"):
        click.echo(f"  unchanged: {len(row['unchanged'])} tools")
    for skipped in row.get("skipped") or []:
        click.echo(
            f"  skipped: tool {skipped['tool']} of MCP server {row['name']}: {skipped['problem']} "
            "(not registered; the server's other tools are)"
        )


@mcp_group.command("add")
@click.argument("name")
@click.option("--url", help="The server's streamable HTTP endpoint (e.g. http://host/mcp).")
@click.option(
    "--header", "headers", multiple=True, help="K=V: a header sent with every request (HTTP)."
)
@click.option(
    "--command",
    "command",
    help='The program to start for a stdio server, with its arguments ("uvx mcp-server-time").',
)
@click.option("--env", "env", multiple=True, help="K=V: an environment variable (stdio).")
@click.option(
    "--credential-ref",
    help="The credential whose header every request carries (`outbox credentials set`).",
)
@click.option(
    "--trusted",
    is_flag=True,
    help="Take modes and tiers from the tools' annotations (readOnlyHint, idempotentHint). "
    "Without it every tool is mode none and tier high (docs/mcp.md).",
)
@click.option("--prefix", help="Registry names are PREFIX__tool (default: NAME).")
@click.option("--tenant", default="*", show_default=True, help="'*' = shared by all tenants.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds the relay waits for a call's answer.",
)
@click.option(
    "--settle",
    "settle_s",
    type=float,
    default=None,
    help="Seconds after the relay gave up on a call (at --timeout, or later) that it may "
    "still act at the server: no resend before then. Default: as long as --timeout "
    "(docs/relay.md).",
)
@click.option(
    "--deadline",
    "deadline_s",
    type=float,
    default=None,
    help="Seconds after the model asks for a call by which an attempt of it must have been "
    "sent. With it, attempts that never reached the server (refused connection, no session, "
    "408/429/503) are not charged against --max-attempts; at the deadline a call never "
    "sent ends with an error result the model sees (docs/relay.md, Deadlines). Default: none.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=5,
    show_default=True,
    help="Attempts of a call before it is quarantined.",
)
@click.option(
    "--max-concurrency",
    type=int,
    default=mcpservers.DEFAULT_MAX_CONCURRENCY,
    show_default=True,
    help="Most calls in flight to this server from one relay process.",
)
@click.option("--mode", "modes", multiple=True, help="TOOL=key|none: the mode of one tool.")
@click.option("--risk", "risks", multiple=True, help="TOOL=low|medium|high: the tier of one tool.")
@actor_option
@json_option
def mcp_add(
    name: str,
    headers: tuple[str, ...],
    env: tuple[str, ...],
    command: str | None,
    modes: tuple[str, ...],
    risks: tuple[str, ...],
    actor: str,
    as_json: bool,
    **opts: Any,
) -> None:
    """Register MCP server NAME and the tools it lists.

    \b
    A streamable HTTP server:  outbox mcp add tickets --url http://127.0.0.1:8000/mcp
    A stdio server:            outbox mcp add time --command "mcp-server-time"
    Each tool becomes registry tool NAME__tool. Its calls carry the idempotency key in
    _meta["agent-outbox/call"] and, over HTTP, as the Idempotency-Key header.
    """
    spec = mcpservers.ServerSpec(
        name=name,
        url=opts["url"],
        headers=_pairs(headers, "--header"),
        command=mcpservers.parse_command(command) if command is not None else None,
        env=_pairs(env, "--env"),
        credential_ref=opts["credential_ref"],
        trusted=opts["trusted"],
        prefix=opts["prefix"],
        tenant_id=opts["tenant"],
        timeout_s=opts["timeout_s"],
        settle_s=opts["settle_s"],
        deadline_s=opts["deadline_s"],
        max_attempts=opts["max_attempts"],
        max_concurrency=opts["max_concurrency"],
        overrides=_overrides(_pairs(modes, "--mode"), _pairs(risks, "--risk")),
    )
    listed = discover({**spec.model_dump(), "transport": spec.transport})
    with connection() as conn:
        row = mcpservers.add(conn, spec, listed, actor)
    _report(row, "added", as_json)


@mcp_group.command("sync")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@actor_option
@json_option
def mcp_sync(name: str, tenant: str, actor: str, as_json: bool) -> None:
    """List the tools of server NAME again: a new or changed tool gets a new version (runs
    keep the version they pinned), a tool no longer listed a disabled one."""
    with connection() as conn:
        server = mcpservers.get(conn, name, tenant)
    listed = discover(server)
    with connection() as conn:
        row = {**server, **mcpservers.sync(conn, server, listed, actor)}
    _report(row, "synced", as_json)


@mcp_group.command("set")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@click.option(
    "--trusted/--untrusted",
    default=None,
    help="Whether the tools' annotations give their modes and tiers (docs/mcp.md).",
)
@click.option("--mode", "modes", multiple=True, help="TOOL=key|none: the mode of one tool.")
@click.option("--risk", "risks", multiple=True, help="TOOL=low|medium|high: the tier of one tool.")
@click.option(
    "--deadline",
    "deadline_s",
    type=float,
    default=None,
    help="Seconds: the deadline of its tools' calls (as `outbox mcp add --deadline`).",
)
@click.option("--no-deadline", is_flag=True, help="Its tools' calls have no deadline.")
@actor_option
@json_option
def mcp_set(
    name: str,
    tenant: str,
    trusted: bool | None,
    modes: tuple[str, ...],
    risks: tuple[str, ...],
    deadline_s: float | None,
    no_deadline: bool,
    actor: str,
    as_json: bool,
) -> None:
    """Trust server NAME or not, set the mode and tier of some of its tools, or their
    deadline.

    Its tools get new versions where that changes them (runs keep the versions they pinned);
    the server is not asked anything. Overrides stay in force across `outbox mcp sync`.
    """
    overrides = {
        tool: mcpservers.Override.model_validate(value)
        for tool, value in _overrides(_pairs(modes, "--mode"), _pairs(risks, "--risk")).items()
    }
    if deadline_s is not None and no_deadline:
        raise InvalidInput("--deadline and --no-deadline say opposite things", hint="give one")
    deadline = (None,) if no_deadline else None if deadline_s is None else (deadline_s,)
    if trusted is None and not overrides and deadline is None:
        raise InvalidInput(
            "nothing to set",
            hint="give --trusted/--untrusted, --mode, --risk, --deadline or --no-deadline",
        )
    with connection() as conn:
        row = mcpservers.configure(
            conn, name, tenant, trusted=trusted, overrides=overrides, actor=actor, deadline=deadline
        )
    _report(row, "configured", as_json)


@mcp_group.command("list")
@json_option
def mcp_list(as_json: bool) -> None:
    """Every registered MCP server."""
    with connection() as conn:
        rows = [mcpservers.public(r) for r in mcpservers.list_servers(conn)]
    for row in rows:
        row["where"] = row["url"] or " ".join(row["command"] or [])
    emit(rows, as_json, SERVER_COLUMNS)


@mcp_group.command("show")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@json_option
def mcp_show(name: str, tenant: str, as_json: bool) -> None:
    """Server NAME and the newest version of each of its tools."""
    with connection() as conn:
        server = mcpservers.public(mcpservers.get(conn, name, tenant))
        tools = mcpservers.newest_tools(conn, name, tenant)
    columns = ["name", "version", "mcp_tool", "idempotency_mode", "risk_tier", "enabled"]
    if as_json:
        echo_json({**server, "tools": tools})
        return
    for key, value in server.items():
        click.echo(f"{key}: {value}")
    click.echo("")
    emit(tools, False, columns)


@mcp_group.command("remove")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@actor_option
@json_option
def mcp_remove(name: str, tenant: str, actor: str, as_json: bool) -> None:
    """Remove server NAME: every version of its tools is disabled (calls planned with one
    are answered "disabled"; queued ones end with an error result saying why)."""
    with connection() as conn:
        row = mcpservers.remove(conn, name, tenant, actor)
    if as_json:
        echo_json(mcpservers.public(row))
        return
    click.echo(f"removed MCP server {name}; disabled {len(row['disabled_tools'])} tools")
