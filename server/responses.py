"""OpenAI's Responses and Conversations protocols over our runs and threads.

A conversation is a thread (``conv_<hex>``); a response (``resp_<hex>``) is a stretch of a
run (``outbox.responses``). A request with messages starts a run on the conversation's
thread (a new thread without ``conversation`` or ``previous_response_id``). When the run
needs the caller's function tools it waits in ``requires_action``, and the response ends
``completed`` with ``function_call`` items; the caller's next request answers them with
``function_call_output`` items (by ``previous_response_id`` or ``conversation``), which
carries the same run on under a new response, exactly once (``lifecycle``'s
``submit_tool_outputs``). Functions of our registry run through the relay, durably, and
do not show as ``function_call`` items.

Differences from OpenAI's, by design: every response is stored (``store=false`` is
refused); ``previous_response_id`` must name the newest response of its conversation (a
thread is one durable line of history; no forks); deletes keep the rows (``deleted_at``),
and a conversation item that is a function call or its output cannot be deleted (the
history runs replay must pair them).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from outbox import assistants, lifecycle, responses, writer
from outbox.errors import ActiveRunExists, NotFound
from outbox.schemas import NewMessage, Retarget, StartRun
from outbox.server import idempotency, input_items, shapes
from outbox.server.actions import Page, Settings, busy_thread, paginate, remove_message
from outbox.server.bodies import ConversationIn, ResponseIn
from outbox.server.db_pool import Q, Store
from outbox.server.errors import APIError
from outbox.statements import fetch_all, fetch_one

Row = dict[str, Any]
INSTRUCTION_ROLES = input_items.INSTRUCTION_ROLES
FIRST_SEQ = 1  # a thread's first message position: a thread there holds no message yet
OPENING_ROLES = ("user", "assistant")  # the roles of messages a new thread is made with


def response_id(ident: uuid.UUID) -> str:
    return f"resp_{ident.hex}"


def conversation_id(ident: uuid.UUID) -> str:
    return f"conv_{ident.hex}"


def parse(value: str, prefix: str, what: str) -> uuid.UUID:
    """``resp_<hex>`` / ``conv_<hex>`` as our UUID; anything else is an id nobody has."""
    try:
        if value.startswith(prefix):
            return uuid.UUID(hex=value[len(prefix) :])
    except ValueError:
        pass
    raise APIError(404, f"{what} with id '{value}' not found.")


# -- input items --------------------------------------------------------------------------


def read_input(value: str | list[dict[str, Any]] | None) -> tuple[list[Row], list[Row]]:
    """Conversation items as (messages, function call outputs): only those two kinds are
    items a conversation is given; 400 naming any other."""
    items = input_items.parse(value)
    for item in items:
        if item["type"] not in (input_items.MESSAGE, input_items.OUTPUT) or "ref" in item:
            raise APIError(
                400,
                f"Items of type {item['type']!r} (or with a stored item's id) cannot be "
                "added to a conversation: send user and assistant messages.",
                param=f"items[{item['index']}]",
            )
    return _split(items)


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses' flat function tools as the Assistants' nested ones ``assistants`` reads."""
    nested = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"Tools of type {tool.get('type')!r} are not supported by outbox serve: "
                "declare function tools (registered ones run through the relay).",
                param=f"tools[{index}]",
            )
        fields = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        nested.append({"type": "function", "function": fields})
    return nested


# -- create -------------------------------------------------------------------------------


