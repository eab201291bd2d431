"""``ScriptedModel``: a scripted, OpenAI-compatible model server for tests and the demo.

It answers ``POST /v1/responses`` (Responses API) and ``POST /v1/chat/completions`` in the
shapes the ``openai`` SDK parses, from scripts registered by name. A script is a list of
turns; a turn is ``{"text": ...}``, ``{"tool_calls": [{"name", "arguments"}, ...]}`` (several
calls = parallel calls), both, or a callable that gets the parsed history and returns one.

Design choices:

- **Stateless per conversation.** The first user message ``script:NAME ...`` picks the
  script (else ``default``); the turn to answer is the number of assistant turns already in
  the history. A re-sent request gets the same turn (with fresh ``call_`` ids, like OpenAI),
  so retries and replays behave as with a real provider. Past the end of a script it answers
  the script's last text turn, or "done".
- **Strict like OpenAI.** Histories are validated the way OpenAI does (orphan tool outputs,
  unanswered tool calls, duplicate outputs) and rejected with 400 and OpenAI's error JSON, so
  a malformed replay fails in tests exactly as it would in production.
- **Reasoning like a reasoning model.** A turn with ``"reasoning": true`` answers, over the
  Responses API, a ``reasoning`` item (``encrypted_content`` and a summary) before its
  message and calls; from then on a request that gives one of those calls back without
  that reasoning item, verbatim, before it in the same turn is refused with 400 and
  OpenAI's message, as a strict model would. Chat completions has no reasoning items.
- **A prefix cache like a provider's.** A request that carries a ``prompt_cache_key``
  reports as ``cached_tokens`` (``usage.input_tokens_details``, chat completions'
  ``usage.prompt_tokens_details``) the bytes its body shares from the start with the last
  request answered under that key, in tokens (``CHARS_PER_TOKEN``), at most its input
  tokens. A request without a key is never cached: what a run gains from its key shows.
- **A context window.** ``ModelFaults.context_window`` (tokens; 0: none) refuses a request
  whose tokens (its JSON's characters over ``ModelFaults.chars_per_token``, 4 unless set,
  as ``usage`` counts them) pass it, with 400 and OpenAI's ``context_length_exceeded``
  error; every request's tokens are in its audit record (``input_tokens``).
- **Summaries.** A request whose instructions are ``outbox.context.SUMMARY_INSTRUCTION``
  is answered with a summary naming the script and the assistant turns it covers; a
  history that starts with such a summary continues the script where it left off, so a
  compacted conversation answers as the whole one would.
- **Faults and audit behind one lock**, programmable in-process or over HTTP (``/_script``,
  ``/_faults``, ``/_audit``) for out-of-process tests.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from outbox import context
from outbox.testing.server import (
    FakeServer,
    HttpError,
    Reply,
    Request,
    canonical_json,
    dropped,
    json_reply,
    serve_main,
)

RESPONSES_PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
DEFAULT_SCRIPT = "default"
SCRIPT_PREFIX = "script:"
FALLBACK_TEXT = "done"
CHARS_PER_TOKEN = 4  # characters of JSON per token: the usual rough estimate
ID_HEX_BYTES = 12  # random bytes in generated ids (24 hex characters)

TOOL_WITHOUT_CALL = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
    "message with 'tool_calls'."
)
CALLS_WITHOUT_TOOL = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding "
    "to each 'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
OUTPUT_WITHOUT_CALL = "No tool call found for function call output with call_id {call_id}."
CALL_WITHOUT_OUTPUT = "No tool output found for function call {call_id}."
DUPLICATE_OUTPUT = "Duplicate function call output for call_id {call_id}."
TOO_LONG = (
    "This model's maximum context length is {window} tokens. However, your messages "
    "resulted in {tokens} tokens. Please reduce the length of the messages."
)
SUMMARY_TURNS = "turns:"  # in a scripted summary: the assistant turns it covers
CALL_WITHOUT_REASONING = (
    "Item '{call_id}' of type 'function_call' was provided without its required "
    "'reasoning' item: '{reasoning_id}'."
)

Endpoint = Literal["responses", "chat.completions"]
HistoryKind = Literal["system", "user", "assistant", "tool_call", "tool_output"]


class ToolCallSpec(BaseModel):
    """One tool call of a scripted turn; string ``arguments`` are sent verbatim."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class TurnSpec(BaseModel):
    """A scripted model turn: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    reasoning: bool = False  # a reasoning item before the output (Responses API only)

    @model_validator(mode="after")
    def _not_empty(self) -> TurnSpec:
        if self.text is None and not self.tool_calls:
            raise ValueError("a turn needs 'text' or 'tool_calls'")
        return self


@dataclass(frozen=True)
class HistoryItem:
    """One item of a request's history, the same for both APIs.

    ``text`` holds message text or a tool output; ``arguments`` is the raw JSON string.
    """

    kind: HistoryKind
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


TurnFn = Callable[[list[HistoryItem]], Mapping[str, Any]]
Turn = Mapping[str, Any] | TurnFn


class ModelFaults(BaseModel):
    """Fault knobs; counters are consumed one per model request (control paths excluded)."""

    model_config = ConfigDict(extra="forbid")

    latency_s: float = 0.0  # seconds added to every model request
    latencies_s: list[float] = Field(default_factory=list)  # seconds, one popped per request
    fail_next: int = 0  # the next N requests answer ``fail_status``
    fail_status: int = 429
    retry_after_s: float = 1.0  # seconds, sent as ``retry-after`` on 429/503
    drop_next: int = 0  # the next N requests get the connection closed, no answer
    # A server that is down: while not 0, every model request answers this status (OpenAI's
    # error JSON, no ``retry-after``), however many come; 0 again: it is back.
    down_status: int = 0
    context_window: int = 0  # tokens a request may hold (0: any); past it, 400
    chars_per_token: float = CHARS_PER_TOKEN  # of a request's JSON, for its input tokens


@dataclass(frozen=True)
class ModelRequest:
    """Audit record of one model request (``status`` None = connection dropped)."""

    endpoint: Endpoint
    model: str | None
    script: str | None
    turn_index: int | None
    history: list[HistoryItem]
    status: int | None
    response: Any
    at: float  # seconds since the epoch
    tools: list[Any] = field(default_factory=list)  # the request's tool list, as sent
    body: dict[str, Any] = field(default_factory=dict)  # the whole request, as sent
    traceparent: str | None = None  # the W3C trace context the request carried
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    raw: str = ""  # the body's bytes as sent (UTF-8)
    cached_tokens: int = 0  # what the answer reported as read from the prefix cache
    input_tokens: int = 0  # the request's tokens, as its answer's usage counts them

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def openai_error(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpError:
    """An ``HttpError`` whose body has OpenAI's error shape."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return HttpError(status, body, headers)


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(ID_HEX_BYTES)


