"""What each endpoint does, in one transaction of the key's tenant (synchronous: the
library is; the routes call these through the thread pool).

Every state change is a call of the library (``outbox.writer``, ``outbox.lifecycle``,
``outbox.assistants``); the reads are the named queries of ``server/queries/api.sql``. A
refusal raises before the transaction commits, so nothing of a refused request is stored.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from outbox import assistants, constants, lifecycle, tenancy, writer
from outbox.errors import ActiveRunExists, InvalidTransition, NotFound
from outbox.schemas import NewMessage, StartRun
from outbox.server import idempotency, shapes
from outbox.server.bodies import (
    AssistantIn,
    MessageIn,
    RunIn,
    SubmitOutputsIn,
    ThreadAndRunIn,
    ThreadIn,
)
from outbox.server.db_pool import Q, Store
from outbox.server.errors import APIError, not_found
from outbox.statements import fetch_all, fetch_one

Row = dict[str, Any]
ACTIVE = constants.ACTIVE


@dataclass(frozen=True)
class Settings:
    """What every run started through the server gets."""

    model_base_url: str | None = None  # the runs' OpenAI-compatible server (None: the relay's)
    action_timeout_s: float | None = None  # how long a run waits for client outputs (seconds)
    actor: str = "outbox-serve"  # who cancels, in the journal


@dataclass(frozen=True)
class Page:
    """A list request: how many, which way, from which id on."""

    limit: int = 20
    order: str = "desc"
    after: str | None = None
    before: str | None = None


def parse_id(value: str, what: str) -> uuid.UUID:
    """A path id as our UUID; anything else is an id nobody has (404)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise not_found(what, value) from None


def paginate(items: list[Row], page: Page) -> Row:
    """OpenAI's cursor pagination over ``items`` (oldest first)."""
    ordered = items if page.order == "asc" else list(reversed(items))
    ids = [item["id"] for item in ordered]
    start, stop = 0, len(ordered)
    if page.after is not None:
        start = ids.index(page.after) + 1 if page.after in ids else len(ordered)
    if page.before is not None:
        stop = ids.index(page.before) if page.before in ids else 0
    window = ordered[start:stop]
    return shapes.page(window[: page.limit], len(window) > page.limit)


# -- assistants -------------------------------------------------------------------------


def create_assistant(store: Store, tenant: str, body: AssistantIn) -> Row:
    with store.tenant(tenant) as conn:
        row = assistants.create_assistant(
            conn,
            tenant,
            model=body.model,
            name=body.name,
            description=body.description,
            instructions=body.instructions,
            tools=body.tools,
            metadata=body.metadata,
        )
    return shapes.assistant(row)


def get_assistant(store: Store, tenant: str, assistant_id: str) -> Row:
    ident = parse_id(assistant_id, "assistant")
    with store.tenant(tenant) as conn:
        return shapes.assistant(_assistant(conn, tenant, ident))


def list_assistants(store: Store, tenant: str, page: Page) -> Row:
    with store.tenant(tenant) as conn:
        rows = assistants.list_assistants(conn, tenant)
    return paginate([shapes.assistant(r) for r in rows], page)


def modify_assistant(store: Store, tenant: str, assistant_id: str, changes: dict[str, Any]) -> Row:
    ident = parse_id(assistant_id, "assistant")
    with store.tenant(tenant) as conn:  # NotFound is a 404 (server.errors.from_library)
        return shapes.assistant(assistants.modify_assistant(conn, tenant, ident, changes))


def delete_assistant(store: Store, tenant: str, assistant_id: str) -> Row:
    ident = parse_id(assistant_id, "assistant")
    with store.tenant(tenant) as conn:
        assistants.delete_assistant(conn, tenant, ident)
    return shapes.deleted(str(ident), "assistant.deleted")


