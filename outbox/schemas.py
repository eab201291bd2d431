"""Inputs of the writer API, validated at the boundary with pydantic.

Anything a backend, the relay or an import hands to the writer passes through these models:
ids have a fixed shape, JSON must parse, sizes are capped with an error that names the
field, its size and the limit, and text or JSON that PostgreSQL cannot store (a NUL, a lone
surrogate, NaN, nesting past ``outbox.storable.MAX_DEPTH``) is refused naming the problem.
Once past this layer, the database constraints take over.
"""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from outbox import config, storable, trace_context
from outbox.errors import PayloadTooLarge

TenantId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")]
ProviderCallId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
ToolName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # a tool's name, and a format's


def url_problem(value: str) -> str | None:
    """Why ``value`` is not an absolute http(s) URL with a host, or None when it is one."""
    if any(c.isspace() or not c.isprintable() for c in value):
        return f"{value!r} is not a URL (it holds spaces or control characters)"
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        ok = False
    if not ok:
        return f"{value!r} is not an http:// or https:// URL with a host"
    return None


def check_size(what: str, value: str | None) -> None:
    """Raise ``PayloadTooLarge`` when ``value`` is over ``MAX_PAYLOAD_BYTES`` encoded."""
    if value is None:
        return
    size = len(value.encode("utf-8", "surrogatepass"))  # a lone one is storable's to refuse
    if size > config.MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the cap of {config.MAX_PAYLOAD_BYTES} bytes",
            hint="shorten it, store large data elsewhere and pass a reference, or raise "
            "OUTBOX_MAX_PAYLOAD_BYTES",
        )


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewMessage(_In):
    role: Literal["system", "user", "assistant"]
    content: str

    @field_validator("content")
    @classmethod
    def _cap(cls, value: str) -> str:
        storable.check_text("message content", value)
        check_size("message content", value)
        return value


# -- what a run passes to its model beside the history ------------------------------------

TOOL_CHOICE_MODES = ("none", "auto", "required")
FORMAT_FIELDS = ("type", "name", "schema", "strict", "description")
TOOL_CHOICE_HINT = (
    "give 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": NAME} naming one "
    "of the tools (hosted, MCP and allowed_tools choices are not supported)"
)
FORMAT_HINT = (
    'give {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name": '
    'NAME, "schema": {...}, "strict": true}'
)


def tool_choice_of(value: Any) -> str | dict[str, str]:
    """``tool_choice`` as the Responses API writes it: ``none``, ``auto``, ``required`` or
    ``{"type": "function", "name": ...}`` (chat completions' ``{"type": "function",
    "function": {"name": ...}}`` is read as the same); ValueError saying what to give."""
    if isinstance(value, str) and value in TOOL_CHOICE_MODES:
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        nested = value.get("function")
        name = nested.get("name") if isinstance(nested, dict) else value.get("name")
        if isinstance(name, str) and TOOL_NAME.match(name):
            return {"type": "function", "name": name}
    raise ValueError(f"{value!r:.200} is not a tool choice outbox passes on: {TOOL_CHOICE_HINT}")


def text_format_of(value: Any) -> dict[str, Any]:
    """The format of the model's answer as the Responses API's ``text.format`` writes it:
    ``text``, ``json_object``, or ``json_schema`` with its ``name``, ``schema`` and optional
    ``strict`` and ``description`` (chat completions' ``response_format``, with the schema's
    fields under ``json_schema``, is read as the same); ValueError saying what to give."""
    if isinstance(value, dict) and value.get("type") == "json_schema" and "json_schema" in value:
        nested = value["json_schema"]
        extra = set(value) - {"type", "json_schema"}
        if not isinstance(nested, dict) or extra:
            raise ValueError(
                f"a json_schema response_format holds only 'json_schema'; {FORMAT_HINT}"
            )
        value = {"type": "json_schema", **nested}
    if not isinstance(value, dict) or value.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise ValueError(f"{value!r:.200} is not a format outbox passes on: {FORMAT_HINT}")
    kind = value["type"]
    allowed = FORMAT_FIELDS if kind == "json_schema" else ("type",)
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(
            f"a {kind} format has no field {', '.join(map(repr, unknown))}; {FORMAT_HINT}"
        )
    if kind != "json_schema":
        return {"type": kind}
    name, schema = value.get("name"), value.get("schema")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ValueError(
            "a json_schema format needs a 'name' of 1-64 letters, digits, _ and -; " + FORMAT_HINT
        )
    if not isinstance(schema, dict):
        raise ValueError(
            f"a json_schema format needs a 'schema' (a JSON Schema object); {FORMAT_HINT}"
        )
    if not isinstance(value.get("strict", False), bool | None):
        raise ValueError("'strict' of a json_schema format is true or false")
    if not isinstance(value.get("description", ""), str | None):
        raise ValueError("'description' of a json_schema format is text")
    return {k: value[k] for k in FORMAT_FIELDS if value.get(k) is not None}


