"""The HTTP endpoints: authenticate, read the request, call ``server.actions`` in the
thread pool, answer JSON (or SSE).

Every endpoint authenticates first (``Authorization: Bearer <key>``; a missing, unknown or
revoked key is a 401 before anything is read), then reads the body under a size cap
(413 past it) as strict JSON that PostgreSQL can store (400 otherwise) into a pydantic
model of ``server.bodies``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox import storable
from outbox.errors import NotFound
from outbox.server import actions, events, response_stream, responses, streaming
from outbox.server.bodies import (
    AssistantChangesIn,
    AssistantIn,
    ConversationChangesIn,
    ConversationIn,
    ItemsIn,
    MessageIn,
    NoBody,
    ResponseIn,
    RunIn,
    SubmitOutputsIn,
    ThreadAndRunIn,
    ThreadChangesIn,
    ThreadIn,
)
from outbox.server.db_pool import Store, UnknownKey
from outbox.server.errors import APIError
from outbox.server.reads import SettledReads
from outbox.server.thread_pool import in_thread, read_in_thread
from outbox.server.wakeups import Wakeups

B = TypeVar("B", bound=BaseModel)
POLL_AFTER_MS = "200"  # how soon the SDK's *_and_poll helpers look again (openai-poll-after-ms)
MAX_LIMIT = 100  # the most items a list returns (OpenAI's cap)


class Config:
    """What the routes share: the store, the settings of new runs, the body cap."""

    def __init__(
        self, store: Store, settings: actions.Settings, max_body_bytes: int, wakeups: Wakeups
    ) -> None:
        self.store = store
        self.settings = settings
        self.max_body_bytes = max_body_bytes
        self.wakeups = wakeups  # wakes requests waiting on a run (server.wakeups)
        self.reads = SettledReads(store)  # their reads, together (server.reads)


def config(request: Request) -> Config:
    cfg = request.app.state.config
    assert isinstance(cfg, Config)
    return cfg


def bearer(request: Request) -> str:
    """The request's API key; 401 when there is none."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIError(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    return key.strip()


def refused_key(key: str) -> APIError:
    shown = f"{key[:6]}***{key[-4:]}" if len(key) > 12 else "***"
    return APIError(
        401,
        f"Incorrect API key provided: {shown}. Create one with `outbox keys create "
        "--tenant T`; a revoked key is refused.",
        code="invalid_api_key",
    )


async def tenant(request: Request) -> str:
    """The tenant of the request's API key; 401 when there is none or it is not valid."""
    key = bearer(request)
    found = await read_in_thread(config(request).store.tenant_of, key)
    if found is None:
        raise refused_key(key)
    request.state.tenant_id = found  # for the access log (server.access)
    return found


async def body(request: Request, model: type[B]) -> B:
    """The request's JSON body as ``model``: 413 over the cap, 400 when it is not a JSON
    object, holds what PostgreSQL cannot store (``outbox.storable``: a NUL, NaN, nesting
    past its limit; refused here once for every route) or does not fit ``model`` (naming
    the parameter)."""
    cap = config(request).max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _too_large(int(declared), cap)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _too_large(size, cap)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        data = storable.loads(raw, "the body of your request") if raw.strip() else {}
    except storable.NotStorable as err:  # parses, but PostgreSQL could not store it
        raise APIError(400, f"{err.args[0][0].upper()}{err.args[0][1:]}.") from err
    except ValueError as err:
        raise APIError(
            400,
            f"We could not parse the JSON body of your request ({err}). The API expects "
            "a JSON object.",
        ) from err
    if not isinstance(data, dict):
        raise APIError(400, "The body of your request must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise APIError(
                400, f"Unrecognized request argument supplied: {param}", param=param
            ) from err
        message = str(first["msg"]).removeprefix("Value error, ")
        raise APIError(400, f"Invalid value for '{param}': {message}", param=param) from err


