"""The backend's calls as SQL statements, shared by the sync writer and the async one.

A backend starts, steers and ends runs through the versioned SQL functions
(``create_thread_v1``, ``start_run_v2`` and ``cancel_run_v1`` of ``sql/runs.sql``,
``submit_tool_outputs_v1`` of ``sql/results.sql``): they are the one implementation, for
Python and for backends without it. This module only builds each call (one statement and
its parameters), runs nothing, and turns the database's refusals (SQLSTATE and message)
into our errors. The sync writer (``outbox.writer``, ``outbox.lifecycle``) runs a call on a
psycopg ``Connection`` or a SQLAlchemy ``Session``, the async one (``outbox.aio``) on an
``AsyncConnection`` or an ``AsyncSession``: the same statements either way, so the two
cannot drift apart. Design choice: I/O apart from protocol, as psycopg keeps its
``generators.py`` apart from its waiting code, but with one statement per call there is
no generator to drive.

Each write runs under a savepoint of its own (``SAVEPOINT``/``RELEASE`` by hand, never a
psycopg ``transaction()`` block, which would commit when it opened the transaction): a
refusal (an active run, a spent budget, a bad output) leaves the caller's transaction
usable and everything it wrote before.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

from outbox import storable, trace_context
from outbox.errors import (
    ActiveRunExists,
    BudgetExceeded,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidTransition,
    NotFound,
    NotPermitted,
    OutboxError,
    WrongTenant,
)
from outbox.schemas import NewMessage, StartRun, check_size
from outbox.sql import queries

A = queries("api.sql")
Row = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One statement to run. ``scope``: the tenant to bind the transaction to first (the
    Python writer acts for the tenant it is given, as it always did; the SQL functions
    refuse a tenant other than the session's scope, which guards SQL callers);
    ``savepoint``: run under a savepoint, so that a refusal leaves the caller's transaction
    usable (writes; reads need none)."""

    query: LiteralString
    params: Row = field(default_factory=dict)
    scope: str | None = None
    savepoint: bool = True


@dataclass(frozen=True)
class ThreadRef:
    id: uuid.UUID
    tenant_id: str


@dataclass(frozen=True)
class RunRef:
    """A run as stored; ``created`` is False when an earlier identical request made it."""

    id: uuid.UUID
    thread_id: uuid.UUID
    tenant_id: str
    status: str
    correlation_id: str
    created: bool
    row: Row = field(repr=False, compare=False)


def run_ref(row: Row, created: bool) -> RunRef:
    return RunRef(
        row["id"],
        row["thread_id"],
        row["tenant_id"],
        row["status"],
        row["correlation_id"],
        created,
        row,
    )


@functools.cache
def _tenant_ids() -> Any:
    """The validator of tenant ids, built once (building it costs more than a statement)."""
    from pydantic import TypeAdapter

    from outbox.schemas import TenantId

    return TypeAdapter(TenantId)


def check_tenant(tenant_id: str) -> None:
    from pydantic import ValidationError

    try:
        _tenant_ids().validate_python(tenant_id)
    except ValidationError as err:
        raise InvalidInput(
            f"tenant id {tenant_id!r} is not valid", hint="use 1-128 letters, digits or _.:@-"
        ) from err


# -- the calls --------------------------------------------------------------------------


def create_thread(
    tenant_id: str,
    title: str | None = None,
    metadata: dict[str, Any] | None = None,
    messages: list[NewMessage] | None = None,
) -> Call:
    check_tenant(tenant_id)
    opening = [m.model_dump() for m in messages or []]
    for message in opening:
        check_size(f"{message['role']} message", message["content"])
    storable.check(metadata, "thread metadata")
    return Call(
        A.create_thread,
        {
            "tenant_id": tenant_id,
            "title": title,
            "metadata": Jsonb(metadata or {}),
            "messages": Jsonb(opening),
        },
        scope=tenant_id,
    )