def _tokens(value: Any) -> int:
    return -(-len(canonical_json(value)) // CHARS_PER_TOKEN)


def _shared_prefix(a: bytes, b: bytes) -> int:
    """How many bytes ``a`` and ``b`` share from the start (a binary search of slices)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _text_of(content: Any) -> str:
    """Text of a message content: a string or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _message_kind(role: Any) -> HistoryKind:
    if role in ("system", "developer"):
        return "system"
    if role == "assistant":
        return "assistant"
    return "user"


def _responses_history(body: Mapping[str, Any]) -> list[HistoryItem]:
    raw = body.get("input")
    items: list[HistoryItem] = []
    if isinstance(body.get("instructions"), str):
        items.append(HistoryItem("system", body["instructions"]))
    if isinstance(raw, str):
        return [*items, HistoryItem("user", raw)]
    if not isinstance(raw, list):
        raise openai_error(
            400,
            "Missing required parameter: 'input'.",
            param="input",
            code="missing_required_parameter",
        )
    for entry in raw:
        if not isinstance(entry, dict):
            raise openai_error(400, "Invalid type for 'input': expected objects.", param="input")
        kind = entry.get("type", "message")
        if kind == "message":
            items.append(HistoryItem(_message_kind(entry.get("role")), _text_of(entry["content"])))
        elif kind == "function_call":
            items.append(
                HistoryItem(
                    "tool_call",
                    call_id=entry.get("call_id"),
                    name=entry.get("name"),
                    arguments=entry.get("arguments"),
                )
            )
        elif kind == "function_call_output":
            items.append(
                HistoryItem("tool_output", _text_of(entry.get("output")), entry.get("call_id"))
            )
        # other item types (reasoning, item_reference, ...) carry nothing a script needs
    return items


def _validate_responses(history: Sequence[HistoryItem]) -> None:
    """Reject what OpenAI rejects: orphan outputs, unanswered calls, duplicate outputs."""
    called: set[str | None] = set()
    answered: set[str | None] = set()
    pending: list[str | None] = []
    for item in history:
        if item.kind == "tool_call":
            called.add(item.call_id)
            pending.append(item.call_id)
        elif item.kind == "tool_output":
            if item.call_id in answered:
                raise openai_error(
                    400, DUPLICATE_OUTPUT.format(call_id=item.call_id), param="input"
                )
            if item.call_id not in called:
                raise openai_error(
                    400, OUTPUT_WITHOUT_CALL.format(call_id=item.call_id), param="input"
                )
            answered.add(item.call_id)
            pending.remove(item.call_id)
        elif pending:
            raise openai_error(400, CALL_WITHOUT_OUTPUT.format(call_id=pending[0]), param="input")
    if pending:
        raise openai_error(400, CALL_WITHOUT_OUTPUT.format(call_id=pending[0]), param="input")


def _responses_turns_done(history: Sequence[HistoryItem]) -> int:
    """Assistant turns so far: maximal runs of assistant messages and tool calls."""
    turns, in_turn = 0, False
    for item in history:
        is_assistant = item.kind in ("assistant", "tool_call")
        if is_assistant and not in_turn:
            turns += 1
        in_turn = is_assistant
    return turns


def _chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise openai_error(
            400,
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    return messages


def _chat_history(messages: Sequence[Mapping[str, Any]]) -> list[HistoryItem]:
    items: list[HistoryItem] = []
    for message in messages:
        role, text = message.get("role"), _text_of(message.get("content"))
        if role == "tool":
            items.append(HistoryItem("tool_output", text, message.get("tool_call_id")))
            continue
        if role != "assistant" or text:
            items.append(HistoryItem(_message_kind(role), text))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            items.append(
                HistoryItem(
                    "tool_call",
                    call_id=call.get("id"),
                    name=function.get("name"),
                    arguments=function.get("arguments"),
                )
            )
    return items


def _validate_chat(messages: Sequence[Mapping[str, Any]]) -> None:
    """Tool messages must answer, right after it, every call of the assistant message."""
    pending: list[Any] = []
    owner = 0

    def check_answered() -> None:
        if pending:
            ids = ", ".join(str(call_id) for call_id in pending)
            raise openai_error(
                400, CALLS_WITHOUT_TOOL.format(ids=ids), param=f"messages.[{owner}].role"
            )

    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in pending:
                raise openai_error(400, TOOL_WITHOUT_CALL, param=f"messages.[{index}].role")
            pending.remove(message.get("tool_call_id"))
            continue
        check_answered()
        if message.get("role") == "assistant" and message.get("tool_calls"):
            pending = [call.get("id") for call in message["tool_calls"]]
            owner = index
    check_answered()


def _arguments_json(call: ToolCallSpec) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _check_reasoning(body: Mapping[str, Any], issued: Mapping[str, dict[str, Any]]) -> None:
    """Refuse a function call of ours given back without the reasoning item we answered
    before it (``issued``: by call id), verbatim, earlier in the same turn (since the last
    user message or function output)."""
    seen: dict[str, Any] = {}
    for entry in body.get("input") or []:
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type", "message")
        if kind == "reasoning":
            seen[str(entry.get("id"))] = entry
        elif kind == "function_call_output" or (
            kind == "message" and entry.get("role") != "assistant"
        ):
            seen = {}
        elif kind == "function_call" and entry.get("call_id") in issued:
            needed = issued[entry["call_id"]]
            if seen.get(needed["id"]) != needed:
                message = CALL_WITHOUT_REASONING.format(
                    call_id=entry["call_id"], reasoning_id=needed["id"]
                )
                raise openai_error(400, message, param="input")


def _reasoning_item(turn: TurnSpec) -> dict[str, Any]:
    """A reasoning item as a reasoning model answers it: opaque content, a summary."""
    return {
        "type": "reasoning",
        "id": _new_id("rs_"),
        "encrypted_content": "gAAAA" + secrets.token_urlsafe(48),
        "summary": [{"type": "summary_text", "text": f"Thinking about {turn.tool_calls!r}."}],
    }


def _responses_answer(body: Mapping[str, Any], turn: TurnSpec, cached: int = 0) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if turn.reasoning:
        output.append(_reasoning_item(turn))
    if turn.text is not None:
        output.append(
            {
                "type": "message",
                "id": _new_id("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
            }
        )
    for call in turn.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": _new_id("fc_"),
                "call_id": _new_id("call_"),
                "name": call.name,
                "arguments": _arguments_json(call),
                "status": "completed",
            }
        )
    input_tokens, output_tokens = _tokens(body), _tokens(output)
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": min(cached, input_tokens)},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def _chat_answer(body: Mapping[str, Any], turn: TurnSpec, cached: int = 0) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn.text,
        "refusal": None,
        "annotations": [],
    }
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": _new_id("call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_json(call)},
            }
            for call in turn.tool_calls
        ]
    prompt_tokens, completion_tokens = _tokens(body), _tokens(message)
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt_tokens)},
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _failure(status: int, retry_after_s: float) -> Reply:
    if status == 429:
        error = openai_error(
            429,
            "Rate limit reached for requests (fake). Please try again later.",
            type_="requests",
            code="rate_limit_exceeded",
        )
    else:
        error = openai_error(
            status,
            "The server had an error while processing your request. Sorry about that!",
            type_="server_error",
        )
    headers = {}
    if status in (429, 503) and retry_after_s > 0:
        headers = {
            "retry-after": f"{retry_after_s:g}",
            "retry-after-ms": str(int(retry_after_s * 1000)),
        }
    return json_reply(status, error.body, headers)