def create(
    store: Store, api_key: str, body: ResponseIn, settings: Settings, key: str | None = None
) -> tuple[uuid.UUID, uuid.UUID, str]:
    """Record a response (start a run, or carry a waiting one on) for the tenant of
    ``api_key`` (looked up in the same transaction: ``Store.for_key``, ``UnknownKey``
    when it acts for none); returns its id, its run's (what a waiting request watches)
    and the tenant.

    With ``previous_response_id`` or ``conversation`` the input is the new turn. Without
    either it is the whole history as the caller keeps it (``_stateless``): it continues
    the stored history it extends, or seeds a new thread. With an ``Idempotency-Key`` the
    same request again answers the response the first made (nothing stored twice); the
    key with any other request is a 409 (``server.idempotency``)."""
    digest = idempotency.digest("responses.create", {}, body) if key else ""
    given = input_items.parse(body.input)
    if body.previous_response_id and body.conversation:
        raise APIError(
            400,
            "Mutually exclusive parameters: 'previous_response_id' and 'conversation'. "
            "Give one of them.",
        )
    # A waiting request is answered from its run's settling, a later and durable commit
    # of the relay: its own commit need not wait for the WAL flush. Any other create
    # writes and commits durably, past all it read (server.db_pool); a resend writes
    # nothing, and answers what an earlier create made: durable first.
    waits = not body.background and not body.stream
    with store.for_key(api_key, unanswered=waits, durable_reads=False) as (conn, tenant):
        first = idempotency.earlier(conn, tenant, key, digest) if key else None
        if key and first is not None:
            kept = _kept_response(key, first)
            run_id = responses.get_response(conn, tenant, kept)["run_id"]
            if not waits:  # answered now (a stream's opening events, a background's)
                conn.execute(Q.durable_reads)
            return kept, run_id, tenant
        given = input_items.resolve(conn, given)
        items = input_items.with_reasoning(given)
        if body.previous_response_id or body.conversation:
            messages, outputs = _new_turn(items)
            thread_id, previous, in_conversation = _thread_for(conn, tenant, body)
        else:
            thread_id, previous, in_conversation, messages, outputs = _stateless(
                conn, tenant, items
            )
        instructions = _instructions(body, items)
        if thread_id is None:  # a new thread, made with the request's messages
            if outputs:
                _no_such_call(outputs[0]["call_id"])
            thread_id = _new_thread(conn, tenant, messages)
            run_id = _start(conn, tenant, thread_id, body, [], instructions, settings)
        else:
            run_id = _carry_on(
                conn, tenant, thread_id, body, messages, outputs, instructions, settings
            )
        # The response's output starts at the thread's next position, read by the
        # statement that records it: after the run's start or the outputs it took.
        row = responses.record_response(
            conn,
            tenant,
            run_id=run_id,
            thread_id=thread_id,
            model=body.model,
            input_items=input_items.recorded(given),
            previous_response_id=previous,
            in_conversation=in_conversation,
            instructions=body.instructions,
            tools=body.tools,
            metadata=body.metadata,
            background=body.background,
            model_options=body.model_options().stored(),
        )
        ident = uuid.UUID(str(row["id"]))
        if key:
            idempotency.keep(conn, tenant, key, digest, thread_id, response_id(ident))
        return ident, run_id, tenant


def _carry_on(
    conn: psycopg.Connection[Any],
    tenant: str,
    thread_id: uuid.UUID,
    body: ResponseIn,
    messages: list[Row],
    outputs: list[Row],
    instructions: str | None,
    settings: Settings,
) -> uuid.UUID:
    """The run a request on a stored thread carries on: the run waiting for its client
    calls' outputs, or a new one; 400 while another is in progress."""
    active = fetch_one(conn, Q.active_run, {"thread_id": thread_id})
    if active is not None and active["status"] == "requires_action":
        _retarget(conn, tenant, active["id"], body, instructions)
        _answer_calls(conn, tenant, active["id"], messages, outputs)
        return uuid.UUID(str(active["id"]))
    if active is not None:
        raise APIError(
            400,
            f"Another response is in progress in this conversation (run {active['id']}); "
            "wait for it to finish or cancel it.",
            code="conversation_locked",
        )
    if outputs:
        _no_such_call(outputs[0]["call_id"])
    said = _said(messages)
    if not said and responses.thread_position(conn, thread_id) == FIRST_SEQ:
        _missing_input()
    return _start(conn, tenant, thread_id, body, said, instructions, settings)


def _kept_response(key: str, first: idempotency.Earlier) -> uuid.UUID:
    """The response an earlier request with the same key made."""
    if first.object_id is None or not first.object_id.startswith("resp_"):
        raise idempotency.reused(key)
    return parse(first.object_id, "resp_", "Response")


def _new_turn(given: list[Row]) -> tuple[list[Row], list[Row]]:
    """(messages, outputs) of a request that continues by ``previous_response_id`` or
    ``conversation``: the history is stored here, so function calls are not sent again."""
    for item in given:
        if item["type"] == input_items.CALL:
            raise APIError(
                400,
                "Input items of type 'function_call' are history: with "
                "previous_response_id or conversation, send only the new items (messages "
                "and function_call_output items); or send the whole history without either.",
                param=f"input[{item['index']}]",
            )
    return _split(given)