def _assistant(conn: psycopg.Connection[Any], tenant: str, ident: uuid.UUID) -> Row:
    try:
        return assistants.get_assistant(conn, tenant, ident)
    except NotFound:
        raise not_found("assistant", ident) from None


# -- threads and messages ---------------------------------------------------------------


def create_thread(store: Store, tenant: str, body: ThreadIn) -> Row:
    with store.tenant(tenant) as conn:
        return shapes.thread(_new_thread(conn, tenant, body))


def _new_thread(conn: psycopg.Connection[Any], tenant: str, body: ThreadIn) -> Row:
    opening = [NewMessage(role=m.role, content=m.text) for m in body.messages]
    ref = writer.create_thread(conn, tenant, metadata=body.metadata, messages=opening)
    return _thread(conn, ref.id)


def get_thread(store: Store, tenant: str, thread_id: str) -> Row:
    ident = parse_id(thread_id, "thread")
    with store.tenant(tenant) as conn:
        return shapes.thread(_thread(conn, ident))


def modify_thread(store: Store, tenant: str, thread_id: str, metadata: dict[str, Any]) -> Row:
    ident = parse_id(thread_id, "thread")
    with store.tenant(tenant) as conn:
        return shapes.thread(assistants.modify_thread(conn, tenant, ident, metadata))


def delete_thread(
    store: Store, tenant: str, thread_id: str, settings: Settings, request_id: str | None
) -> Row:
    """Delete a thread: 404 for it and everything of it from now on, every row kept
    (``assistants.delete_thread``); refused while a run of it is active."""
    ident = parse_id(thread_id, "thread")
    with store.tenant(tenant) as conn:
        try:
            assistants.delete_thread(
                conn, tenant, ident, actor=settings.actor, correlation_id=request_id
            )
        except NotFound:
            raise not_found("thread", ident) from None
        except ActiveRunExists as err:
            raise busy_thread("thread", ident, err) from None
    return shapes.deleted(str(ident), "thread.deleted")


def busy_thread(what: str, ident: object, err: ActiveRunExists) -> APIError:
    """The 400 for deleting something of a thread while a run of it is active."""
    return APIError(
        400,
        f"Can't delete {what} {ident} while run {err.run_id} of its thread is active "
        f"(status {err.status}): cancel the run first, or wait for it to end"
        + (" (or answer its tool calls)." if err.status == "requires_action" else "."),
        code="run_active",
    )


def _thread(conn: psycopg.Connection[Any], ident: uuid.UUID) -> Row:
    row = fetch_one(conn, Q.thread, {"thread_id": ident})
    if row is None:
        raise not_found("thread", ident)
    return row


def create_message(
    store: Store, tenant: str, thread_id: str, body: MessageIn, key: str | None = None
) -> Row:
    """Add a message to a thread without an active run. With an ``Idempotency-Key`` the
    same request again answers the same message; the key with any other is a 409."""
    ident = parse_id(thread_id, "thread")
    digest = idempotency.digest("messages.create", {"thread_id": thread_id}, body)
    with store.tenant(tenant) as conn:
        _thread(conn, ident)
        first = idempotency.earlier(conn, tenant, key, digest) if key else None
        if key and first:
            return _kept_message(conn, key, first)
        active = fetch_one(conn, Q.active_run, {"thread_id": ident})
        if active is not None:
            raise APIError(
                400,
                f"Can't add messages to thread {ident} while a run {active['id']} is active.",
            )
        message_id = writer.append_message(conn, ident, tenant, body.role, body.text)
        row = fetch_one(conn, Q.message, {"message_id": message_id, "thread_id": ident})
        assert row is not None
        if key:
            idempotency.keep(conn, tenant, key, digest, ident, f"msg_{message_id}")
        return shapes.message(row, ident)


