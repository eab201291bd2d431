"""MCP servers in the registry: a server registered once, its ``tools/list`` as tool versions.

A server (``mcp_servers``) is how to reach it: a streamable HTTP URL, or a command the relay
starts as a child process and talks to over stdio. Each tool it lists becomes a registry tool
(``executor = 'mcp'``) named ``PREFIX__tool`` (letters, digits, ``_`` and ``-``, at most 64:
what every model API takes as a function name), with its input schema, description and
annotations. ``sync`` lists again and registers a new version only of what changed, so a run
keeps the version it pinned; a tool the server no longer lists gets a disabled version.

MCP has no idempotency key and its annotations are hints a server makes up, so only a server
the operator marks ``trusted`` gets modes and tiers from them (``from_annotations``); every
tool of any other server is ``none`` (never called again after an ambiguous attempt) and
``high`` (the tier the approval policy sees). The operator's overrides, per tool, win over
both. The relay (``outbox.relay.mcpclient``) does the talking; this module only reads and
writes the registry, in the caller's transaction.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any, Literal

import jsonschema
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, model_validator

from outbox import registry, statements
from outbox.errors import InvalidInput, NotFound
from outbox.schemas import url_problem
from outbox.sql import queries

Q = queries("mcpservers.sql")
Row = dict[str, Any]
# Where a call's ids go in the `_meta` of every tools/call: {"idempotency_key", "run_id",
# "tool_call_id", "attempt", "correlation_id"}. The prefix is the package's name, one label:
# valid and never reserved under MCP's rules for `_meta` keys, and a name the project holds,
# where a reverse-DNS prefix would name a domain it does not (docs/mcp.md, "The _meta key").
# Server authors read it by this exact string: it is part of the wire, changed never lightly.
META_KEY = "agent-outbox/call"
DEFAULT_MAX_CONCURRENCY = 16  # calls in flight per server per relay process
NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64  # OpenAI's limit on a function name
Tier = Literal["low", "medium", "high"]


class Override(BaseModel):
    """The operator's mode and tier for one tool, over what annotations would give."""

    model_config = ConfigDict(extra="forbid")

    idempotency_mode: Literal["key", "none"] | None = None
    risk_tier: Tier | None = None


class ServerSpec(BaseModel):
    """An MCP server to register: ``url`` (streamable HTTP) or ``command`` (stdio)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")
    tenant_id: str = "*"
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    credential_ref: str | None = None
    trusted: bool = False
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,40}$")
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    settle_s: float | None = Field(default=None, ge=0, le=3600)  # None: registry.settle_default
    deadline_s: float | None = Field(default=None, gt=0, le=604800)
    max_attempts: int = Field(default=5, gt=0, le=100)
    max_concurrency: int = Field(default=DEFAULT_MAX_CONCURRENCY, gt=0, le=10_000)
    overrides: dict[str, Override] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("give the server's --url (streamable HTTP) or its --command (stdio)")
        if self.url is not None:
            problem = url_problem(self.url)
            if problem:
                raise ValueError(f"url: {problem}")
        if self.command is not None and not self.command:
            raise ValueError("command: give the program to start and its arguments")
        if self.env and self.command is None:
            raise ValueError("env is for a stdio server (--command); an HTTP server has its own")
        if self.headers and self.url is None:
            raise ValueError("headers are for an HTTP server (--url)")
        if self.settle_s is None:
            self.settle_s = registry.settle_default(self.timeout_s)
        return self

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"


def parse_command(text: str) -> list[str]:
    """A ``--command`` as its words (shell quoting, no shell)."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise InvalidInput(f"--command {text!r}: {err}", hint="quote as a shell would") from err
    if not words:
        raise InvalidInput("--command is empty", hint="give the program and its arguments")
    return words


def tool_name(prefix: str, remote: str) -> str:
    """The registry name of the server's tool ``remote``: ``PREFIX__remote``, with what a
    function name may not hold replaced by ``_``, cut to 64 with a digest of the whole
    when longer (two long names then still differ)."""
    name = NAME_CHARS.sub("_", f"{prefix}__{remote}")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{prefix}__{remote}".encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def from_annotations(annotations: dict[str, Any] | None, trusted: bool) -> tuple[str, Tier]:
    """(idempotency mode, risk tier) of a tool: from its annotations only if the server is
    trusted (docs/mcp.md has the table), else ``none`` and ``high``."""
    hints = annotations or {}
    if not trusted:
        return "none", "high"
    if hints.get("readOnlyHint") is True:
        return "key", "low"
    if hints.get("idempotentHint") is True:
        return "key", "high" if hints.get("destructiveHint", True) else "medium"
    return "none", "high"