def _too_large(size: int, cap: int) -> APIError:
    return APIError(
        413,
        f"The request body is {size} bytes or more, over this server's limit of {cap} bytes.",
        code="request_too_large",
    )


def page(request: Request, order: str = "desc") -> actions.Page:
    """The list parameters (``limit``, ``order``, ``after``, ``before``), checked; ``order``
    is the default (OpenAI lists input items and conversation items oldest first)."""
    query = request.query_params
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise APIError(
            400, f"Invalid 'limit': {raw_limit!r}; give 1 to {MAX_LIMIT}.", param="limit"
        )
    order = query.get("order", order)
    if order not in ("asc", "desc"):
        raise APIError(400, f"Invalid 'order': {order!r}; give asc or desc.", param="order")
    return actions.Page(int(raw_limit), order, query.get("after"), query.get("before"))


def answer(value: Any, status: int = 200) -> Response:
    return JSONResponse(value, status_code=status, headers={"openai-poll-after-ms": POLL_AFTER_MS})


def run_stream(cfg: Config, who: str, run: dict[str, Any], opening: list[Any]) -> Response:
    """``stream=true``: the run's ``thread.*`` events from here on (server.streaming),
    after ``opening``, which announced the run's status when it is not empty."""
    thread_id = actions.parse_id(run["thread_id"], "thread")
    run_id = actions.parse_id(run["id"], "run")
    announced = run["status"] if opening else None
    events = streaming.stream(cfg.store, who, thread_id, run_id, opening, announced, cfg.wakeups)
    return EventSourceResponse(events, ping=15)


# -- endpoints --------------------------------------------------------------------------


async def create_assistant(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, AssistantIn)
    return answer(await in_thread(actions.create_assistant, cfg.store, who, data))