def _split(items: list[Row]) -> tuple[list[Row], list[Row]]:
    messages = [i for i in items if i["type"] == input_items.MESSAGE]
    outputs = [i for i in items if i["type"] == input_items.OUTPUT]
    return messages, outputs


def _stateless(
    conn: psycopg.Connection[Any], tenant: str, given: list[Row]
) -> tuple[uuid.UUID | None, uuid.UUID | None, bool, list[Row], list[Row]]:
    """(thread, previous response, in a conversation?, messages, outputs) of a request
    that carries its whole history. It continues a stored history when it extends it: the
    last item that names one of our stored items (``msg_<n>``, ``fc_<n>``) picks the
    thread, and that thread's history as its caller saw it (``stored_history``) must be
    the first items of the given one, in order; the items after it are the new turn, as
    with ``previous_response_id``. Any other history seeds a new thread, checked with the
    pairing rules; its function calls are stored as answered history (an ``import`` run,
    ``lifecycle.import_thread``), never executed. System and developer messages are the
    instructions either way. The thread is None for a history of messages only: a new
    thread the caller makes with them (``_new_thread``). ``given`` has its reasoning items
    on the items they came before (``input_items.with_reasoning``): stored with what they
    came before."""
    history = [i for i in given if input_items.is_history(i)]
    instructions = [
        i
        for i in given
        if i["type"] == input_items.MESSAGE and i["role"] in input_items.INSTRUCTION_ROLES
    ]
    anchors = [i["thread_id"] for i in history if "thread_id" in i]
    if anchors:
        thread_id = anchors[-1]
        latest = responses.latest_of_thread(conn, thread_id)
        stored = input_items.stored_history(conn, thread_id)
        head, new = history[: len(stored)], history[len(stored) :]
        extends = [input_items.key(i) for i in head] == [input_items.key(i) for i in stored]
        if latest is not None and extends and all(i["type"] != input_items.CALL for i in new):
            messages, outputs = _split(new)
            active = fetch_one(conn, Q.active_run, {"thread_id": thread_id})
            if active is None or active["status"] != "requires_action":
                messages = instructions + messages
            return thread_id, latest["id"], bool(latest["in_conversation"]), messages, outputs
    input_items.check_pairs(history)
    if all(i["type"] == input_items.MESSAGE for i in history):
        return None, None, False, instructions + history, []
    thread, _ = lifecycle.import_thread(conn, tenant, input_items.as_chat(history))
    return thread.id, None, False, instructions, []


def _thread_for(
    conn: psycopg.Connection[Any], tenant: str, body: ResponseIn
) -> tuple[uuid.UUID | None, uuid.UUID | None, bool]:
    """(thread, previous response, in a conversation?) the request continues; the thread
    is None for a new one (``_new_thread``)."""
    if body.previous_response_id:
        ident = parse(body.previous_response_id, "resp_", "Previous response")
        try:
            previous = responses.get_response(conn, tenant, ident)
        except NotFound:
            raise APIError(
                404,
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
            ) from None
        latest = responses.latest_of_thread(conn, previous["thread_id"])
        if latest is not None and latest["id"] != previous["id"] and latest["deleted_at"]:
            raise APIError(
                400,
                f"Previous response '{body.previous_response_id}' is not the newest response "
                f"of its conversation, and the newest, '{response_id(latest['id'])}', was "
                "deleted: outbox serve keeps one durable history per conversation and does "
                "not fork it. Start a new conversation.",
                param="previous_response_id",
            )
        if latest is not None and latest["id"] != previous["id"]:
            raise APIError(
                400,
                f"Previous response '{body.previous_response_id}' is not the newest response "
                f"of its conversation: continue from '{response_id(latest['id'])}'. outbox "
                "serve keeps one durable history per conversation and does not fork it.",
                param="previous_response_id",
            )
        return previous["thread_id"], ident, bool(previous["in_conversation"])
    if body.conversation:
        raw = (
            body.conversation if isinstance(body.conversation, str) else body.conversation.get("id")
        )
        ident = parse(str(raw), "conv_", "Conversation")
        if fetch_one(conn, Q.thread, {"thread_id": ident}) is None:
            raise APIError(404, f"Conversation with id '{raw}' not found.", param="conversation")
        latest = responses.latest_of_thread(conn, ident)
        return ident, None if latest is None else latest["id"], True
    return None, None, False