def tool_specs(
    server: Row, listed: list[dict[str, Any]]
) -> tuple[list[registry.ToolSpec], list[Row]]:
    """The registry versions the listed tools make (``listed``: the ``tools/list`` entries
    as JSON), and the tools skipped, each with why: ``{"server", "tool", "problem"}``."""
    specs: list[registry.ToolSpec] = []
    skipped: list[Row] = []
    overrides = server.get("overrides") or {}
    seen: dict[str, str] = {}
    for tool in listed:
        remote = str(tool.get("name", ""))
        name = tool_name(server["prefix"], remote)
        mode, tier = from_annotations(tool.get("annotations"), server["trusted"])
        chosen = Override.model_validate(overrides.get(remote) or {})
        if name in seen:
            skipped.append(_skip(server, remote, f"its name {name} is {seen[name]}'s too"))
            continue
        problem = schema_problem(tool.get("inputSchema"))
        if problem is not None:
            skipped.append(_skip(server, remote, problem))
            continue
        try:
            spec = registry.ToolSpec(
                name=name,
                tenant_id=server["tenant_id"],
                description=str(tool.get("description") or tool.get("title") or "")[:4096],
                json_schema=tool.get("inputSchema") or {"type": "object"},
                executor="mcp",
                mcp_server=server["name"],
                mcp_tool=remote,
                annotations=tool.get("annotations") or {},
                credential_ref=server.get("credential_ref"),
                timeout_s=server["timeout_s"],
                settle_s=server["settle_s"],
                deadline_s=server.get("deadline_s"),
                max_attempts=server["max_attempts"],
                idempotency_mode=chosen.idempotency_mode or mode,
                risk_tier=chosen.risk_tier or tier,
            )
        except ValueError as err:
            skipped.append(_skip(server, remote, _first_line(err)))
            continue
        seen[name] = remote
        specs.append(spec)
    return specs, skipped


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a listed tool's ``inputSchema`` (where in it, and what), or None
    (a tool that gives none takes any object)."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        return f"its inputSchema is not a JSON object but {type(schema).__name__}"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        at = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in err.path)
        where = f" at inputSchema{at}" if at else ""
        return f"its inputSchema is not a valid JSON Schema{where}: {err.message}"
    if schema.get("type", "object") != "object":
        return f"its inputSchema has type {schema['type']!r}; MCP tools take an object"
    return None


def _skip(server: Row, tool: str, problem: str) -> Row:
    return {"server": server["name"], "tool": tool, "problem": problem}


def _first_line(err: Exception) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in errors())
    return str(err).splitlines()[0]


# -- the registry ----------------------------------------------------------------------


def add(
    conn: psycopg.Connection[Any], spec: ServerSpec, listed: list[dict[str, Any]], actor: str
) -> Row:
    """Register ``spec`` and the tools it listed (``listed``), in the caller's transaction."""
    params = spec.model_dump()
    params.update(
        transport=spec.transport,
        prefix=spec.prefix or spec.name,
        headers=Jsonb(spec.headers),
        command=Jsonb(spec.command) if spec.command is not None else None,
        env=Jsonb(spec.env),
        overrides=Jsonb({k: v.model_dump(exclude_none=True) for k, v in spec.overrides.items()}),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        try:
            cur.execute(Q.insert_server, params)
        except psycopg.errors.UniqueViolation as err:
            raise InvalidInput(
                f"MCP server {spec.name} is already registered for tenant {spec.tenant_id}",
                hint=f"`outbox mcp sync {spec.name}` lists its tools again; "
                f"`outbox mcp remove {spec.name}` first to change how it is reached",
            ) from err
        server = cur.fetchone()
    assert server is not None
    statements.journal(
        conn,
        "mcp.server_added",
        spec.tenant_id,
        actor=actor,
        detail={"server": spec.name, "transport": spec.transport, "trusted": spec.trusted},
    )
    return {**server, **sync(conn, server, listed, actor)}


def sync(
    conn: psycopg.Connection[Any], server: Row, listed: list[dict[str, Any]], actor: str
) -> Row:
    """Register a new version of each listed tool that is new or changed, and a disabled
    version of each tool the server no longer lists; journaled (``mcp.synced``)."""
    if not listed:
        raise InvalidInput(
            f"MCP server {server['name']} lists no tools: nothing was registered or changed",
            hint="check that the server is the one meant and that it offers tools",
        )
    specs, skipped = tool_specs(server, listed)
    if not specs:
        problems = "; ".join(f"tool {s['tool']}: {s['problem']}" for s in skipped)
        raise InvalidInput(
            f"none of the {len(listed)} tools of MCP server {server['name']} can be "
            f"registered: {problems}",
            hint="the server's tools/list must give each tool a valid JSON Schema",
        )
    current = {row["name"]: row for row in newest_tools(conn, server["name"], server["tenant_id"])}
    added: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    gone: list[str] = []
    for spec in specs:
        before = current.pop(spec.name, None)
        if before is not None and before["enabled"] and _same(before, spec):
            unchanged.append(spec.name)
            continue
        row = registry.register(conn, spec)
        (changed if before is not None else added).append(f"{row['name']} v{row['version']}")
    for before in current.values():
        if not before["enabled"]:
            continue
        spec = registry.ToolSpec(
            **{k: before[k] for k in (*SAME_FIELDS, "name", "tenant_id", "max_attempts")},
            executor="mcp",
            credential_ref=before["credential_ref"],
            enabled=False,
        )
        row = registry.register(conn, spec)
        gone.append(f"{row['name']} v{row['version']}")
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.synced, {"tenant_id": server["tenant_id"], "name": server["name"]})
    report = {
        "added": added,
        "changed": changed,
        "unchanged": unchanged,
        "disabled": gone,
        "skipped": skipped,
    }
    statements.journal(
        conn,
        "mcp.synced",
        server["tenant_id"],
        actor=actor,
        detail={"server": server["name"], **report},
    )
    return report