def _kept_message(conn: psycopg.Connection[Any], key: str, first: idempotency.Earlier) -> Row:
    """The message an earlier request with the same key added (404 once deleted)."""
    number = (first.object_id or "").removeprefix("msg_")
    if not number.isdigit():
        raise idempotency.reused(key)
    row = fetch_one(conn, Q.message, {"message_id": int(number), "thread_id": first.thread_id})
    if row is None:
        raise not_found("message", first.object_id)
    return shapes.message(row, first.thread_id)


def get_message(store: Store, tenant: str, thread_id: str, message_id: str) -> Row:
    ident = parse_id(thread_id, "thread")
    number = message_id.removeprefix("msg_")
    if not number.isdigit():
        raise not_found("message", message_id)
    with store.tenant(tenant) as conn:
        _thread(conn, ident)
        row = fetch_one(conn, Q.message, {"message_id": int(number), "thread_id": ident})
    if row is None:
        raise not_found("message", message_id)
    return shapes.message(row, ident)


def delete_message(
    store: Store,
    tenant: str,
    thread_id: str,
    message_id: str,
    settings: Settings,
    request_id: str | None,
) -> Row:
    """Delete a user or assistant message that carries no tool calls (a 400 names why for
    any other): hidden from the API and from later replays (``assistants.delete_message``)."""
    ident = parse_id(thread_id, "thread")
    number = message_id.removeprefix("msg_")
    if not number.isdigit():
        raise not_found("message", message_id)
    with store.tenant(tenant) as conn:
        remove_message(conn, tenant, ident, int(number), settings, request_id, "message")
    return shapes.deleted(message_id, "thread.message.deleted")


def remove_message(
    conn: psycopg.Connection[Any],
    tenant: str,
    thread_id: uuid.UUID,
    number: int,
    settings: Settings,
    request_id: str | None,
    what: str,
) -> None:
    """``assistants.delete_message`` with the library's refusals as the API's answers
    (``what``: message or item, as the protocol names it)."""
    try:
        assistants.delete_message(
            conn, tenant, thread_id, number, actor=settings.actor, correlation_id=request_id
        )
    except NotFound:
        raise not_found(what, f"msg_{number}") from None
    except ActiveRunExists as err:
        raise busy_thread(what, f"msg_{number}", err) from None
    except InvalidTransition as err:
        raise APIError(400, str(err), code="message_has_tool_calls") from None


def list_messages(
    store: Store, tenant: str, thread_id: str, page: Page, run_id: str | None = None
) -> Row:
    ident = parse_id(thread_id, "thread")
    with store.tenant(tenant) as conn:
        _thread(conn, ident)
        rows = fetch_all(
            conn, Q.messages, {"thread_id": ident, "after_seq": None, "before_seq": None}
        )
    if run_id is not None:
        rows = [r for r in rows if str(r["run_id"]) == run_id]
    return paginate([shapes.message(r, ident) for r in rows], page)


# -- runs -------------------------------------------------------------------------------


def create_run(
    store: Store, tenant: str, thread_id: str, body: RunIn, settings: Settings, key: str | None
) -> Row:
    ident = parse_id(thread_id, "thread")
    digest = idempotency.digest("runs.create", {"thread_id": thread_id}, body)
    with store.tenant(tenant) as conn:
        _thread(conn, ident)
        first = idempotency.earlier(conn, tenant, key, digest) if key else None
        if key and first:
            return _made(conn, tenant, key, first)
        for message in body.additional_messages or []:
            writer.append_message(conn, ident, tenant, message.role, message.text)
        instructions = body.additional_instructions
        run = _start(conn, tenant, ident, body, settings, key, instructions)
        if key and run.created:
            idempotency.remember(conn, tenant, run.row, key, digest)
        if key and not run.created:
            # A twin with the same Idempotency-Key committed meanwhile: what it stored
            # stands, and this one's additional messages are rolled back; it must have
            # been the same request.
            conn.rollback()
            conn.execute(Q.act_as_api)
            tenancy.scope(conn, tenant)
            idempotency.earlier(conn, tenant, key, digest)
        return _run(conn, tenant, run.id, ident)