def _answer_calls(
    conn: psycopg.Connection[Any],
    tenant: str,
    run_id: uuid.UUID,
    messages: list[Row],
    outputs: list[Row],
) -> None:
    """The run waits for its client calls: the input must answer every one of them, with
    nothing else; then they are recorded, once, and the run goes on."""
    pending = [c["tool_call_id"] for c in lifecycle.pending_client_calls(conn, run_id)]
    given = [o["call_id"] for o in outputs]
    for call_id in given:
        if call_id not in pending:
            _no_such_call(call_id)
    for call_id in pending:
        if call_id not in given:
            raise APIError(400, f"No tool output found for function call {call_id}.")
    if messages:
        raise APIError(
            400,
            "This conversation waits for the outputs of its function calls: send only "
            "function_call_output items now, and your messages in the next request.",
        )
    status = lifecycle.submit_tool_outputs(
        conn,
        tenant,
        run_id,
        [{"tool_call_id": o["call_id"], "output": o["output"]} for o in outputs],
    )
    if status == "expired":
        raise APIError(
            400, "The function calls of this conversation expired before their outputs came."
        )


def _no_such_call(call_id: str) -> None:
    raise APIError(400, f"No tool call found for function call output with call_id {call_id}.")


def _instructions(body: ResponseIn, items: list[Row]) -> str | None:
    """The instructions of the turns a request starts: ``instructions``, then the system
    and developer messages of its input."""
    extra = [
        i["text"]
        for i in items
        if i["type"] == input_items.MESSAGE and i["role"] in INSTRUCTION_ROLES
    ]
    return "\n\n".join(t for t in [body.instructions or "", *extra] if t) or None


def _retarget(
    conn: psycopg.Connection[Any],
    tenant: str,
    run_id: uuid.UUID,
    body: ResponseIn,
    instructions: str | None,
) -> None:
    """A request that carries a waiting run on gives the model, tools, instructions and
    model options of the turns it starts, as any request does: nothing carries over from
    the previous response (OpenAI's rule for ``instructions`` with
    ``previous_response_id``). After an Agents SDK handoff, the next agent's."""
    names = assistants.declare_tools(conn, tenant, function_tools(body.tools))
    lifecycle.retarget_run(
        conn,
        Retarget(
            tenant_id=tenant,
            run_id=run_id,
            model=body.model,
            tools=names,
            instructions=instructions,
            model_options=body.model_options(),
        ),
    )


def _said(messages: list[Row]) -> list[Row]:
    """The messages a run's turn stores in its thread: the instruction roles' are not."""
    return [m for m in messages if m["role"] not in INSTRUCTION_ROLES]


def _missing_input() -> None:
    raise APIError(400, "Missing required parameter: 'input' (give at least one message).")


def _new_thread(conn: psycopg.Connection[Any], tenant: str, messages: list[Row]) -> uuid.UUID:
    """A new thread holding the request's messages (those of the instruction roles go to
    the run's instructions). Messages without reasoning go in with the thread, by the one
    statement that makes it; otherwise each is appended after it."""
    said = _said(messages)
    if not said:
        _missing_input()
    if any(
        m.get("reasoning") or not isinstance(m["text"], str) or m["role"] not in OPENING_ROLES
        for m in said
    ):
        thread_id = writer.create_thread(conn, tenant).id
        _append(conn, tenant, thread_id, said)
        return thread_id
    opening = []
    for m in said:  # refused in the words ``writer.append_message`` uses
        writer.check_message(m["role"], m["text"])
        opening.append(NewMessage(role=m["role"], content=m["text"]))
    return writer.create_thread(conn, tenant, messages=opening).id


def _append(
    conn: psycopg.Connection[Any], tenant: str, thread_id: uuid.UUID, said: list[Row]
) -> None:
    for message in said:
        writer.append_message(
            conn,
            thread_id,
            tenant,
            message["role"],
            message["text"],
            reasoning=message.get("reasoning"),
        )