SAME_FIELDS = (
    "description",
    "json_schema",
    "mcp_server",
    "mcp_tool",
    "annotations",
    "timeout_s",
    "settle_s",
    "deadline_s",
    "idempotency_mode",
    "risk_tier",
)


def _same(row: Row, spec: registry.ToolSpec) -> bool:
    return all(row[field] == getattr(spec, field) for field in SAME_FIELDS) and (
        row["credential_ref"] == spec.credential_ref
    )


def configure(
    conn: psycopg.Connection[Any],
    name: str,
    tenant_id: str,
    *,
    trusted: bool | None,
    overrides: dict[str, Override],
    actor: str,
    deadline: tuple[float | None] | None = None,
) -> Row:
    """Trust the server's annotations or not, set the operator's mode and tier of some of
    its tools, and (``deadline``: a 1-tuple of the seconds, or of None for none) their
    deadline; the tools it last listed get new versions where that changes them (nothing is
    asked of the server: their schemas and annotations are the registry's)."""
    if deadline is not None and deadline[0] is not None and not 0 < deadline[0] <= 604800:
        raise InvalidInput(
            f"a deadline of {deadline[0]} s is out of range",
            hint="give seconds above 0 and up to 604800 (a week), or --no-deadline",
        )
    server = get(conn, name, tenant_id)
    merged = dict(server["overrides"] or {})
    for tool, override in overrides.items():
        merged[tool] = {**merged.get(tool, {}), **override.model_dump(exclude_none=True)}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            Q.configure_server,
            {
                "name": name,
                "tenant_id": tenant_id,
                "trusted": trusted,
                "overrides": Jsonb(merged),
                "set_deadline": deadline is not None,
                "deadline_s": None if deadline is None else deadline[0],
            },
        )
        updated = cur.fetchone()
    assert updated is not None
    server = updated
    listed = [
        {
            "name": row["mcp_tool"],
            "description": row["description"],
            "inputSchema": row["json_schema"],
            "annotations": row["annotations"],
        }
        for row in newest_tools(conn, name, tenant_id)
        if row["enabled"]
    ]
    statements.journal(
        conn,
        "mcp.server_configured",
        tenant_id,
        actor=actor,
        detail={
            "server": name,
            "trusted": server["trusted"],
            "overrides": merged,
            "deadline_s": server["deadline_s"],
        },
    )
    return {**server, **sync(conn, server, listed, actor)}


def newest_tools(conn: psycopg.Connection[Any], server: str, tenant_id: str) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.server_tools, {"server": server, "tenant_id": tenant_id})
        return cur.fetchall()


def get(conn: psycopg.Connection[Any], name: str, tenant_id: str = "*") -> Row:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.get_server, {"name": name, "tenant_id": tenant_id})
        row = cur.fetchone()
    if row is None:
        scope = "shared" if tenant_id == "*" else f"of tenant {tenant_id}"
        raise NotFound(
            f"no MCP server {name!r} ({scope}) is registered", hint="`outbox mcp list` shows them"
        )
    return row


def list_servers(conn: psycopg.Connection[Any]) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.list_servers)
        return cur.fetchall()


def remove(conn: psycopg.Connection[Any], name: str, tenant_id: str, actor: str) -> Row:
    """Remove the server; every version of its tools is disabled (a call planned with one
    is answered "disabled"; one already queued ends with an error result saying why)."""
    server = get(conn, name, tenant_id)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.remove_server, {"name": name, "tenant_id": tenant_id})
        disabled = [row["name"] for row in cur.fetchall()]
    statements.journal(
        conn,
        "mcp.server_removed",
        tenant_id,
        actor=actor,
        detail={"server": name, "disabled_tools": sorted(set(disabled))},
    )
    return {**server, "disabled_tools": sorted(set(disabled))}


def credential_row(conn: psycopg.Connection[Any], ref: str, tenant_id: str) -> Row | None:
    """The credential ``ref`` of ``tenant_id`` (else the default), as the relay's claim gives
    it to ``outbox.credentials.resolve``: for listing a server's tools as the relay would."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.credential_row, {"name": ref, "tenant_id": tenant_id})
        return cur.fetchone()


def public(server: Row) -> Row:
    """A server row to show: header and environment values left out (they may be secrets)."""
    shown = dict(server)
    shown["headers"] = sorted((server.get("headers") or {}).keys())
    shown["env"] = sorted((server.get("env") or {}).keys())
    return shown