class ScriptedModel(FakeServer):
    """An OpenAI-compatible model server answering from named scripts.

    Parameters
    ----------
    scripts:
        ``{name: turns}`` registered at start; more with ``add_script``.
    default:
        Turns of the ``default`` script (used when no ``script:NAME`` selects one);
        without it the default script answers "done".
    faults:
        Initial ``ModelFaults`` (or a mapping of its fields).
    prefix_cache:
        Report the prefix a request shares with its ``prompt_cache_key``'s last one as
        cached (False: nothing is ever cached, as for requests without a key).

    Example
    -------
    >>> with ScriptedModel({"t": [{"tool_calls": [{"name": "noop"}]}, {"text": "ok"}]}) as m:
    ...     client = openai.OpenAI(base_url=m.url + "/v1", api_key="x", max_retries=0)
    """

    def __init__(
        self,
        scripts: Mapping[str, Sequence[Turn]] | None = None,
        *,
        default: Sequence[Turn] | None = None,
        faults: ModelFaults | Mapping[str, Any] | None = None,
        prefix_cache: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host, port)
        self.prefix_cache = prefix_cache  # False: a provider that caches nothing
        self._scripts: dict[str, list[TurnSpec | TurnFn]] = {}
        self._faults = ModelFaults.model_validate(faults or {})
        self._requests: list[ModelRequest] = []
        # The reasoning item answered before each call, by call id: required back with it.
        self._reasoning: dict[str, dict[str, Any]] = {}
        # The body of the last request answered under each prompt_cache_key.
        self._cache: dict[str, bytes] = {}
        self.add_script(DEFAULT_SCRIPT, default or [{"text": FALLBACK_TEXT}])
        for name, turns in (scripts or {}).items():
            self.add_script(name, turns)

    # -- programming it -----------------------------------------------------------------

    def add_script(self, name: str, turns: Sequence[Turn]) -> None:
        """Register (or replace) a script; static turns are validated now."""
        parsed: list[TurnSpec | TurnFn] = [
            turn if callable(turn) else TurnSpec.model_validate(turn) for turn in turns
        ]
        with self.lock:
            self._scripts[name] = parsed

    def set_faults(self, **changes: Any) -> None:
        """Change some ``ModelFaults`` fields, e.g. ``set_faults(latency_s=0.2)``."""
        with self.lock:
            self._faults = ModelFaults.model_validate({**self._faults.model_dump(), **changes})

    def fail_next(self, n: int, status: int = 429, retry_after_s: float = 1.0) -> None:
        """The next ``n`` model requests answer ``status`` (429 carries ``retry-after``)."""
        self.set_faults(fail_next=n, fail_status=status, retry_after_s=retry_after_s)

    def down(self, status: int = 503) -> None:
        """Answer every model request ``status`` until ``up`` (a provider that is down)."""
        self.set_faults(down_status=status)

    def up(self) -> None:
        """Answer model requests again (after ``down``)."""
        self.set_faults(down_status=0)

    def drop_next(self, n: int) -> None:
        """The next ``n`` model requests get their connection closed without an answer."""
        self.set_faults(drop_next=n)

    @property
    def faults(self) -> ModelFaults:
        with self.lock:
            return self._faults.model_copy(deep=True)

    @property
    def requests(self) -> list[ModelRequest]:
        """Every model request received so far, oldest first."""
        with self.lock:
            return list(self._requests)

    def clear_audit(self) -> None:
        with self.lock:
            self._requests.clear()

    # -- serving ------------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        route = (request.method, request.path)
        if route == ("POST", RESPONSES_PATH):
            return self._model_call("responses", request)
        if route == ("POST", CHAT_PATH):
            return self._model_call("chat.completions", request)
        if route == ("GET", "/_audit"):
            return json_reply(200, {"requests": [r.to_json() for r in self.requests]})
        if route == ("POST", "/_script"):
            body = request.json_object()
            try:
                self.add_script(str(body["name"]), body["turns"])
            except (KeyError, TypeError, ValidationError) as exc:
                raise openai_error(400, f"bad script: {exc}") from exc
            return json_reply(200, {"ok": True})
        if route == ("POST", "/_faults"):
            try:
                self.set_faults(**request.json_object())
            except ValidationError as exc:
                raise openai_error(400, f"bad faults: {exc}") from exc
            return json_reply(200, self.faults.model_dump())
        raise openai_error(404, f"Invalid URL ({request.method} {request.path})")

    def _take_faults(self) -> tuple[float, str | None, int, float]:
        """Consume this request's share of the faults: (delay_s, action, status, retry_s)."""
        with self.lock:
            faults = self._faults
            delay_s = faults.latencies_s.pop(0) if faults.latencies_s else faults.latency_s
            action = None
            if faults.drop_next > 0:
                faults.drop_next -= 1
                action = "drop"
            elif faults.fail_next > 0:
                faults.fail_next -= 1
                action = "fail"
            elif faults.down_status:
                return delay_s, "fail", faults.down_status, 0.0
            return delay_s, action, faults.fail_status, faults.retry_after_s

    def _model_call(self, endpoint: Endpoint, request: Request) -> Reply:
        delay_s, action, fail_status, retry_after_s = self._take_faults()
        faults = self.faults
        context_window, chars_per_token = faults.context_window, faults.chars_per_token
        input_tokens = 0
        if delay_s > 0:
            time.sleep(delay_s)  # simulated model latency
        body: dict[str, Any] = {}
        history: list[HistoryItem] = []
        script = turn_index = None
        cached = 0
        try:
            body = request.json_object()
            if endpoint == "responses":
                history = _responses_history(body)
            else:
                messages = _chat_messages(body)
                history = _chat_history(messages)
            if action == "drop":
                reply = dropped()
            elif action == "fail":
                reply = _failure(fail_status, retry_after_s)
            else:
                if not isinstance(body.get("model"), str):
                    raise openai_error(
                        400,
                        "Missing required parameter: 'model'.",
                        param="model",
                        code="missing_required_parameter",
                    )
                input_tokens = math.ceil(len(canonical_json(body)) / chars_per_token)
                if 0 < context_window < input_tokens:
                    raise openai_error(
                        400,
                        TOO_LONG.format(window=context_window, tokens=input_tokens),
                        param="input" if endpoint == "responses" else "messages",
                        code=context.CONTEXT_LENGTH_EXCEEDED,
                    )
                if endpoint == "responses":
                    _validate_responses(history)
                    with self.lock:
                        issued = dict(self._reasoning)
                    _check_reasoning(body, issued)
                    turn_index = _responses_turns_done(history)
                else:
                    _validate_chat(messages)
                    turn_index = sum(1 for m in messages if m.get("role") == "assistant")
                turn_index += _summarised_turns(history)
                script = self._script_name(history)
                if history and history[0] == HistoryItem("system", context.SUMMARY_INSTRUCTION):
                    turn = _summary_turn(script, turn_index, history)
                else:
                    turn = self._turn(script, turn_index, history)
                cached = self._cached_tokens(body, request.body)
                answer = (_responses_answer if endpoint == "responses" else _chat_answer)(
                    body, turn, cached
                )
                if endpoint == "responses":
                    self._keep_reasoning(answer["output"])
                _count_input(answer, input_tokens)
                reply = json_reply(200, answer)
        except HttpError as exc:
            reply = Reply(exc.status, exc.body, exc.headers)
        record = ModelRequest(
            endpoint=endpoint,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            script=script,
            turn_index=turn_index,
            history=history,
            status=None if reply.drop else reply.status,
            response=reply.body,
            at=time.time(),
            tools=list(body.get("tools") or []) if isinstance(body.get("tools"), list) else [],
            body=body,
            traceparent=request.headers.get("traceparent"),
            headers=dict(request.headers),
            raw=request.body.decode("utf-8", "replace"),
            cached_tokens=cached,
            input_tokens=input_tokens or (_tokens(body) if body else 0),
        )
        with self.lock:
            self._requests.append(record)
        return reply

    def _cached_tokens(self, body: Mapping[str, Any], raw: bytes) -> int:
        """The tokens of ``raw`` its key's last request shared from the start (0 without a
        key); this request becomes the key's last."""
        key = body.get("prompt_cache_key")
        if not isinstance(key, str) or not self.prefix_cache:
            return 0
        with self.lock:
            last, self._cache[key] = self._cache.get(key, b""), raw
        return _shared_prefix(last, raw) // CHARS_PER_TOKEN

    def _keep_reasoning(self, output: list[dict[str, Any]]) -> None:
        reasoning = None
        with self.lock:
            for item in output:
                if item["type"] == "reasoning":
                    reasoning = item
                elif item["type"] == "function_call" and reasoning is not None:
                    self._reasoning[item["call_id"]] = reasoning

    def _script_name(self, history: Sequence[HistoryItem]) -> str:
        first_user = next((item.text for item in history if item.kind == "user"), "")
        first_user = first_user.removeprefix(context.SUMMARY_PREFIX)
        if not first_user.startswith(SCRIPT_PREFIX):
            return DEFAULT_SCRIPT
        words = first_user[len(SCRIPT_PREFIX) :].split(maxsplit=1)
        return words[0] if words else DEFAULT_SCRIPT

    def _turn(self, script: str, index: int, history: list[HistoryItem]) -> TurnSpec:
        with self.lock:
            turns = list(self._scripts.get(script, ()))
            known = sorted(self._scripts)
        if not turns:
            raise openai_error(400, f"Unknown script {script!r} (fake model); known: {known}")
        if index < len(turns):
            turn = turns[index]
            if isinstance(turn, TurnSpec):
                return turn
            try:
                return TurnSpec.model_validate(turn(list(history)))
            except ValidationError as exc:
                raise openai_error(500, f"script {script!r} turn {index}: {exc}") from exc
        for past in reversed(turns):
            if isinstance(past, TurnSpec) and past.text is not None:
                return TurnSpec(text=past.text)
        return TurnSpec(text=FALLBACK_TEXT)