def _start(
    conn: psycopg.Connection[Any],
    tenant: str,
    thread_id: uuid.UUID,
    body: ResponseIn,
    said: list[Row],
    instructions: str | None,
    settings: Settings,
) -> uuid.UUID:
    """Append ``said`` to the thread and start a run on it; the run's id (the run is not
    read back: nothing here needs more of it)."""
    _append(conn, tenant, thread_id, said)
    names = assistants.declare_tools(conn, tenant, function_tools(body.tools))
    run_id, _ = writer.begin_run(
        conn,
        StartRun(
            tenant_id=tenant,
            thread_id=thread_id,
            model=body.model,
            tools=names,
            base_url=settings.model_base_url,
            instructions=instructions,
            max_tokens=body.max_output_tokens,
            model_options=body.model_options(),
            **(
                {}
                if settings.action_timeout_s is None
                else {"action_timeout_s": settings.action_timeout_s}
            ),
        ),
    )
    return run_id


# -- read -----------------------------------------------------------------------------------


def get(store: Store, tenant: str, ident: uuid.UUID) -> Row:
    """The response as OpenAI shows it, from the database now."""
    with store.tenant(tenant) as conn:
        return _shape(_shown(conn, ident))


def get_settled(store: Store, tenant: str, idents: list[uuid.UUID]) -> dict[uuid.UUID, Row]:
    """Responses of one tenant for reads that answer only once they settled, which a
    durable commit of the relay did (``server.db_pool``: no wait for durability), in one
    statement and one round trip (``Store.read_settled``): each found as OpenAI shows it,
    by id (one not found, or another tenant's, is missing)."""
    rows = store.read_settled(tenant, Q.responses_shown, {"ids": idents})
    return {row["id"]: _shape(row) for row in rows}


def get_with_run(store: Store, tenant: str, ident: uuid.UUID) -> tuple[Row, uuid.UUID]:
    """The response as OpenAI shows it, and the id of its run (what a waiter watches)."""
    with store.tenant(tenant) as conn:
        row = _shown(conn, ident)
        return _shape(row), row["run_id"]


def _shown(conn: psycopg.Connection[Any], ident: uuid.UUID) -> Row:
    """The response's row with what it shows (``responses_shown``): one statement, in the
    transaction ``Store.tenant`` scoped. ``NotFound`` as ``responses.get_response``."""
    row = fetch_one(conn, Q.responses_shown, {"ids": [ident]})
    if row is None:
        raise NotFound(f"Response with id 'resp_{ident.hex}' not found.")
    return row


