"""Assistants and the tools a caller declares: what ``outbox serve`` keeps beside our runs.

The Assistants protocol starts a run from an assistant (model, instructions, tools) and
lets the caller declare function tools. A declared function whose name is a tool of our
registry (an http or python tool, shared or the tenant's own) runs through the relay,
durably, with the registry's schema; any other declared function becomes a *client* tool
of the caller's tenant (a registry version of its own, added only when its schema or
description changed), so the run waits in ``requires_action`` for its output. Like the
writer, every function runs on the caller's connection and never commits.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from outbox import registry, tenancy
from outbox.errors import ActiveRunExists, InvalidInput, InvalidTransition, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal

Q = queries("assistants.sql")


def create_assistant(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    *,
    model: str,
    name: str | None = None,
    description: str | None = None,
    instructions: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Row:
    """Store an assistant of ``tenant_id``; its tools are checked as a run would check them."""
    tenancy.scope(conn, tenant_id)
    check_tools(tools or [])
    row = fetch_one(
        conn,
        Q.insert_assistant,
        {
            "tenant_id": tenant_id,
            "name": name,
            "description": description,
            "model": model,
            "instructions": instructions,
            "tools": Jsonb(tools or []),
            "metadata": Jsonb(metadata or {}),
        },
    )
    assert row is not None
    journal(conn, "assistant.created", tenant_id, detail={"assistant_id": str(row["id"])})
    return row


def get_assistant(conn: psycopg.Connection[Any], tenant_id: str, assistant_id: uuid.UUID) -> Row:
    """The tenant's assistant; ``NotFound`` for another tenant's, as for a missing one."""
    tenancy.scope(conn, tenant_id)
    row = fetch_one(conn, Q.get_assistant, {"id": assistant_id})
    if row is None:
        raise NotFound(f"No assistant found with id '{assistant_id}'.")
    return row


def modify_assistant(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    assistant_id: uuid.UUID,
    changes: dict[str, Any],
) -> Row:
    """Change the fields named in ``changes`` (``model``, ``name``, ``description``,
    ``instructions``, ``tools``, ``metadata``); a field left out keeps its value, and
    ``name``, ``description`` and ``instructions`` may be set to None. Runs already started
    keep what they started with. ``NotFound`` as for ``get_assistant``."""
    tenancy.scope(conn, tenant_id)
    unknown = set(changes) - {"model", "name", "description", "instructions", "tools", "metadata"}
    if unknown:
        raise InvalidInput(f"an assistant has no field {sorted(unknown)[0]!r}")
    if changes.get("model", "") is None:
        raise InvalidInput("model cannot be removed from an assistant")
    if changes.get("tools") is not None:
        check_tools(changes["tools"])
    params: dict[str, Any] = {"id": assistant_id, "model": changes.get("model")}
    for field in ("name", "description", "instructions"):
        params[f"set_{field}"] = field in changes
        params[field] = changes.get(field)
    for field in ("tools", "metadata"):
        given = changes.get(field)
        params[field] = None if given is None else Jsonb(given)
    row = fetch_one(conn, Q.update_assistant, params)
    if row is None:
        raise NotFound(f"No assistant found with id '{assistant_id}'.")
    journal(
        conn,
        "assistant.modified",
        tenant_id,
        detail={"assistant_id": str(assistant_id), "fields": sorted(changes)},
    )
    return row


def delete_assistant(
    conn: psycopg.Connection[Any], tenant_id: str, assistant_id: uuid.UUID
) -> None:
    """Delete the tenant's assistant. Its runs, their tools and history stay; they no
    longer name it. ``NotFound`` as for ``get_assistant``."""
    tenancy.scope(conn, tenant_id)
    if fetch_one(conn, Q.delete_assistant, {"id": assistant_id}) is None:
        raise NotFound(f"No assistant found with id '{assistant_id}'.")
    journal(conn, "assistant.deleted", tenant_id, detail={"assistant_id": str(assistant_id)})


def modify_thread(
    conn: psycopg.Connection[Any], tenant_id: str, thread_id: uuid.UUID, metadata: dict[str, Any]
) -> Row:
    """Replace a thread's metadata (all the Assistants protocol lets a caller change of a
    thread); ``NotFound`` for another tenant's thread, as for a missing one."""
    tenancy.scope(conn, tenant_id)
    row = fetch_one(conn, Q.update_thread_metadata, {"id": thread_id, "metadata": Jsonb(metadata)})
    if row is None:
        raise NotFound(f"No thread found with id '{thread_id}'.")
    journal(
        conn, "thread.modified", tenant_id, thread_id=thread_id, detail={"fields": ["metadata"]}
    )
    return row


def delete_thread(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    thread_id: uuid.UUID,
    *,
    actor: str | None = None,
    correlation_id: str | None = None,
) -> None:
    """Delete a thread (a conversation) as OpenAI's protocols do: from now on the API
    answers 404 for it, its messages, runs and responses, and no run starts on it. Every
    row stays, with ``deleted_at``: the messages, runs, tool calls and journal are the
    audit record. A thread with an active run raises ``ActiveRunExists`` (cancel the run
    first); ``NotFound`` for another tenant's thread, a missing or an already deleted one.
    Journaled as ``thread.deleted`` with ``actor`` and ``correlation_id``."""
    _lock_idle_thread(conn, tenant_id, thread_id)
    fetch_one(conn, Q.delete_thread, {"id": thread_id})
    journal(
        conn,
        "thread.deleted",
        tenant_id,
        thread_id=thread_id,
        actor=actor,
        correlation_id=correlation_id,
    )


