"""The tool registry: what each tool is, how it is reached, and how it treats retries.

A tool is registered as a numbered version (a new registration never changes what an
in-flight call was planned against). Its ``executor`` says who runs it: ``http`` (the relay
POSTs the arguments to ``endpoint``), ``client`` (the backend runs it and submits the output),
``python`` (an in-process callable named by import path) or ``mcp`` (the relay calls tool
``mcp_tool`` of the registered MCP server ``mcp_server``: ``outbox.mcpservers``). Its
``idempotency_mode`` says what a retry after an ambiguous attempt may do: ``key`` (the tool honours
``Idempotency-Key``: retry with the same key), ``lookup`` (ask ``lookup_endpoint`` first),
``none`` (never re-execute on a guess). ``IDEMPOTENCY_MODES`` is that table in code: the
relay's executors read it, nothing else spells out what a mode does.

``plan_call`` turns a model's tool call into a plan or into an error the model will see:
unknown tools, disabled tools and arguments that are not JSON or fail the schema never raise.
The plan carries the action layer's decision (``outbox.policy``): run, wait for approval,
or never run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, model_validator

from outbox import config, context, policy, storable
from outbox.errors import InvalidInput, NotFound
from outbox.schemas import ToolCallIn, ToolName, url_problem
from outbox.sql import queries

Q = queries("registry.sql")
Row = dict[str, Any]
ModeName = Literal["key", "lookup", "none"]


@dataclass(frozen=True)
class IdempotencyMode:
    """What a tool's idempotency mode lets the relay do with its calls (docs/guarantees.md,
    invariant 5: a non-idempotent tool is never re-run on a guess).

    ``dispatch_mark``: a mark is committed, fenced, before each attempt may reach the tool,
    so the next attempt knows the earlier one was ambiguous (an HTTP request is marked in
    every mode: it may outlive the relay that sent it, ``relay.executors``).
    ``after_ambiguous``: what the attempt after an ambiguous one (timeout after send, 5xx,
    broken connection, a worker that died mid-call) does: ``retry`` (the same key again;
    the tool dedups), ``lookup`` (ask the lookup endpoint first, call only on "not found")
    or ``unknown`` (never call again: ``outcome_unknown`` for an operator). ``in_chunks``:
    in-process calls may run many to a thread hop (``relay.inprocess``), since no mark
    must be committed before each."""

    name: str | None
    dispatch_mark: bool
    after_ambiguous: Literal["retry", "lookup", "unknown"]
    in_chunks: bool


IDEMPOTENCY_MODES: dict[str, IdempotencyMode] = {
    "key": IdempotencyMode("key", dispatch_mark=False, after_ambiguous="retry", in_chunks=True),
    "lookup": IdempotencyMode(
        "lookup", dispatch_mark=True, after_ambiguous="lookup", in_chunks=False
    ),
    "none": IdempotencyMode("none", dispatch_mark=True, after_ambiguous="unknown", in_chunks=False),
}
# A call planned without a mode (a refused call, imported history): nothing to dedup with,
# nothing run in chunks; an ambiguous attempt is simply retried.
NO_MODE = IdempotencyMode(None, dispatch_mark=False, after_ambiguous="retry", in_chunks=False)


def idempotency(mode: str | None) -> IdempotencyMode:
    """The row of ``IDEMPOTENCY_MODES`` for ``mode`` (``NO_MODE`` for a call without one)."""
    return NO_MODE if mode is None else IDEMPOTENCY_MODES[mode]


def settle_default(timeout_s: float) -> float:
    """Seconds a request may still act at the tool after the relay gave up on it, when the
    tool does not say: as long again as the relay waited for it. The timeout is what the
    tool was given to answer, so its operator's bound on how long it works; a request
    past it is already a straggler, and one that takes twice its bound is treated as
    over. A fixed number would be too long for a tool of one second and too short for
    one of minutes; a tool that knows better registers its own ``settle_s``."""
    return timeout_s


class ToolSpec(BaseModel):
    """A tool version to register."""

    model_config = ConfigDict(extra="forbid")

    name: ToolName
    tenant_id: str = "*"
    description: str = ""
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    executor: Literal["http", "client", "python", "mcp"] = "http"
    endpoint: str | None = None
    mcp_server: str | None = None
    mcp_tool: str | None = None
    annotations: dict[str, Any] | None = None  # an MCP tool's, as it listed them
    lookup_endpoint: str | None = None
    callable: str | None = None
    credential_ref: str | None = None
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # How long after the relay gave up on a request (its timeout, at the earliest) that
    # request may still act at the tool: no resend and no trusted "not found" before then
    # (``SETTLE_DEFAULT``). None: as long as ``timeout_s``.
    settle_s: float | None = Field(default=None, ge=0, le=3600)
    # The tool answers 409 to a request whose key belongs to a request it is still acting
    # on, and never acts on it (a ``key`` tool over HTTP): the relay resends at once after
    # an ambiguous attempt, where it would otherwise wait for that request to settle.
    refuses_key_in_use: bool = False
    # How long after the model asked for a call an attempt of it may still be sent (None:
    # no deadline); attempts that never reached the tool are not charged before it
    # (docs/relay.md, "Deadlines").
    deadline_s: float | None = Field(default=None, gt=0, le=604800)
    max_attempts: int = Field(default=5, gt=0, le=100)
    idempotency_mode: ModeName = "key"
    risk_tier: Literal["low", "medium", "high"] = "low"
    requires_approval: bool = False
    enabled: bool = True
    version: int | None = Field(default=None, gt=0)
    # The most bytes of a result the model is given; past it, its head and a handle that
    # read_result pages (None: the platform's default, ``context.RESULT_CAP_BYTES``; 0: none).
    model_result_cap: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _consistent(self) -> ToolSpec:
        if self.executor == "http" and not self.endpoint:
            raise ValueError("an http tool needs an endpoint URL")
        for field, url in (("endpoint", self.endpoint), ("lookup_endpoint", self.lookup_endpoint)):
            problem = None if url is None else url_problem(url)
            if problem:
                raise ValueError(f"{field}: {problem}")
        if self.executor == "python" and not self.callable:
            raise ValueError("a python tool needs a callable ('package.module:function')")
        if self.executor == "mcp" and not (self.mcp_server and self.mcp_tool):
            raise ValueError("an mcp tool needs its server and its name there (`outbox mcp add`)")
        if self.executor == "mcp" and self.idempotency_mode == "lookup":
            raise ValueError("an mcp tool has no lookup: its mode is 'key' or 'none'")
        if (
            IDEMPOTENCY_MODES[self.idempotency_mode].after_ambiguous == "lookup"
            and not self.lookup_endpoint
        ):
            # A python tool too: without somewhere to look, "lookup" would mean "call again".
            raise ValueError(
                "idempotency mode 'lookup' needs a lookup_endpoint URL (for a python tool "
                "without one, use 'key' if it tolerates running twice, else 'none')"
            )
        if self.refuses_key_in_use and (self.idempotency_mode, self.executor) != ("key", "http"):
            raise ValueError(
                "refuses_key_in_use is what a 'key' tool over HTTP may declare (a 409 for a "
                f"key in use), not a {self.idempotency_mode!r} {self.executor} tool"
            )
        if self.settle_s is None:
            self.settle_s = settle_default(self.timeout_s)
        if self.deadline_s is not None and self.executor not in ("http", "mcp"):
            raise ValueError(
                f"a deadline is for tools called over the network (http, mcp), not "
                f"{self.executor} tools: leave --deadline out"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(self.json_schema)
        except jsonschema.SchemaError as err:
            raise ValueError(f"json_schema is not a valid JSON Schema: {err.message}") from err
        return self


def register(conn: psycopg.Connection[Any], spec: ToolSpec) -> Row:
    """Register a new version of a tool (the next number unless ``spec.version`` is set)."""
    with conn.cursor(row_factory=dict_row) as cur:
        version = spec.version
        if version is None:
            cur.execute(Q.next_version, {"tenant_id": spec.tenant_id, "name": spec.name})
            found = cur.fetchone()
            assert found is not None
            version = int(found["version"])
        params = spec.model_dump()
        params.update(
            version=version,
            json_schema=Jsonb(spec.json_schema),
            annotations=None if spec.annotations is None else Jsonb(spec.annotations),
        )
        try:
            cur.execute(Q.insert_tool, params)
        except psycopg.errors.UniqueViolation as err:
            raise InvalidInput(
                f"tool {spec.name} version {version} is already registered",
                hint="omit the version to register the next one",
            ) from err
        row = cur.fetchone()
        assert row is not None
        return row


def list_tools(conn: psycopg.Connection[Any]) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.list_tools)
        return cur.fetchall()


def versions(conn: psycopg.Connection[Any], name: str, tenant_id: str = "*") -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(Q.tool_versions, {"name": name, "tenant_id": tenant_id})
        rows = cur.fetchall()
    if not rows:
        raise NotFound(f"tool {name!r} is not registered", hint="`outbox tools list` shows them")
    return rows


def resolve(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    names: list[str],
    pins: dict[str, Any] | None = None,
) -> dict[str, Row]:
    """Each named tool visible to ``tenant_id``, by name: the version ``pins`` names (a
    run's ``tool_pins``), else the newest."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            Q.tools_by_name,
            {"names": sorted(set(names)), "tenant_id": tenant_id, "pins": Jsonb(pins or {})},
        )
        return {row["name"]: row for row in cur.fetchall()}