def start_run(request: StartRun) -> Call:
    """``start_run_v3``; without a ``traceparent``, the run continues the span current here
    (the backend's), if there is one."""
    params = request.model_dump(exclude={"tenant_id", "thread_id", "tools", "model_options"})
    params.update(tenant_id=request.tenant_id, thread_id=request.thread_id, tools=request.tools)
    params["model_options"] = Jsonb(request.model_options.stored())
    if request.traceparent is None:
        params["traceparent"], params["tracestate"] = trace_context.caller_context()
    return Call(A.start_run, params, scope=request.tenant_id)


def cancel_run(run_id: uuid.UUID, tenant_id: str, actor: str | None) -> Call:
    return Call(
        A.cancel_run, {"tenant_id": tenant_id, "run_id": run_id, "actor": actor}, scope=tenant_id
    )


def run_tenant(run_id: uuid.UUID) -> Call:
    return Call(A.run_tenant, {"run_id": run_id}, savepoint=False)


def submit_tool_outputs(tenant_id: str, run_id: uuid.UUID, outputs: list[dict[str, Any]]) -> Call:
    for output in outputs:
        if not isinstance(output, dict) or "tool_call_id" not in output:
            raise InvalidInput(f"each output needs a tool_call_id: {output!r}")
        what = f"output of {output['tool_call_id']}"
        check_size(what, storable.dumps(output, what))
    return Call(
        A.submit_tool_outputs,
        {"tenant_id": tenant_id, "run_id": run_id, "outputs": Jsonb(outputs)},
        scope=tenant_id,
    )


def get_run(run_id: uuid.UUID, tenant_id: str | None) -> Call:
    return Call(A.get_run, {"run_id": run_id}, scope=tenant_id, savepoint=False)


def pending_client_calls(run_id: uuid.UUID) -> Call:
    return Call(A.pending_client_calls, {"run_id": run_id}, savepoint=False)


def found_run(row: Row | None, run_id: uuid.UUID, tenant_id: str | None) -> Row:
    """``row`` as the caller's run: ``NotFound`` / ``WrongTenant`` when it is not."""
    if row is None:
        raise NotFound(f"run {run_id} does not exist", hint="check the run id")
    if tenant_id is not None and row["tenant_id"] != tenant_id:
        raise WrongTenant(f"run {run_id} does not belong to tenant {tenant_id!r}")
    return row


# -- refusals ---------------------------------------------------------------------------

_BY_SQLSTATE: dict[str, type[OutboxError]] = {
    "P0002": NotFound,  # no_data_found
    "22023": InvalidInput,  # invalid_parameter_value
    "42501": WrongTenant,  # insufficient_privilege: a session scoped to another tenant
    "OB002": IdempotencyKeyReused,
    "OB003": BudgetExceeded,
    "OB004": WrongTenant,
    "OB005": InvalidTransition,
    "OB006": NotPermitted,
    "OB007": InvalidTransition,  # a message that carries tool calls cannot be deleted
    "55000": InvalidTransition,  # object_not_in_prerequisite_state: e.g. decided already
}
SAVEPOINT = "SAVEPOINT outbox_call"
RELEASE = "RELEASE SAVEPOINT outbox_call"
ROLLBACK = "ROLLBACK TO SAVEPOINT outbox_call; RELEASE SAVEPOINT outbox_call"


def refusal(err: psycopg.Error) -> OutboxError | None:
    """The error a SQL function's refusal means, or None for any other database error."""
    message = err.diag.message_primary or str(err)
    hint = err.diag.message_hint or ""
    if err.sqlstate == "OB001":  # an active run: DETAIL is {"thread_id", "run_id", "status"}
        detail = json.loads(err.diag.message_detail or "{}")
        return ActiveRunExists(
            uuid.UUID(detail["thread_id"]), uuid.UUID(detail["run_id"]), detail["status"]
        )
    kind = _BY_SQLSTATE.get(err.sqlstate or "")
    return None if kind is None else kind(message, hint=hint or None)