def delete_message(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    thread_id: uuid.UUID,
    message_id: int,
    *,
    actor: str | None = None,
    correlation_id: str | None = None,
) -> None:
    """Delete a user or assistant message of a thread: the API no longer shows it and no
    later run replays it; the row stays, with ``deleted_at``. Only a message whose removal
    keeps the history well-formed (docs/guarantees.md, invariant 7): a tool result, or an
    assistant message that carries tool calls, raises ``InvalidTransition`` (the database refuses it
    too). ``ActiveRunExists`` while a run of the thread is active (the run replays the
    history as it goes); ``NotFound`` for a missing, deleted or hidden message or thread.
    Journaled as ``message.deleted``."""
    _lock_idle_thread(conn, tenant_id, thread_id)
    row = fetch_one(conn, Q.message_to_delete, {"message_id": message_id, "thread_id": thread_id})
    if row is None or row["role"] not in ("user", "assistant") or row["tool_call_ref"] is not None:
        raise NotFound(f"No message found with id 'msg_{message_id}'.")
    if row["carries_calls"]:
        raise InvalidTransition(
            f"Message 'msg_{message_id}' carries tool calls and cannot be deleted: their "
            "results would be left without the call that asked for them, and no provider "
            "accepts such a history.",
            hint="delete the thread, or start a new one",
        )
    fetch_one(conn, Q.delete_message, {"message_id": message_id, "thread_id": thread_id})
    journal(
        conn,
        "message.deleted",
        tenant_id,
        thread_id=thread_id,
        run_id=row["run_id"],
        actor=actor,
        correlation_id=correlation_id,
        detail={"message_id": message_id, "role": row["role"], "seq": row["seq"]},
    )


def _lock_idle_thread(conn: psycopg.Connection[Any], tenant_id: str, thread_id: uuid.UUID) -> None:
    """Lock the tenant's thread (not deleted) and check no run of it is active. The lock
    is the one ``start_run_v1`` takes, so no run starts until this transaction ends."""
    tenancy.scope(conn, tenant_id)
    if fetch_one(conn, Q.lock_thread, {"id": thread_id}) is None:
        raise NotFound(f"No thread found with id '{thread_id}'.")
    active = fetch_one(conn, Q.active_run, {"id": thread_id})
    if active is not None:
        raise ActiveRunExists(thread_id, active["id"], active["status"])


def list_assistants(conn: psycopg.Connection[Any], tenant_id: str) -> list[Row]:
    tenancy.scope(conn, tenant_id)
    return fetch_all(conn, Q.list_assistants, {})


def check_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """The declared tools' functions (``{"name", "description", "parameters"}``);
    ``InvalidInput`` for anything but function tools with a valid name."""
    if not isinstance(tools, list):
        raise InvalidInput("tools must be a list of tools")
    functions = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidInput(
                f"tools[{index}]: only function tools are supported, not {kind!r}",
                hint="declare {'type': 'function', 'function': {'name': ..., 'parameters': ...}}",
            )
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidInput(f"tools[{index}].function needs a name")
        functions.append(function)
    return functions


def declare_tools(conn: psycopg.Connection[Any], tenant_id: str, tools: list[Any]) -> list[str]:
    """The registry names a run with these declared ``tools`` may call (see the module's
    docstring); registers client tools of ``tenant_id`` where needed."""
    functions = check_tools(tools)
    known = registry.resolve(conn, tenant_id, [f["name"] for f in functions])
    for function in functions:
        found = known.get(function["name"])
        if found is not None and found["executor"] != "client":
            continue  # a registered tool: the relay runs it
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        description = function.get("description") or ""
        if (
            found is not None
            and found["tenant_id"] == tenant_id
            and found["json_schema"] == schema
            and found["description"] == description
        ):
            continue
        try:
            spec = registry.ToolSpec(
                name=function["name"],
                tenant_id=tenant_id,
                executor="client",
                json_schema=schema,
                description=description,
            )
        except ValidationError as err:
            problem = "; ".join(str(e["msg"]) for e in err.errors())
            raise InvalidInput(f"function {function['name']!r}: {problem}") from err
        _register_once(conn, spec)
    return [f["name"] for f in functions]


def _register_once(conn: psycopg.Connection[Any], spec: registry.ToolSpec) -> None:
    """Register ``spec``; when a concurrent request registered the same version first, its
    version stands (under a savepoint, so the caller's transaction goes on)."""
    try:
        with conn.transaction():  # a savepoint: the caller's transaction is open
            registry.register(conn, spec)
    except InvalidInput:
        known = registry.resolve(conn, spec.tenant_id, [spec.name]).get(spec.name)
        if known is None or known["executor"] != "client":
            raise


def link_run(
    conn: psycopg.Connection[Any],
    run: Row,
    assistant_id: uuid.UUID | None,
    tools: list[Any],
    metadata: dict[str, Any] | None,
) -> None:
    """Keep a run's assistant, declared tools and metadata (in the run's transaction)."""
    conn.execute(
        Q.link_run,
        {
            "run_id": run["id"],
            "tenant_id": run["tenant_id"],
            "assistant_id": assistant_id,
            "tools": Jsonb(tools),
            "metadata": Jsonb(metadata or {}),
        },
    )