@dataclass(frozen=True)
class ToolContext:
    """What an in-process tool may ask for, beside its arguments: a tool function with a
    keyword parameter ``outbox_context`` receives one. ``credentials`` holds only the
    secret its registration names (``credential_ref``), resolved for the call's tenant
    (``outbox.credentials``): read secrets from here, not from the relay's environment."""

    tenant_id: str
    run_id: str
    tool_call_id: str
    idempotency_key: str
    attempt: int
    credentials: dict[str, str]


@dataclass(frozen=True)
class CallPlan:
    """How a call will run, or ``error``: the text of the error result the model will see.
    ``decision`` is the risk policy's (None when the call was refused before it applied);
    ``approval`` is set when the call must wait for one."""

    executor: str
    version: int | None
    idempotency_mode: str | None
    arguments: Any
    max_attempts: int
    error: str | None
    decision: policy.Decision | None = None

    @property
    def approval(self) -> policy.Decision | None:
        if self.error is None and self.decision and self.decision.action == "approve":
            return self.decision
        return None


# ``read_result`` (``outbox.context``) as the plan of a call reads a registry row.
READ_RESULT_ROW: Row = {
    "name": context.READ_RESULT,
    "version": None,
    "json_schema": context.READ_RESULT_TOOL["json_schema"],
    "enabled": True,
    "executor": "builtin",
    "max_attempts": 5,
}