def create_thread_and_run(
    store: Store, tenant: str, body: ThreadAndRunIn, settings: Settings, key: str | None
) -> Row:
    digest = idempotency.digest("threads.create_and_run", {}, body)
    with store.tenant(tenant) as conn:
        first = idempotency.earlier(conn, tenant, key, digest) if key else None
        if key and first:  # the first request's thread and run, not a new thread
            return _made(conn, tenant, key, first)
        thread = _new_thread(conn, tenant, body.thread or ThreadIn())
        run = _start(conn, tenant, thread["id"], body, settings, key, None)
        if key and run.created:
            idempotency.remember(conn, tenant, run.row, key, digest)
        return _run(conn, tenant, run.id, thread["id"])


def _made(conn: psycopg.Connection[Any], tenant: str, key: str, first: idempotency.Earlier) -> Row:
    """The run an earlier request with the same key made; 409 when that request made
    something else (only a request without a digest, older than digests, gets here)."""
    if first.run_id is None:
        raise idempotency.reused(key)
    return _run(conn, tenant, first.run_id, first.thread_id)


def _start(
    conn: psycopg.Connection[Any],
    tenant: str,
    thread_id: uuid.UUID,
    body: RunIn | ThreadAndRunIn,
    settings: Settings,
    key: str | None,
    additional_instructions: str | None,
) -> writer.RunRef:
    """Start a run from an assistant: its declared tools resolved (registered tools run
    through the relay, the rest are client tools), then ``writer.start_run``."""
    assistant = _assistant(conn, tenant, parse_id(body.assistant_id, "assistant"))
    tools = body.tools if body.tools is not None else assistant["tools"]
    names = assistants.declare_tools(conn, tenant, tools)
    instructions = body.instructions if body.instructions is not None else assistant["instructions"]
    if additional_instructions:
        instructions = (
            f"{instructions}\n\n{additional_instructions}"
            if instructions
            else (additional_instructions)
        )
    options = body.model_options()
    try:
        options.check_tools(names)
    except ValueError as err:
        raise APIError(
            400, f"Invalid value for 'tool_choice': {err}", param="tool_choice"
        ) from None
    run = writer.start_run(
        conn,
        StartRun(
            tenant_id=tenant,
            thread_id=thread_id,
            model=body.model or assistant["model"],
            tools=names,
            base_url=settings.model_base_url,
            instructions=instructions,
            max_tokens=body.max_completion_tokens,
            idempotency_key=key,
            model_options=options,
            **(
                {}
                if settings.action_timeout_s is None
                else {"action_timeout_s": settings.action_timeout_s}
            ),
        ),
    )
    if run.created:
        assistants.link_run(conn, run.row, assistant["id"], tools, body.metadata)
    return run


def get_run(store: Store, tenant: str, thread_id: str, run_id: str) -> Row:
    thread, run = parse_id(thread_id, "thread"), parse_id(run_id, "run")
    with store.tenant(tenant) as conn:
        return _run(conn, tenant, run, thread)


def list_runs(store: Store, tenant: str, thread_id: str, page: Page) -> Row:
    ident = parse_id(thread_id, "thread")
    with store.tenant(tenant) as conn:
        _thread(conn, ident)
        ids = fetch_all(conn, Q.runs_of_thread, {"thread_id": ident})
        runs = [_run(conn, tenant, r["id"], ident) for r in ids]
    return paginate(runs, page)


def _run(
    conn: psycopg.Connection[Any], tenant: str, run_id: uuid.UUID, thread_id: uuid.UUID | None
) -> Row:
    row = fetch_one(conn, Q.run, {"run_id": run_id, "thread_id": thread_id})
    if row is None:
        raise not_found("run", run_id)
    pending = []
    if row["status"] == "requires_action":
        pending = lifecycle.pending_client_calls(conn, run_id)
    return shapes.run(row, pending)