def _count_input(answer: dict[str, Any], input_tokens: int) -> None:
    """Put the request's input tokens, as counted with ``chars_per_token``, in the usage."""
    usage = answer["usage"]
    key = "input_tokens" if "input_tokens" in usage else "prompt_tokens"
    usage["total_tokens"] += input_tokens - usage[key]
    usage[key] = input_tokens


def _summarised_turns(history: Sequence[HistoryItem]) -> int:
    """The assistant turns a scripted summary at the head of ``history`` covers."""
    first_user = next((item.text for item in history if item.kind == "user"), "")
    if not first_user.startswith(context.SUMMARY_PREFIX):
        return 0
    for word in first_user.split():
        if word.startswith(SUMMARY_TURNS) and word[len(SUMMARY_TURNS) :].isdigit():
            return int(word[len(SUMMARY_TURNS) :])
    return 0


def _summary_turn(script: str, turns: int, history: Sequence[HistoryItem]) -> TurnSpec:
    """The answer to a summary request: the script and the assistant turns covered (the
    request's own trailing user message is not a turn), and the tools called."""
    called = sorted({item.name or "" for item in history if item.kind == "tool_call"})
    text = (
        f"{SCRIPT_PREFIX}{script} {SUMMARY_TURNS}{turns} called {', '.join(called) or 'no tool'}."
    )
    return TurnSpec(text=text)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m outbox.testing.scripted_model --port N``: serve until SIGTERM."""
    return serve_main(
        lambda host, port: ScriptedModel(host=host, port=port),
        "Scripted OpenAI-compatible model server (scripts via POST /_script).",
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
