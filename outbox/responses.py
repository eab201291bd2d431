"""Responses of OpenAI's Responses protocol: what ``outbox serve`` keeps beside our runs.

A response is a stretch of a run: the run its request started, or the same run carried on
when a request answered the run's client function calls. Its output is read from the run's
messages from ``output_from_seq`` (the thread's next position when the response began) up
to where the run's next response begins. A conversation is a thread. Like the writer,
these functions run on the caller's connection and never commit.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox import tenancy
from outbox.errors import ActiveRunExists, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_one, journal

Q = queries("responses.sql")


def record_response(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    *,
    run_id: uuid.UUID,
    thread_id: uuid.UUID,
    model: str,
    input_items: list[dict[str, Any]],
    previous_response_id: uuid.UUID | None = None,
    in_conversation: bool = False,
    instructions: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    background: bool = False,
    model_options: dict[str, Any] | None = None,
    output_from_seq: int | None = None,
) -> Row:
    """Record a response; its output starts at ``output_from_seq``, by default the
    thread's next position, read by the statement that records it."""
    tenancy.scope(conn, tenant_id)
    row = fetch_one(
        conn,
        Q.insert_response,
        {
            "tenant_id": tenant_id,
            "run_id": run_id,
            "thread_id": thread_id,
            "previous_response_id": previous_response_id,
            "in_conversation": in_conversation,
            "output_from_seq": output_from_seq,
            "input": Jsonb(input_items),
            "model": model,
            "instructions": instructions,
            "tools": Jsonb(tools or []),
            "metadata": Jsonb(metadata or {}),
            "background": background,
            "model_options": Jsonb(model_options or {}),
        },
    )
    assert row is not None
    return row


def get_response(conn: psycopg.Connection[Any], tenant_id: str, response_id: uuid.UUID) -> Row:
    """The tenant's response; ``NotFound`` for another tenant's, as for a missing one."""
    tenancy.scope(conn, tenant_id)
    row = fetch_one(conn, Q.get_response, {"id": response_id})
    if row is None:
        raise NotFound(f"Response with id 'resp_{response_id.hex}' not found.")
    return row


def delete_response(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    response_id: uuid.UUID,
    *,
    actor: str | None = None,
    correlation_id: str | None = None,
) -> None:
    """Delete a response as OpenAI's protocol does: the API answers 404 for it from now on
    (it can no longer be a ``previous_response_id``); the row stays, with ``deleted_at``,
    and so do the conversation's items, the history runs replay. A response still going
    (its run active and this its newest response: queued, in progress, or waiting for the
    caller's function call outputs) raises ``ActiveRunExists``: cancel it or let it end
    first. ``NotFound`` as for ``get_response``, and for a deleted one. Journaled as
    ``response.deleted``."""
    row = get_response(conn, tenant_id, response_id)
    run = fetch_one(conn, Q.run_status, {"run_id": row["run_id"]})
    assert run is not None
    if run["active"] and output_until(conn, row) is None:
        raise ActiveRunExists(row["thread_id"], row["run_id"], run["status"])
    if fetch_one(conn, Q.delete_response, {"id": response_id}) is None:  # a twin won
        raise NotFound(f"Response with id 'resp_{response_id.hex}' not found.")
    journal(
        conn,
        "response.deleted",
        tenant_id,
        thread_id=row["thread_id"],
        run_id=row["run_id"],
        actor=actor,
        correlation_id=correlation_id,
        detail={"response_id": str(response_id)},
    )


def latest_of_thread(conn: psycopg.Connection[Any], thread_id: uuid.UUID) -> Row | None:
    return fetch_one(conn, Q.latest_of_thread, {"thread_id": thread_id})


def output_until(conn: psycopg.Connection[Any], response: Row) -> int | None:
    """Where the response's output ends: the next response of its run, None for the last."""
    row = fetch_one(
        conn,
        Q.output_until,
        {"run_id": response["run_id"], "from_seq": response["output_from_seq"]},
    )
    return None if row is None else row["seq"]


def thread_position(conn: psycopg.Connection[Any], thread_id: uuid.UUID) -> int:
    """The position the thread's next message will take."""
    row = fetch_one(conn, Q.thread_position, {"thread_id": thread_id})
    if row is None:
        raise NotFound(f"thread {thread_id} does not exist")
    return int(row["next_seq"])