def _lock(conn: psycopg.Connection[Any], thread_id: uuid.UUID, run_id: uuid.UUID) -> Row:
    row = fetch_one(conn, Q.lock_run, {"run_id": run_id, "thread_id": thread_id})
    if row is None:
        raise not_found("run", run_id)
    return row


def cancel_run(store: Store, tenant: str, thread_id: str, run_id: str, settings: Settings) -> Row:
    thread, run = parse_id(thread_id, "thread"), parse_id(run_id, "run")
    with store.tenant(tenant) as conn:
        locked = _lock(conn, thread, run)
        if locked["status"] not in ACTIVE:
            raise APIError(400, f"Cannot cancel run with status '{locked['status']}'.")
        lifecycle.cancel_run(conn, run, tenant, actor=settings.actor)
        return _run(conn, tenant, run, thread)


def submit_tool_outputs(
    store: Store, tenant: str, thread_id: str, run_id: str, body: SubmitOutputsIn
) -> Row:
    """Outputs of the client calls a run waits for, accepted once: a run that no longer
    waits (a second submit, or one after the run moved on) is answered with OpenAI's 400
    and nothing changes; outputs past the deadline are kept in ``orphaned_results`` by the
    library, the run is expired, and the answer is the same 400."""
    thread, run = parse_id(thread_id, "thread"), parse_id(run_id, "run")
    with store.tenant(tenant) as conn:
        locked = _lock(conn, thread, run)
        status = shapes.run_status(locked)
        if locked["status"] == "requires_action":  # past the deadline too: kept as evidence
            outputs = [
                {"tool_call_id": o.tool_call_id, "output": o.output} for o in body.tool_outputs
            ]
            status = lifecycle.submit_tool_outputs(conn, tenant, run, outputs)
            if status != "expired":
                return _run(conn, tenant, run, thread)
    raise APIError(400, f'Runs in status "{status}" do not accept tool outputs.')


def list_steps(store: Store, tenant: str, thread_id: str, run_id: str, page: Page) -> Row:
    thread, run = parse_id(thread_id, "thread"), parse_id(run_id, "run")
    with store.tenant(tenant) as conn:
        run_row = fetch_one(conn, Q.run, {"run_id": run, "thread_id": thread})
        if run_row is None:
            raise not_found("run", run)
        rows = fetch_all(conn, Q.steps, {"run_id": run})
    return paginate(shapes.steps(rows, run_row), page)


def get_step(store: Store, tenant: str, thread_id: str, run_id: str, step_id: str) -> Row:
    thread, run = parse_id(thread_id, "thread"), parse_id(run_id, "run")
    with store.tenant(tenant) as conn:
        run_row = fetch_one(conn, Q.run, {"run_id": run, "thread_id": thread})
        if run_row is None:
            raise not_found("run", run)
        rows = fetch_all(conn, Q.steps, {"run_id": run})
    for step in shapes.steps(rows, run_row):
        if step["id"] == step_id:
            return step
    raise not_found("run step", step_id)


def run_state(
    store: Store, tenant: str, thread_id: uuid.UUID, run_id: uuid.UUID
) -> tuple[Row, list[Row], list[Row]]:
    """A run, its steps and its messages, read in one transaction (for ``stream=true``)."""
    with store.tenant(tenant) as conn:
        run = _run(conn, tenant, run_id, thread_id)
        run_row = fetch_one(conn, Q.run, {"run_id": run_id, "thread_id": thread_id})
        assert run_row is not None
        steps = shapes.steps(fetch_all(conn, Q.steps, {"run_id": run_id}), run_row)
        rows = fetch_all(
            conn, Q.messages, {"thread_id": thread_id, "after_seq": None, "before_seq": None}
        )
    messages = [shapes.message(r, thread_id) for r in rows if r["run_id"] == run_id]
    return run, steps, [m for m in messages if m["role"] == "assistant"]
