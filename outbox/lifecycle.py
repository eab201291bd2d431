"""The end of a run, and what comes from outside it: cancel, expiry, client outputs, a
waiting run's next turn retargeted, imports.

Every function takes the caller's connection or Session and never commits, like the
writer. Ending a run always goes through ``writer.end_run``: rows nobody holds are dropped
(no new claims), every call of an undelivered batch gets a tool message at once (its
result, or an explicit error), and whatever is still in flight lands in
``orphaned_results`` when it finishes. So a thread is replayable the moment its run ends,
and a new run can start on it.

Cancelling and client outputs have one implementation each, the SQL functions
``cancel_run_v1`` and ``submit_tool_outputs_v1`` in ``sql/runs.sql`` and ``sql/results.sql``, which
backends without Python call directly; the functions here are calls of ``outbox.calls``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox import calls, history, tenancy
from outbox.errors import InvalidInput, InvalidTransition, NotFound
from outbox.schemas import Retarget
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal, pg
from outbox.writer import (
    ThreadRef,
    append_message,
    arguments_hash,
    create_thread,
    end_run,
    idempotency_key,
    lock_run,
    run_call,
)

Q = queries("lifecycle.sql")


def cancel_run(
    db: Any, run_id: uuid.UUID, tenant_id: str | None = None, *, actor: str | None = None
) -> Row:
    """Cancel a run: no new claims; in-flight calls finish and their results are orphaned.

    One call of ``cancel_run_v1`` (sql/runs.sql). Without ``tenant_id`` (an
    operator), the run's own tenant. ``InvalidTransition`` when the run already ended.
    """
    if tenant_id is None:
        rows = run_call(db, calls.run_tenant(run_id))
        tenant_id = calls.found_run(rows[0] if rows else None, run_id, None)["tenant_id"]
    (row,) = run_call(db, calls.cancel_run(run_id, tenant_id, actor))
    return row


def expire_due_runs(db: Any, limit: int = 100) -> list[Row]:
    """Expire runs left in ``requires_action`` past their deadline; returns them."""
    conn = pg(db)
    expired = []
    for due in fetch_all(conn, Q.due_expiries, {"limit": limit}):
        run = lock_run(conn, due["id"], None)
        error = "no tool outputs were submitted before the deadline"
        expired.append(end_run(conn, run, "expired", "expired", error))
    return expired


def pending_client_calls(db: Any, run_id: uuid.UUID) -> list[Row]:
    """The client-executed calls a run is waiting for (what to submit outputs for)."""
    return run_call(db, calls.pending_client_calls(run_id))


OUTPUTS_HINT = (
    'send [{"tool_call_id": "...", "output": ...} | {"tool_call_id": "...", "error": "..."}]'
)


def submit_tool_outputs(
    db: Any, tenant_id: str, run_id: uuid.UUID, outputs: list[dict[str, Any]]
) -> str:
    """Record the outputs of client-executed calls; returns the run's status afterwards.

    ``outputs`` is ``[{"tool_call_id": ..., "output": <JSON>}`` or ``{..., "error": text}]``.
    All or nothing: unknown ids, ids of another run or of relay-run tools, or a set that
    leaves a waiting call unanswered raise ``InvalidInput`` and change nothing (your
    transaction stays usable). The same outputs again are a no-op, also after the run
    ended. Outputs submitted after the run's deadline (by the database clock, whether or
    not a sweep expired the run yet) are refused: kept in ``orphaned_results`` (reason
    ``deadline_passed``), and the status returned is ``expired``. Outputs for a run that
    already ended go to ``orphaned_results`` (reason ``run_ended``).
    """
    if not isinstance(outputs, list):
        raise InvalidInput(
            f"outputs must be a JSON list, not {type(outputs).__name__}",
            hint=OUTPUTS_HINT,
        )
    for output in outputs:
        if not isinstance(output, dict) or not isinstance(output.get("tool_call_id"), str):
            raise InvalidInput(
                f"each output is an object with a tool_call_id, not {output!r:.200}",
                hint=OUTPUTS_HINT,
            )
    # calls.submit_tool_outputs refuses what cannot be stored (outbox.storable) or is too big
    (row,) = run_call(db, calls.submit_tool_outputs(tenant_id, run_id, outputs))
    return str(row["status"])


def retarget_run(db: Any, change: Retarget, *, actor: str | None = None) -> bool:
    """Change what a run waiting for client outputs sends its model from its next turn on:
    its model, the tools it may call, its instructions and its model options, together.

    What a client that carries a run on asks (the OpenAI Agents SDK after a handoff: the
    next agent's tools and instructions) applies to the turns its request starts. Only a
    run in ``requires_action`` can change (``InvalidTransition`` otherwise): no model turn
    of it is queued or in flight, so every turn is asked and recorded with one set of
    tools. Tools the run named before keep the versions it pinned; a tool new to it is
    pinned now, as ``start_run_v1`` pins (the tenant's own before a shared one, the
    newest); an unknown tool raises ``NotFound`` and a model without a price for a run
    with a budget in money ``InvalidInput``, and nothing changes (``Retarget`` itself
    refuses a ``tool_choice`` forcing a function that is not one of its tools). Journaled as
    ``run.retargeted`` naming what changed; the same settings again change nothing and
    journal nothing. Returns whether anything changed. Takes the caller's connection or
    Session and never commits.
    """
    conn = pg(db)
    tenancy.scope(conn, change.tenant_id)
    run = lock_run(conn, change.run_id, change.tenant_id)
    if run["status"] != "requires_action":
        raise InvalidTransition(
            f"run {change.run_id} is {run['status']}: only a run waiting for client outputs "
            "(requires_action) can change its model, tools or instructions",
            hint="change them when the run waits for your outputs, or start a new run",
        )
    options = change.model_options.stored()
    wanted: dict[str, Any] = {
        "model": change.model,
        "tool_names": sorted(change.tools),
        "instructions": change.instructions,
        "model_options": options,
    }
    now = {**run, "tool_names": sorted(run["tool_names"])}  # their order means nothing
    changed = [field for field, value in wanted.items() if now[field] != value]
    if not changed:
        return False
    pins = {
        row["name"]: row["pin"]
        for row in fetch_all(
            conn, Q.retarget_pins, {"run_id": change.run_id, "tools": list(change.tools)}
        )
    }
    missing = sorted(name for name, pin in pins.items() if pin is None)
    if missing:
        raise NotFound(
            f"unknown tools {missing}: they are not in the tool registry",
            hint="register them first (`outbox tools register`)",
        )
    if (
        run["max_cost"] is not None
        and change.model != run["model"]
        and fetch_one(conn, Q.model_price, {"model": change.model}) is None
    ):
        raise InvalidInput(
            f"run {change.run_id} has a budget in money and model {change.model!r} has no price",
            hint="set it with `outbox prices set MODEL --input X --output Y`",
        )
    added = {name: pin for name, pin in pins.items() if name not in run["tool_pins"]}
    conn.execute(
        Q.retarget_run,
        {
            **wanted,
            "run_id": change.run_id,
            "model_options": Jsonb(options),
            "pins": Jsonb({**run["tool_pins"], **added}),
        },
    )
    journal(
        conn,
        "run.retargeted",
        change.tenant_id,
        thread_id=run["thread_id"],
        run_id=change.run_id,
        correlation_id=run["correlation_id"],
        actor=actor,
        detail={
            "changed": changed,
            "model": change.model,
            "tools": list(change.tools),
            "tool_versions": added,
            "model_options": options,
        },
    )
    return True


def import_thread(
    db: Any, tenant_id: str, messages: list[dict[str, Any]], *, title: str | None = None
) -> tuple[ThreadRef, history.Repair]:
    """Import a conversation given as OpenAI chat-format messages.

    A message may carry ``reasoning``: the Responses API reasoning items that came before
    it, kept verbatim and replayed before it to a model of that API.

    A repair pass first drops tool results that answer no earlier call and closes calls
    left unanswered with an explicit error output; the counts are journaled. Tool calls get
    real intents (owned by a completed run named ``import``), so the stored history keeps
    its foreign keys: every tool message references the call it answers.
    """
    conn = pg(db)
    tenancy.scope(conn, tenant_id)
    _check_shape(messages)
    fixed, report = history.repair(messages, reason="missing in the imported history")
    thread = create_thread(conn, tenant_id, title=title)
    steps = sum(1 for m in fixed if m["role"] == "assistant" and m.get("tool_calls"))
    run = fetch_one(
        conn,
        Q.insert_import_run,
        {
            "tenant_id": tenant_id,
            "thread_id": thread.id,
            "correlation_id": uuid.uuid4().hex,
            "steps": steps,
        },
    )
    assert run is not None
    calls: dict[str, int] = {}
    step = 0
    for message in fixed:
        if message["role"] == "tool":
            append_message(
                conn,
                thread.id,
                tenant_id,
                "tool",
                _text(message.get("content")),
                run_id=run["id"],
                tool_call_ref=calls[message["tool_call_id"]],
                reasoning=message.get("reasoning"),
            )
            continue
        message_id = append_message(
            conn,
            thread.id,
            tenant_id,
            message["role"],
            _text(message.get("content")),
            reasoning=message.get("reasoning"),
        )
        if message["role"] == "assistant" and message.get("tool_calls"):
            step += 1
            calls.update(_import_batch(conn, run, message_id, step, message["tool_calls"]))
    journal(
        conn,
        "thread.imported",
        tenant_id,
        thread_id=thread.id,
        run_id=run["id"],
        detail={"messages": len(messages), **report.as_detail()},
    )
    return thread, report


def _import_batch(
    conn: psycopg.Connection[Any], run: Row, message_id: int, step: int, calls: list[Any]
) -> dict[str, int]:
    batch = fetch_one(
        conn,
        Q.insert_batch,
        {
            "tenant_id": run["tenant_id"],
            "run_id": run["id"],
            "thread_id": run["thread_id"],
            "step_no": step,
            "message_id": message_id,
            "size": len(calls),
            "pending": 0,
        },
    )
    assert batch is not None
    conn.execute(Q.batch_delivered, {"batch_id": batch["id"]})
    refs: dict[str, int] = {}
    for position, call in enumerate(calls):
        arguments = call["function"].get("arguments") or "{}"
        row = fetch_one(
            conn,
            Q.insert_tool_call,
            {
                "tenant_id": run["tenant_id"],
                "run_id": run["id"],
                "thread_id": run["thread_id"],
                "batch_id": batch["id"],
                "message_id": message_id,
                "position": position,
                "tool_call_id": call["id"],
                "tool_name": call["function"]["name"],
                "tool_version": None,
                "arguments": None,
                "arguments_raw": arguments,
                "arguments_hash": arguments_hash(call["function"]["name"], arguments),
                "executor": "none",
                "idempotency_mode": None,
                "idempotency_key": idempotency_key(run["id"], call["id"]),
                "status": "succeeded",
            },
        )
        assert row is not None
        refs[call["id"]] = int(row["id"])
    return refs


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return json.dumps(content)


def _check_shape(messages: list[dict[str, Any]]) -> None:
    if not isinstance(messages, list):
        raise InvalidInput("an imported conversation is a JSON list of messages")
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "user", "assistant", "tool"):
            raise InvalidInput(
                f"message {index} has role {role!r}",
                hint="roles are system, user, assistant and tool (OpenAI chat format)",
            )
        call_id = message.get("tool_call_id")
        if role == "tool" and not (isinstance(call_id, str) and call_id):
            raise InvalidInput(f"tool message {index} has no tool_call_id")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
            raise InvalidInput(
                f"the tool_calls of message {index} are not a list of calls, each with an id "
                "and a function name",
                hint='write [{"id": "call_1", "function": {"name": "...", "arguments": "{}"}}]',
            )


def _is_call(call: Any) -> bool:
    """A tool call in OpenAI chat format: a text id, a function with a text name and text
    (or no) arguments."""
    if not isinstance(call, dict):
        return False
    function = call.get("function")
    return (
        isinstance(call.get("id"), str)
        and bool(call["id"])
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and bool(function["name"])
        and isinstance(function.get("arguments"), str | None)
    )