Includable = Literal[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "file_search_call.results",
    "web_search_call.action.sources",
    "web_search_call.results",
]
MAX_IDENTIFIER_CHARS = 64  # OpenAI's cap on safety_identifier; prompt_cache_key alike


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]
Tokens = Annotated[int, Field(gt=0)]
TopLogprobs = Annotated[int, Field(ge=0, le=20)]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
Truncation = Literal["auto", "disabled"]
CacheRetention = Literal["in-memory", "24h"]
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=MAX_IDENTIFIER_CHARS)]


class Reasoning(_In):
    """What a reasoning model is asked: how hard to think, and the summary to give."""

    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TruncationStrategy(_In):
    """The Assistants API's ``truncation_strategy``: ``auto``, or the last N messages."""

    type: Literal["auto", "last_messages"]
    last_messages: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _counted(self) -> TruncationStrategy:
        if (self.type == "last_messages") != (self.last_messages is not None):
            raise ValueError("'last_messages' is given with type 'last_messages', and only then")
        return self


class ModelOptions(_In):
    """What a run passes to its model beside the history and the tools, in the Responses
    API's terms (``outbox.providers`` writes them in each API's shape). Sent on every
    model turn of the run as given and never enforced here: the model follows them, as
    it would called directly. None leaves a field to the model's default.

    Two kinds are kept but not sent: ``max_tool_calls`` (the relay enforces it: calls a
    turn asks past it are not made, ``outbox.providers.calls_left``) and the context
    budget (``truncation``, ``max_prompt_tokens``, ``truncation_strategy``: how much
    history a turn may carry, the relay's to apply, never the provider's)."""

    tool_choice: str | dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: Tokens | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: Identifier | None = None
    prompt_cache_retention: CacheRetention | None = None
    safety_identifier: Identifier | None = None
    user: Identifier | None = None
    top_logprobs: TopLogprobs | None = None
    include: list[Includable] | None = Field(default=None, max_length=16)
    max_tool_calls: Tokens | None = None
    truncation: Truncation | None = None
    max_prompt_tokens: Tokens | None = None
    truncation_strategy: TruncationStrategy | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice(cls, value: Any) -> str | dict[str, str] | None:
        return None if value is None else tool_choice_of(value)

    @field_validator("format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        checked = text_format_of(value)
        check_size("the format", storable.dumps(checked, "the format"))
        return checked

    def stored(self) -> dict[str, Any]:
        """The options as ``runs.model_options`` keeps them (the fields given)."""
        return self.model_dump(exclude_none=True)

    @field_validator("include")
    @classmethod
    def _once_each(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else sorted(set(value))

    def check_tools(self, tools: list[str]) -> None:
        """ValueError when ``tool_choice`` forces a function that is not one of ``tools``,
        or asks for a call (``required``) with no tools at all: no model could follow it."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice["name"] not in tools:
            raise ValueError(
                f"tool_choice forces the function {choice['name']!r}, which is not one of the "
                f"tools ({', '.join(sorted(tools)) or 'none'}); declare it in 'tools' or "
                "choose another"
            )
        if choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs at least one tool in 'tools'")


class StartRun(_In):
    """A user turn that starts a run on a thread."""

    tenant_id: TenantId
    thread_id: uuid.UUID
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    message: str | None = None
    tools: list[ToolName] = Field(default_factory=list, max_length=128)
    api: Literal["responses", "chat"] = "responses"
    base_url: str | None = None
    instructions: str | None = None
    # None: the database's default (outbox.run_defaults), the one start_run_v1 gives SQL
    # callers too, so both entry points make the same run from the same settings.
    max_steps: int | None = Field(default=None, gt=0, le=10_000)
    max_tokens: int | None = Field(default=None, gt=0)
    max_cost: Decimal | None = Field(default=None, gt=0)  # in money, by model_prices
    loop_limit: int | None = Field(default=None, gt=1)
    action_timeout_s: float | None = Field(default=None, gt=0)
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    correlation_id: Annotated[str, StringConstraints(max_length=255)] | None = None
    model_options: ModelOptions = Field(default_factory=lambda: ModelOptions())
    # The W3C trace context the run continues (outbox.trace_context). None: the span current
    # where the writer is called, if there is one.
    traceparent: str | None = None
    tracestate: (
        Annotated[str, StringConstraints(max_length=trace_context.MAX_TRACESTATE)] | None
    ) = None

    @model_validator(mode="after")
    def _followable(self) -> StartRun:
        self.model_options.check_tools(self.tools)
        return self

    @field_validator("traceparent")
    @classmethod
    def _traceparent(cls, value: str | None) -> str | None:
        if value is not None and not trace_context.TRACEPARENT.fullmatch(value):
            raise ValueError(
                "a W3C traceparent is 00-<32 hex digits, trace id>-<16 hex digits, parent "
                f"id>-<2 hex digits, flags>, lower case, ids not all zero; not {value!r}"
            )
        return value

    @field_validator("message", "instructions")
    @classmethod
    def _cap(cls, value: str | None, info: ValidationInfo) -> str | None:
        storable.check_text(str(info.field_name), value)
        check_size("message", value)
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        problem = None if value is None else url_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class Retarget(_In):
    """What a run waiting for client outputs sends its model from its next turn on
    (``lifecycle.retarget_run``): the model, the tools, the instructions and the model
    options, all given (a field left out is the default, not the run's current value)."""

    tenant_id: TenantId
    run_id: uuid.UUID
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    tools: list[ToolName] = Field(default_factory=list, max_length=128)
    instructions: str | None = None
    model_options: ModelOptions = Field(default_factory=lambda: ModelOptions())

    @field_validator("instructions")
    @classmethod
    def _cap(cls, value: str | None) -> str | None:
        storable.check_text("instructions", value)
        check_size("instructions", value)
        return value

    @model_validator(mode="after")
    def _followable(self) -> Retarget:
        self.model_options.check_tools(self.tools)
        return self


OMITTED_ARGUMENTS = "{}"  # what is kept of arguments over the size cap


class ToolCallIn(_In):
    """One call the model asked for; ``arguments`` is the raw JSON text the model produced.

    Arguments over ``MAX_PAYLOAD_BYTES`` are the model's mistake, not the caller's: they
    are not kept (``arguments`` becomes ``"{}"``, ``arguments_over_cap_bytes`` their size)
    and the writer answers the call with an error result the model sees, as it does for
    arguments that fail the tool's schema, so the run goes on.
    """

    tool_call_id: ProviderCallId
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    arguments: str
    arguments_over_cap_bytes: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _omit_oversized(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "arguments" not in data:
            return data
        text = data["arguments"]
        if not isinstance(text, str):
            text = json.dumps(text)
        size = len(text.encode())
        if size > config.MAX_PAYLOAD_BYTES:
            return {**data, "arguments": OMITTED_ARGUMENTS, "arguments_over_cap_bytes": size}
        return {**data, "arguments": text}

    @field_validator("arguments")
    @classmethod
    def _cap(cls, value: str) -> str:
        storable.check_text("tool call arguments", value)
        check_size("tool call arguments", value)
        return value


class ModelTurnIn(_In):
    """The response of one model turn, as the relay (or a backend) records it."""

    tenant_id: TenantId
    run_id: uuid.UUID
    step_no: int = Field(gt=0)
    content: str | None = None
    tool_calls: list[ToolCallIn] = Field(
        default_factory=list, max_length=config.MAX_TOOL_CALLS_PER_TURN
    )
    # The reasoning items a Responses API model answered before its message and calls,
    # verbatim: given back to it before them on the next turn (None: there were none).
    reasoning: list[dict[str, Any]] | None = None
    response_id: str | None = None
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)  # of input_tokens, served from a cache
    # What answered the turn, when not the run's own model (a fallback's, a routing rule's:
    # outbox.routing), and why (``route``: journaled with the turn).
    model: str | None = None
    base_url: str | None = None
    route: dict[str, Any] | None = None

    @field_validator("content")
    @classmethod
    def _cap(cls, value: str | None) -> str | None:
        storable.check_text("assistant message", value)
        check_size("assistant message", value)
        return value

    @field_validator("reasoning")
    @classmethod
    def _cap_reasoning(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if not value:
            return None
        check_size("the reasoning before an assistant message", storable.dumps(value, "reasoning"))
        return value

    @field_validator("tool_calls")
    @classmethod
    def _unique_ids(cls, calls: list[ToolCallIn]) -> list[ToolCallIn]:
        ids = [c.tool_call_id for c in calls]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tool_call_id repeated within one turn: {ids}")
        return calls


class ToolResultIn(_In):
    """The outcome of one tool call: ``ok`` with a JSON output, or ``error`` with a message."""

    tenant_id: TenantId
    tool_call_ref: int = Field(gt=0)
    status: Literal["ok", "error"]
    output: Any = None
    error: str | None = None
    source: Literal["relay", "client", "lookup", "operator", "validation", "system"] = "relay"
    attempt: int = Field(default=0, ge=0)
    worker: str | None = None

    @field_validator("error")
    @classmethod
    def _cap_error(cls, value: str | None) -> str | None:
        storable.check_text("tool error", value)
        check_size("tool error", value)
        return value

    def model_post_init(self, _context: Any) -> None:
        check_size("tool result output", storable.dumps(self.output, "tool result output"))
        if self.status == "error" and not self.error:
            raise ValueError("an error result needs an error message")