def _shape(row: Row) -> Row:
    run, until = row["run"], row["until_seq"]
    output: list[Row] = [
        {
            "type": "message",
            "id": f"msg_{m['id']}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": m["content"], "annotations": []}],
        }
        for m in row["texts"]
    ]
    output += [
        {
            "type": "function_call",
            "id": f"fc_{c['id']}",
            "call_id": c["tool_call_id"],
            "name": c["tool_name"],
            "arguments": c["arguments_raw"],
            "status": "completed",
        }
        for c in row["calls"]
    ]
    status, error, incomplete = _status(run, row, superseded=until is not None)
    options = row["model_options"]
    if status in ("queued", "in_progress"):
        output = []
    return {
        "id": response_id(row["id"]),
        "object": "response",
        "created_at": shapes.ts(row["created_at"]),
        "status": status,
        "background": row["background"],
        "model": row["model"],
        "instructions": row["instructions"],
        "tools": row["tools"],
        "metadata": row["metadata"] or {},
        "output": output,
        "error": error,
        "incomplete_details": incomplete,
        "previous_response_id": None
        if row["previous_response_id"] is None
        else response_id(row["previous_response_id"]),
        "conversation": {"id": conversation_id(row["thread_id"])}
        if row["in_conversation"]
        else None,
        "parallel_tool_calls": options.get("parallel_tool_calls", True),
        "tool_choice": options.get("tool_choice", "auto"),
        "text": {
            "format": options.get("format", {"type": "text"}),
            **({"verbosity": options["verbosity"]} if "verbosity" in options else {}),
        },
        **{k: options.get(k) for k in ECHOED},
        "max_output_tokens": run.get("max_tokens"),
        "usage": {
            "input_tokens": run["input_tokens"],
            "input_tokens_details": {"cached_tokens": run.get("cached_tokens", 0)},
            "output_tokens": run["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": run["input_tokens"] + run["output_tokens"],
        },
    }


# The model options a response shows as it was asked (None: the model's default).
ECHOED = (
    "temperature",
    "top_p",
    "reasoning",
    "truncation",
    "user",
    "service_tier",
    "top_logprobs",
    "max_tool_calls",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
)


def _status(run: Row, row: Row, *, superseded: bool) -> tuple[str, Row | None, Row | None]:
    """(status, error, incomplete_details) of a response, from its run."""
    if superseded or run["status"] == "requires_action":
        return "completed", None, None  # ended with function calls for the caller
    status = shapes.run_status(run)
    if status == "queued":
        return ("queued" if row["background"] else "in_progress"), None, None
    if status == "incomplete":
        return "incomplete", None, {"reason": "max_output_tokens"}
    if status == "failed":
        return "failed", {"code": "server_error", "message": run["last_error"] or "failed"}, None
    if status == "expired":
        message = "the function calls expired before their outputs came"
        return "failed", {"code": "server_error", "message": message}, None
    return status, None, None


def delete(
    store: Store, tenant: str, ident: uuid.UUID, settings: Settings, request_id: str | None
) -> Row:
    """Delete a response (``outbox.responses.delete_response``): 404 from now on, the row
    kept; refused while it is still going. OpenAI answers ``{"id", "object": "response",
    "deleted": true}`` (the SDK's ``responses.delete`` returns None)."""
    with store.tenant(tenant) as conn:
        try:
            responses.delete_response(
                conn, tenant, ident, actor=settings.actor, correlation_id=request_id
            )
        except ActiveRunExists as err:
            raise APIError(
                400,
                f"Can't delete response {response_id(ident)} while it is in progress (its "
                f"run {err.run_id} is {err.status}): cancel it (background responses), "
                "answer its function calls, or wait for it to end.",
                code="response_in_progress",
            ) from None
    return shapes.deleted(response_id(ident), "response")


def list_input_items(store: Store, tenant: str, ident: uuid.UUID, page: Page) -> Row:
    with store.tenant(tenant) as conn:
        row = responses.get_response(conn, tenant, ident)
    items = [{**item, "id": f"{item['id']}_{ident.hex[:8]}"} for item in row["input"]]
    return paginate(items, page)


def cancel(store: Store, tenant: str, ident: uuid.UUID, settings: Settings) -> Row:
    """Cancel a background response whose run is still going (OpenAI's rule: only
    background responses can be cancelled)."""
    with store.tenant(tenant) as conn:
        row = responses.get_response(conn, tenant, ident)
        if not row["background"]:
            raise APIError(400, "Only responses created with background=true can be cancelled.")
        run = fetch_one(conn, Q.run, {"run_id": row["run_id"], "thread_id": None})
        assert run is not None
        if run["status"] in ("queued", "in_progress"):
            lifecycle.cancel_run(conn, row["run_id"], tenant, actor=settings.actor)
        return _shape(_shown(conn, ident))


# -- conversations --------------------------------------------------------------------------


def create_conversation(store: Store, tenant: str, body: ConversationIn) -> Row:
    messages, outputs = read_input(body.items)
    if outputs:
        raise APIError(400, "A new conversation has no function calls to answer.")
    with store.tenant(tenant) as conn:
        opening = [NewMessage(role=m["role"], content=m["text"]) for m in messages]
        ref = writer.create_thread(conn, tenant, metadata=body.metadata, messages=opening)
        thread = fetch_one(conn, Q.thread, {"thread_id": ref.id})
        assert thread is not None
        return conversation(thread)


def conversation(thread: Row) -> Row:
    return {
        "id": conversation_id(thread["id"]),
        "object": "conversation",
        "created_at": shapes.ts(thread["created_at"]),
        "metadata": thread["metadata"] or {},
    }


def get_conversation(store: Store, tenant: str, ident: uuid.UUID) -> Row:
    with store.tenant(tenant) as conn:
        return conversation(_conversation(conn, ident))


def _conversation(conn: psycopg.Connection[Any], ident: uuid.UUID) -> Row:
    thread = fetch_one(conn, Q.thread, {"thread_id": ident})
    if thread is None:
        raise APIError(404, f"Conversation with id '{conversation_id(ident)}' not found.")
    return thread


def update_conversation(
    store: Store, tenant: str, ident: uuid.UUID, metadata: dict[str, Any]
) -> Row:
    with store.tenant(tenant) as conn:
        _conversation(conn, ident)
        return conversation(assistants.modify_thread(conn, tenant, ident, metadata))


def delete_conversation(
    store: Store, tenant: str, ident: uuid.UUID, settings: Settings, request_id: str | None
) -> Row:
    """Delete a conversation (its thread, ``assistants.delete_thread``): 404 for it, its
    items and its responses from now on, every row kept; refused while a response of it
    is in progress."""
    with store.tenant(tenant) as conn:
        try:
            assistants.delete_thread(
                conn, tenant, ident, actor=settings.actor, correlation_id=request_id
            )
        except NotFound:
            raise APIError(
                404, f"Conversation with id '{conversation_id(ident)}' not found."
            ) from None
        except ActiveRunExists as err:
            raise busy_thread("conversation", conversation_id(ident), err) from None
    return shapes.deleted(conversation_id(ident), "conversation.deleted")


def delete_item(
    store: Store,
    tenant: str,
    ident: uuid.UUID,
    item_id: str,
    settings: Settings,
    request_id: str | None,
) -> Row:
    """Delete a message item of a conversation (``assistants.delete_message``: user and
    assistant messages that carry no function calls); answers the conversation, as
    OpenAI's ``conversations.items.delete`` does."""
    number = item_id.removeprefix("msg_")
    with store.tenant(tenant) as conn:
        thread = _conversation(conn, ident)
        if not number.isdigit():
            raise APIError(404, f"Item with id '{item_id}' not found.")
        remove_message(conn, tenant, ident, int(number), settings, request_id, "item")
        return conversation(thread)


def list_items(store: Store, tenant: str, ident: uuid.UUID, page: Page) -> Row:
    """The conversation's messages as items, oldest first (``order`` as asked)."""
    with store.tenant(tenant) as conn:
        _conversation(conn, ident)
        rows = fetch_all(
            conn, Q.messages, {"thread_id": ident, "after_seq": None, "before_seq": None}
        )
    return paginate([item(r) for r in rows], page)


def item(row: Row) -> Row:
    kind = "input_text" if row["role"] == "user" else "output_text"
    part: Row = {"type": kind, "text": row["content"]}
    if kind == "output_text":
        part["annotations"] = []
    return {
        "type": "message",
        "id": f"msg_{row['id']}",
        "status": "completed",
        "role": row["role"],
        "content": [part],
    }


def add_items(store: Store, tenant: str, ident: uuid.UUID, items: list[dict[str, Any]]) -> Row:
    messages, outputs = read_input(items)
    if outputs or any(m["role"] in INSTRUCTION_ROLES for m in messages):
        raise APIError(
            400,
            "Only user and assistant messages can be added to a conversation; answer "
            "function calls with a new response.",
        )
    with store.tenant(tenant) as conn:
        _conversation(conn, ident)
        active = fetch_one(conn, Q.active_run, {"thread_id": ident})
        if active is not None:
            raise APIError(
                400,
                f"Can't add items to conversation {conversation_id(ident)} while a response "
                "is in progress in it.",
                code="conversation_locked",
            )
        added = []
        for message in messages:
            message_id = writer.append_message(
                conn, ident, tenant, message["role"], message["text"]
            )
            row = fetch_one(conn, Q.message, {"message_id": message_id, "thread_id": ident})
            assert row is not None
            added.append(item(row))
    return {
        "object": "list",
        "data": added,
        "first_id": added[0]["id"],
        "last_id": added[-1]["id"],
        "has_more": False,
    }


def get_item(store: Store, tenant: str, ident: uuid.UUID, item_id: str) -> Row:
    number = item_id.removeprefix("msg_")
    with store.tenant(tenant) as conn:
        _conversation(conn, ident)
        row = None
        if number.isdigit():
            row = fetch_one(conn, Q.message, {"message_id": int(number), "thread_id": ident})
    if row is None or row["role"] not in ("user", "assistant"):
        raise APIError(404, f"Item with id '{item_id}' not found.")
    return item(row)