async def list_assistants(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    return answer(await in_thread(actions.list_assistants, cfg.store, who, page(request)))


async def get_assistant(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = request.path_params["assistant_id"]
    return answer(await in_thread(actions.get_assistant, cfg.store, who, ident))


async def modify_assistant(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    changes = (await body(request, AssistantChangesIn)).changes()
    ident = request.path_params["assistant_id"]
    return answer(await in_thread(actions.modify_assistant, cfg.store, who, ident, changes))


async def delete_assistant(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = request.path_params["assistant_id"]
    return answer(await in_thread(actions.delete_assistant, cfg.store, who, ident))


async def create_thread(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, ThreadIn)
    return answer(await in_thread(actions.create_thread, cfg.store, who, data))


async def get_thread(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = request.path_params["thread_id"]
    return answer(await in_thread(actions.get_thread, cfg.store, who, ident))


async def modify_thread(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    metadata = (await body(request, ThreadChangesIn)).metadata or {}
    ident = request.path_params["thread_id"]
    return answer(await in_thread(actions.modify_thread, cfg.store, who, ident, metadata))


def request_id(request: Request) -> str | None:
    """The request's id (server.access), journaled with what the request changes."""
    found = getattr(request.state, "request_id", None)
    return found if isinstance(found, str) else None


async def delete_thread(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident, rid = request.path_params["thread_id"], request_id(request)
    return answer(await in_thread(actions.delete_thread, cfg.store, who, ident, cfg.settings, rid))


async def keep_history(request: Request) -> Response:
    """Rewriting a message is refused: a message is the history runs replay and DBAs audit
    (docs/serve.md); a plain one can be deleted, and a new one added."""
    await tenant(request)
    raise APIError(
        405,
        f"{request.method} {request.url.path} is not supported by outbox serve: messages "
        "are the durable history a run replays and the audit record; delete the message "
        "and add a new one instead.",
        code="history_is_kept",
    )


async def create_message(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, MessageIn)
    ident, key = request.path_params["thread_id"], request.headers.get("idempotency-key")
    return answer(await in_thread(actions.create_message, cfg.store, who, ident, data, key))


async def list_messages(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident, run_id = request.path_params["thread_id"], request.query_params.get("run_id")
    result = await in_thread(actions.list_messages, cfg.store, who, ident, page(request), run_id)
    return answer(result)


async def get_message(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    thread, message = request.path_params["thread_id"], request.path_params["message_id"]
    return answer(await in_thread(actions.get_message, cfg.store, who, thread, message))


async def delete_message(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    thread, message = request.path_params["thread_id"], request.path_params["message_id"]
    rid = request_id(request)
    return answer(
        await in_thread(actions.delete_message, cfg.store, who, thread, message, cfg.settings, rid)
    )


async def create_run(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, RunIn)
    ident, key = request.path_params["thread_id"], request.headers.get("idempotency-key")
    result = await in_thread(actions.create_run, cfg.store, who, ident, data, cfg.settings, key)
    if data.stream:
        opening = [streaming.sse("thread.run.created", result)]
        opening.append(streaming.sse(f"thread.run.{result['status']}", result))
        return run_stream(cfg, who, result, opening)
    return answer(result)


async def create_thread_and_run(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, ThreadAndRunIn)
    key = request.headers.get("idempotency-key")
    result = await in_thread(actions.create_thread_and_run, cfg.store, who, data, cfg.settings, key)
    if data.stream:
        thread = await in_thread(actions.get_thread, cfg.store, who, result["thread_id"])
        opening = [streaming.sse("thread.created", thread)]
        opening.append(streaming.sse("thread.run.created", result))
        opening.append(streaming.sse(f"thread.run.{result['status']}", result))
        return run_stream(cfg, who, result, opening)
    return answer(result)


async def list_runs(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = request.path_params["thread_id"]
    return answer(await in_thread(actions.list_runs, cfg.store, who, ident, page(request)))


async def get_run(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    thread, run = request.path_params["thread_id"], request.path_params["run_id"]
    return answer(await in_thread(actions.get_run, cfg.store, who, thread, run))


async def cancel_run(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    await body(request, NoBody)
    thread, run = request.path_params["thread_id"], request.path_params["run_id"]
    result = await in_thread(actions.cancel_run, cfg.store, who, thread, run, cfg.settings)
    return answer(result)


async def submit_tool_outputs(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, SubmitOutputsIn)
    thread, run = request.path_params["thread_id"], request.path_params["run_id"]
    result = await in_thread(actions.submit_tool_outputs, cfg.store, who, thread, run, data)
    if data.stream:  # the outputs are recorded: the run from here on
        return run_stream(cfg, who, result, [])
    return answer(result)


async def list_steps(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    thread, run = request.path_params["thread_id"], request.path_params["run_id"]
    result = await in_thread(actions.list_steps, cfg.store, who, thread, run, page(request))
    return answer(result)


async def get_step(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ids = [request.path_params[name] for name in ("thread_id", "run_id", "step_id")]
    return answer(await in_thread(actions.get_step, cfg.store, who, *ids))


async def run_events(request: Request) -> Response:
    """``GET /v1/runs/{run_id}/events``: the run's journal as SSE (see server.events)."""
    who, cfg = await tenant(request), config(request)
    run_id = actions.parse_id(request.path_params["run_id"], "run")
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not raw.isdigit():
        raise APIError(400, f"Last-Event-ID must be an event id (a number), not {raw!r}")
    await in_thread(events.read, cfg.store, who, run_id, int(raw))  # 404 before streaming
    stream = events.stream(cfg.store, who, run_id, int(raw), cfg.wakeups)
    return EventSourceResponse(stream, ping=15)


# -- the Responses and Conversations protocols (server.responses) -------------------------


async def create_response(request: Request) -> Response:
    # The key is looked up by the create's own transaction (Store.for_key): one
    # connection and one round trip for both. A body refused before it still answers a
    # bad key's 401 first, as every route does.
    api_key, cfg = bearer(request), config(request)
    try:
        data = await body(request, ResponseIn)
    except APIError:
        await tenant(request)
        raise
    key = request.headers.get("idempotency-key")
    since = cfg.wakeups.mark()  # before the run is made (server.wakeups)
    try:
        ident, run_id, who = await in_thread(
            responses.create, cfg.store, api_key, data, cfg.settings, key
        )
    except UnknownKey:
        raise refused_key(api_key) from None
    request.state.tenant_id = who  # for the access log (server.access)
    return await _respond(
        request,
        who,
        cfg,
        ident,
        stream=data.stream,
        wait=not data.background,
        run_id=run_id,
        since=since,
    )


async def get_response(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = responses.parse(request.path_params["response_id"], "resp_", "Response")
    query = request.query_params
    stream = query.get("stream", "false").lower() == "true"
    after = query.get("starting_after", "-1")
    if not after.lstrip("-").isdigit():
        raise APIError(400, f"Invalid 'starting_after': {after!r}; give a sequence number.")
    return await _respond(request, who, cfg, ident, stream=stream, wait=False, after=int(after))


async def _respond(
    request: Request,
    who: str,
    cfg: Config,
    ident: Any,
    *,
    stream: bool,
    wait: bool,
    after: int = -1,
    run_id: Any = None,
    since: int | None = None,
) -> Response:
    """The response as JSON (once settled, ``wait``) or as its stream. ``run_id``: its run,
    known when the request just made it; a waiting or streamed answer then reads it first
    once its watch is in place (a read before would be one more for nothing), unless the
    watch is primed (``since``: ``Wakeups.mark()`` taken before the run was made), when
    every change of the run since wakes it and it reads only then."""

    async def read() -> dict[str, Any]:
        # What is answered from it: the response once settled, by a durable commit of the
        # relay (server.db_pool); a stream's opening events, from a durable create or a GET
        # that read it durably first. Read with the others woken at once (server.reads).
        return await cfg.reads.get(who, ident)

    shown = None
    if run_id is None or not (stream or wait):  # a 404 comes before any stream starts
        shown, run_id = await in_thread(responses.get_with_run, cfg.store, who, ident)
    if stream:
        events = response_stream.stream(read, cfg.wakeups, run_id, after)
        return EventSourceResponse(events, ping=15)
    if wait:
        with cfg.wakeups.watch(run_id, response_stream.UNSETTLING, since=since) as watch:
            try:
                shown = await response_stream.settled(read, watch)
            except NotFound:
                raise lost(ident) from None
        if shown["status"] not in response_stream.SETTLED:  # waited its longest
            shown = await in_thread(responses.get, cfg.store, who, ident)
    assert shown is not None
    return answer(shown)


def lost(ident: Any) -> APIError:
    """The 503 of a waiting request whose response is gone: the database crashed before
    the create's commit was flushed (server.db_pool), and nobody was told of it."""
    return APIError(
        503,
        f"The database restarted and lost this request's response ({responses.response_id(ident)}) "
        "before it was durable; nothing of it ran. Send the request again (with the same "
        "Idempotency-Key, if it had one).",
        type="server_error",
        code="database_unavailable",
    )


async def cancel_response(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    await body(request, NoBody)
    ident = responses.parse(request.path_params["response_id"], "resp_", "Response")
    return answer(await in_thread(responses.cancel, cfg.store, who, ident, cfg.settings))


async def delete_response(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = responses.parse(request.path_params["response_id"], "resp_", "Response")
    rid = request_id(request)
    return answer(await in_thread(responses.delete, cfg.store, who, ident, cfg.settings, rid))


async def list_input_items(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = responses.parse(request.path_params["response_id"], "resp_", "Response")
    items = await in_thread(
        responses.list_input_items, cfg.store, who, ident, page(request, order="asc")
    )
    return answer(items)


async def create_conversation(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    data = await body(request, ConversationIn)
    return answer(await in_thread(responses.create_conversation, cfg.store, who, data))


def _conversation_id(request: Request) -> Any:
    return responses.parse(request.path_params["conversation_id"], "conv_", "Conversation")


async def get_conversation(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = _conversation_id(request)
    return answer(await in_thread(responses.get_conversation, cfg.store, who, ident))


async def update_conversation(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    metadata = (await body(request, ConversationChangesIn)).metadata
    ident = _conversation_id(request)
    return answer(await in_thread(responses.update_conversation, cfg.store, who, ident, metadata))


async def delete_conversation(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident, rid = _conversation_id(request), request_id(request)
    return answer(
        await in_thread(responses.delete_conversation, cfg.store, who, ident, cfg.settings, rid)
    )


async def list_items(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident = _conversation_id(request)
    return answer(
        await in_thread(responses.list_items, cfg.store, who, ident, page(request, order="asc"))
    )


async def add_items(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    items = (await body(request, ItemsIn)).items
    ident = _conversation_id(request)
    return answer(await in_thread(responses.add_items, cfg.store, who, ident, items))


async def get_item(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident, item_id = _conversation_id(request), request.path_params["item_id"]
    return answer(await in_thread(responses.get_item, cfg.store, who, ident, item_id))


async def delete_item(request: Request) -> Response:
    who, cfg = await tenant(request), config(request)
    ident, item_id = _conversation_id(request), request.path_params["item_id"]
    rid = request_id(request)
    return answer(
        await in_thread(responses.delete_item, cfg.store, who, ident, item_id, cfg.settings, rid)
    )


ROUTES = [
    Route("/v1/assistants", create_assistant, methods=["POST"]),
    Route("/v1/assistants", list_assistants, methods=["GET"]),
    Route("/v1/assistants/{assistant_id}", get_assistant, methods=["GET"]),
    Route("/v1/assistants/{assistant_id}", modify_assistant, methods=["POST"]),
    Route("/v1/assistants/{assistant_id}", delete_assistant, methods=["DELETE"]),
    Route("/v1/threads", create_thread, methods=["POST"]),
    Route("/v1/threads/runs", create_thread_and_run, methods=["POST"]),
    Route("/v1/threads/{thread_id}", get_thread, methods=["GET"]),
    Route("/v1/threads/{thread_id}", modify_thread, methods=["POST"]),
    Route("/v1/threads/{thread_id}", delete_thread, methods=["DELETE"]),
    Route("/v1/threads/{thread_id}/messages", create_message, methods=["POST"]),
    Route("/v1/threads/{thread_id}/messages", list_messages, methods=["GET"]),
    Route("/v1/threads/{thread_id}/messages/{message_id}", get_message, methods=["GET"]),
    Route("/v1/threads/{thread_id}/messages/{message_id}", keep_history, methods=["POST"]),
    Route("/v1/threads/{thread_id}/messages/{message_id}", delete_message, methods=["DELETE"]),
    Route("/v1/threads/{thread_id}/runs", create_run, methods=["POST"]),
    Route("/v1/threads/{thread_id}/runs", list_runs, methods=["GET"]),
    Route("/v1/threads/{thread_id}/runs/{run_id}", get_run, methods=["GET"]),
    Route("/v1/threads/{thread_id}/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
    Route(
        "/v1/threads/{thread_id}/runs/{run_id}/submit_tool_outputs",
        submit_tool_outputs,
        methods=["POST"],
    ),
    Route("/v1/threads/{thread_id}/runs/{run_id}/steps", list_steps, methods=["GET"]),
    Route("/v1/threads/{thread_id}/runs/{run_id}/steps/{step_id}", get_step, methods=["GET"]),
    Route("/v1/runs/{run_id}/events", run_events, methods=["GET"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", get_conversation, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", update_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", delete_conversation, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items", add_items, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", get_item, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", delete_item, methods=["DELETE"]),
]