def plan_call(call: ToolCallIn, tool: Row | None, allowed: list[str]) -> CallPlan:
    """``tool`` is a row of ``resolve`` (it carries the switches and the policy of its tier
    for the run's tenant)."""

    def refuse(
        error: str, arguments: Any = None, decision: policy.Decision | None = None
    ) -> CallPlan:
        version = tool["version"] if tool else None
        return CallPlan("none", version, None, arguments, 1, error, decision)

    if tool is None and call.name == context.READ_RESULT:
        tool = READ_RESULT_ROW  # built in, unless the registry has a tool of that name
    if tool is None:
        return refuse(f"unknown tool {call.name!r}: it is not in the tool registry")
    if tool is READ_RESULT_ROW:
        allowed = []  # offered to any run whose model is given a result past its cap
    if allowed and call.name not in allowed:
        return refuse(f"tool {call.name!r} is not available in this run (allowed: {allowed})")
    if tool.get("switched_by") is not None:
        return refuse(
            policy.switch_text(
                call.name, tool["switch_tenant"], tool["switched_by"], tool["switch_reason"]
            )
        )
    if not tool["enabled"]:
        return refuse(f"tool {call.name!r} v{tool['version']} is disabled; {policy.NOT_EXECUTED}")
    if call.arguments_over_cap_bytes is not None:
        return refuse(
            f"arguments for {call.name!r} are {call.arguments_over_cap_bytes} bytes, over the "
            f"cap of {config.MAX_PAYLOAD_BYTES} bytes: the call was not executed and its "
            "arguments were not kept; send smaller arguments (store large data elsewhere "
            "and pass a reference)"
        )
    try:
        arguments = storable.loads(call.arguments, f"arguments for {call.name!r}")
    except storable.NotStorable as err:
        return refuse(f"arguments for {call.name!r} are not storable JSON: {err.problem}")
    except ValueError as err:
        return refuse(f"arguments for {call.name!r} are not valid JSON: {err}")
    problem = schema_problem(tool["json_schema"], arguments)
    if problem:
        return refuse(
            f"arguments for {call.name!r} v{tool['version']} do not match its schema: {problem}",
            arguments,
        )
    if tool is READ_RESULT_ROW:
        # A read of the call's own thread by the relay: no side effect, nothing to approve.
        decision = policy.Decision("allow", "built-in read-only tool")
        return CallPlan("builtin", None, "key", arguments, tool["max_attempts"], None, decision)
    decision = policy.decide(tool)
    if decision.action == "deny":
        return refuse(policy.denied_text(call.name, decision), arguments, decision)
    if decision.action == "approve" and tool["executor"] == "client":
        # The backend runs a client tool itself: its own review is the approval.
        decision = policy.Decision("allow", f"{decision.rule} (client tool: the backend decides)")
    return CallPlan(
        tool["executor"],
        tool["version"],
        tool["idempotency_mode"],
        arguments,
        tool["max_attempts"],
        None,
        decision,
    )


def schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    """The first JSON-Schema violation as readable text, or None."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"at {where}: {error.message}"
