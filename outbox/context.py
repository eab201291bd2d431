"""What a model turn may send: the model catalogue, a run's prompt budget, and the window.

A model takes a bounded context (its window, ``model_catalogue``), and a long run's thread
outgrows it. This module decides what of a thread the model sees, from data alone (no
database, no HTTP: the relay's preparer and its model executor call it):

- **the budget** (``budget``): the tokens a request of the run may hold. The run's own
  ``max_prompt_tokens`` (its model options), else its tenant's (``tenant_budgets``), else
  the platform's (``run_defaults``), else the catalogue's window minus the model's most
  output tokens (``DEFAULT_WINDOW`` and ``DEFAULT_MAX_OUTPUT`` for a model not in it);
- **the estimate** (``estimate``): a request's tokens as its JSON's characters over
  ``CHARS_PER_TOKEN``, the usual rough count. A cheap bound (the text of the messages)
  comes first, so a run far inside its budget never serialises its request to know it.
  The model's own count of the previous turn plus the items since (``reported``) is the
  other estimate, for a model whose tokens are shorter than four characters; the larger
  of the two counts;
- **the mode** (``mode``): ``compact`` (the default; Responses' ``truncation: "auto"``)
  summarises the oldest turns when the next request would pass the budget; ``disabled``
  (``truncation: "disabled"``) sends the whole thread and a request past the window fails
  the run with the model's own error, as OpenAI does; ``last_messages`` (an Assistants
  run's ``truncation_strategy``) sends the last N messages and no summary;
- **the cut** (``cut``): where the oldest turns end. Only at a turn boundary, before a
  message that is not a tool result, so a call and its result are never parted;
- **results past a cap** (``cap_results``): a tool result longer than its tool's
  ``model_result_cap`` (``RESULT_CAP_BYTES`` unless the registry says otherwise, 0: no
  cap) reaches the model as its first part, a handle and a note saying how to read the
  rest; the built-in ``read_result`` tool (``READ_RESULT_TOOL``, run by the relay itself)
  pages the stored result (``page``). Only what is sent is cut: the stored result is whole.

The summary is a model turn's answer to ``SUMMARY_INSTRUCTION`` over the turns it
replaces (``relay.compaction`` asks it); the model then sees the run's instructions, the
summary as one user message (``SUMMARY_PREFIX`` first) and the latest turns. The thread's
stored messages never change: the summary is a row of ``compactions`` that names the last
message (``through_seq``) it stands for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal

Q = queries("context.sql")
Message = dict[str, Any]
PLATFORM = "*"  # the journal's tenant for platform-wide settings
CHARS_PER_TOKEN = 4  # characters of JSON per token: the usual rough estimate
DEFAULT_WINDOW = 128_000  # tokens, for a model the catalogue does not name
DEFAULT_MAX_OUTPUT = 16_384
KEEP_SHARE = 0.5  # of the budget, the latest turns kept verbatim after a compaction at most
SUMMARY_PREFIX = "Summary of the earlier conversation, which it replaces:\n"
SUMMARY_INSTRUCTION = (
    "You are compacting an agent's conversation so it fits the model's context window. "
    "Summarise the conversation above in one message: the user's goal and constraints, "
    "every decision taken, each tool called with what it returned that still matters "
    "(identifiers, numbers, errors), and what remains to do. Do not call tools. Answer "
    "with the summary only."
)
SUMMARY_REQUEST = "Summarise the conversation above, as your instructions say."
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code past the window
# Which prompt_cache_key a model's requests carry: the caller's, else one derived from the
# thread; only a caller's; none (a server that refuses the field).
CACHE_KEY_SWITCHES = ("derived", "caller", "never")
RESULT_CAP_BYTES = 65_536  # of a tool result the model is given, for a tool that names none
READ_RESULT = "read_result"  # the built-in tool that pages a result past its cap
READ_PAGE_BYTES = 65_536  # the most one read_result call returns
HANDLE_PREFIX = "result-"  # a handle: this and the result's message id
READ_RESULT_TOOL: dict[str, Any] = {
    "name": READ_RESULT,
    "description": (
        "Read part of a tool result that was too long to give you whole. Its handle and "
        "the offset to read from are in the note at the end of the part you were given."
    ),
    "json_schema": {
        "type": "object",
        "properties": {
            "handle": {"type": "string", "description": "the result's handle, from the note"},
            "offset": {"type": "integer", "minimum": 0, "description": "the byte to read from"},
            "max_bytes": {
                "type": "integer",
                "minimum": 1,
                "maximum": READ_PAGE_BYTES,
                "description": f"the most bytes to read (default and most: {READ_PAGE_BYTES})",
            },
        },
        "required": ["handle", "offset"],
        "additionalProperties": False,
    },
}


@dataclass(frozen=True, slots=True)
class Window:
    """What a turn of a run may send, and what the relay needs to compact it.

    ``messages``: the chat-format messages after the stored summary, one per message row
    and ``seqs`` their thread positions (before pairing: ``outbox.history.repair`` runs on
    what is sent). ``summary``: the stored summary that precedes them (None: none yet).
    """

    budget: int
    mode: str  # "compact", "disabled" or "last_messages"
    messages: list[Message] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    summary: str | None = None
    through_seq: int = 0
    last_input_tokens: int | None = None  # the model's count for the previous turn


def budget(
    options: dict[str, Any] | None,
    tenant_tokens: int | None,
    platform_tokens: int | None,
    context_window: int | None,
    max_output: int | None,
) -> int:
    """The tokens a request of a run may hold (the module docstring says in which order)."""
    own = (options or {}).get("max_prompt_tokens")
    for tokens in (own, tenant_tokens, platform_tokens):
        if isinstance(tokens, int) and tokens > 0:
            return tokens
    window = context_window or DEFAULT_WINDOW
    output = max_output or DEFAULT_MAX_OUTPUT
    return max(1, window - min(output, window // 2))


def mode(options: dict[str, Any] | None) -> tuple[str, int]:
    """The run's way of staying in its window, and N for ``last_messages``."""
    options = options or {}
    strategy = options.get("truncation_strategy")
    if isinstance(strategy, dict) and strategy.get("type") == "last_messages":
        count = strategy.get("last_messages")
        if isinstance(count, int) and count > 0:
            return "last_messages", count
    if options.get("truncation") == "disabled":
        return "disabled", 0
    return "compact", 0


def boundaries(messages: list[Message]) -> list[int]:
    """The indexes where a turn starts: before any message that is not a tool result."""
    return [i for i, m in enumerate(messages) if m.get("role") != "tool"]


def last_messages(messages: list[Message], count: int) -> list[Message]:
    """The last ``count`` messages, fewer when the count would start inside a turn (a tool
    result without its call): the window starts at the next turn boundary."""
    start = max(0, len(messages) - count)
    while start < len(messages) and messages[start].get("role") == "tool":
        start += 1
    return messages[start:]


def summary_item(summary: str) -> Message:
    """The stored summary as the model sees it: one user message."""
    return {"role": "user", "content": SUMMARY_PREFIX + summary}


def text_chars(messages: list[Message]) -> int:
    """The characters of text (contents, outputs, arguments) of chat or Responses items."""
    chars = 0
    for m in messages:
        content = m.get("content") or m.get("output") or m.get("arguments")
        chars += len(content) if isinstance(content, str) else 0
        for call in m.get("tool_calls") or ():
            chars += len(call["function"]["arguments"])
    return chars


def estimate(body: dict[str, Any]) -> int:
    """A request body's tokens: its compact JSON's characters over ``CHARS_PER_TOKEN``."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def reported(messages: list[Message], last_input_tokens: int | None) -> int | None:
    """The request's tokens by the model's own count of the previous turn's request plus
    the items since its answer (the results delivered since the last assistant message or
    call, at ``CHARS_PER_TOKEN``); None without a count."""
    if not last_input_tokens:
        return None
    since = len(messages)
    while since > 0 and not _answered(messages[since - 1]):
        since -= 1
    return last_input_tokens + math.ceil(text_chars(messages[since:]) / CHARS_PER_TOKEN)


def _answered(item: Message) -> bool:
    """A message or item of the model's answer: an assistant message or a call."""
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def surely_within(messages: list[Message], budget_tokens: int) -> bool:
    """Whether messages whose text is this short cannot pass the budget: their text is
    under a third of it, which leaves the JSON around it (keys, quotes escaped inside
    tool results, the tool list) twice the text's size."""
    return text_chars(messages) * 3 < budget_tokens * CHARS_PER_TOKEN


def cut(messages: list[Message], keep_chars: int) -> int:
    """Where the oldest turns end: the earliest turn boundary after which the messages'
    text is at most ``keep_chars`` characters, but never the first message (nothing to
    summarise) and at most the last boundary (the latest turn is always kept). 0 when
    there is no earlier turn to summarise."""
    starts = [i for i in boundaries(messages) if i > 0]
    if not starts:
        return 0
    tail = 0
    chosen = starts[-1]
    for i in range(len(messages) - 1, 0, -1):
        tail += text_chars([messages[i]])
        if tail > keep_chars:
            break
        if i in starts:
            chosen = i
    return chosen


# -- results past a cap ------------------------------------------------------------------


def result_cap(tool: dict[str, Any] | None) -> int:
    """The most bytes of a result of ``tool`` (a registry row; None: not one of the run's
    tools) the model is given; 0: no cap. ``read_result``'s own pages are never cut."""
    if tool is None:
        return RESULT_CAP_BYTES
    if tool["name"] == READ_RESULT:
        return 0
    cap = tool.get("model_result_cap")
    return RESULT_CAP_BYTES if cap is None else int(cap)


def handle(message_id: int) -> str:
    return f"{HANDLE_PREFIX}{message_id}"


def message_of(given: str) -> int | None:
    """The message id a handle names, or None when it is not a handle."""
    digits = given[len(HANDLE_PREFIX) :] if given.startswith(HANDLE_PREFIX) else ""
    return int(digits) if digits.isdigit() and len(digits) < 19 else None


def cap_results(
    messages: list[Message],
    message_rows: list[dict[str, Any]],
    call_rows: list[dict[str, Any]],
    tools: dict[str, dict[str, Any]],
) -> list[int]:
    """Cut, in ``messages`` (``outbox.history.from_rows`` of ``message_rows``, in the same
    order), each tool result past its tool's cap to its head and a note with its handle;
    the positions cut. The tool of a result is its call's (``call_rows``)."""
    names = {c["tool_call_id"]: c["tool_name"] for c in call_rows}
    cut: list[int] = []
    for i, (message, row) in enumerate(zip(messages, message_rows, strict=True)):
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            continue
        name = names.get(message.get("tool_call_id"))
        cap = result_cap(tools.get(name) if name else None)
        if name == READ_RESULT or not cap or len(content) <= cap // 4:
            continue  # (a character is at most 4 bytes: no need to encode a short one)
        data = content.encode()
        if len(data) <= cap:
            continue
        head = data[:cap].decode(errors="ignore")
        read = len(head.encode())
        page = min(cap, READ_PAGE_BYTES)
        call = json.dumps({"handle": handle(row["id"]), "offset": read, "max_bytes": page})
        note = (
            f"\n\n[This result is {len(data)} bytes; you were given its first {read}. "
            f"To read on, call {READ_RESULT} with {call}.]"
        )
        messages[i] = {**message, "content": head + note}
        cut.append(i)
    return cut


def page(text: str, offset: int, max_bytes: int) -> dict[str, Any]:
    """The part of a stored result ``read_result`` answers: up to ``max_bytes`` bytes from
    ``offset`` (moved to whole characters), and where the next part starts (None: the end)."""
    data = text.encode()
    start = min(offset, len(data))
    while start < len(data) and data[start] & 0xC0 == 0x80:
        start += 1
    end = min(len(data), start + max(1, min(max_bytes, READ_PAGE_BYTES)))
    while start < end < len(data) and data[end] & 0xC0 == 0x80:
        end -= 1
    while end == start < len(data) or (end < len(data) and data[end] & 0xC0 == 0x80):
        end += 1  # a page too small for one character: that character
    return {
        "offset": start,
        "text": data[start:end].decode(),
        "next_offset": end if end < len(data) else None,
        "total_bytes": len(data),
    }


# -- the catalogue and the budgets ------------------------------------------------------


def models(conn: psycopg.Connection[Any]) -> list[Row]:
    """Every model in the catalogue, with its prices when it has them."""
    return fetch_all(conn, Q.models, {})


def set_model(
    conn: psycopg.Connection[Any],
    model: str,
    *,
    context_window: int,
    max_output: int,
    prompt_cache_key: str = "derived",
    actor: str | None = None,
) -> Row:
    """Put ``model`` in the catalogue: its window, its most output tokens and which
    ``prompt_cache_key`` its requests carry (``CACHE_KEY_SWITCHES``)."""
    if not model or len(model) > 200:
        raise InvalidInput("a model name is 1-200 characters")
    if prompt_cache_key not in CACHE_KEY_SWITCHES:
        raise InvalidInput(
            f"--prompt-cache-key is one of {', '.join(CACHE_KEY_SWITCHES)}, "
            f"not {prompt_cache_key!r}"
        )
    if context_window <= 0 or max_output <= 0 or max_output >= context_window:
        raise InvalidInput(
            "--context-window and --max-output must be positive, the output under the window"
        )
    params = {
        "model": model,
        "context_window": context_window,
        "max_output": max_output,
        "prompt_cache_key": prompt_cache_key,
        "actor": actor or "unknown",
    }
    row = fetch_one(conn, Q.set_model, params)
    assert row is not None
    detail = {
        "model": model,
        "context_window": context_window,
        "max_output": max_output,
        "prompt_cache_key": prompt_cache_key,
    }
    journal(conn, "model.set", PLATFORM, actor=actor, detail=detail)
    return row


def remove_model(conn: psycopg.Connection[Any], model: str, *, actor: str | None = None) -> None:
    if fetch_one(conn, Q.remove_model, {"model": model}) is None:
        raise NotFound(f"model {model!r} is not in the catalogue", hint="`outbox models list`")
    journal(conn, "model.removed", PLATFORM, actor=actor, detail={"model": model})


def set_prompt_budget(
    conn: psycopg.Connection[Any],
    tokens: int | None,
    *,
    tenant_id: str | None = None,
    actor: str | None = None,
) -> None:
    """The prompt budget of runs that name none: a tenant's, or (no tenant) the
    platform's. None removes it."""
    if tokens is not None and tokens <= 0:
        raise InvalidInput(f"--max-prompt-tokens must be positive, got {tokens}")
    if tenant_id is None:
        conn.execute(Q.ensure_run_defaults)
        params = {"tokens": tokens, "actor": actor or "unknown"}
        fetch_one(conn, Q.set_platform_prompt_budget, params)
        event, tenant = "platform.prompt_budget_set", PLATFORM
    elif tokens is None:  # a row with no budget left is removed, as tenants without one
        conn.execute(Q.clear_tenant_prompt_budget, {"tenant_id": tenant_id})
        event, tenant = "tenant.prompt_budget_set", tenant_id
    else:
        fetch_one(conn, Q.set_tenant_prompt_budget, {"tenant_id": tenant_id, "tokens": tokens})
        event, tenant = "tenant.prompt_budget_set", tenant_id
    journal(conn, event, tenant, actor=actor, detail={"max_prompt_tokens": tokens})


def compactions(conn: psycopg.Connection[Any], thread_id: Any) -> list[Row]:
    """A thread's compactions, oldest first (the caller's tenant scope applies)."""
    return fetch_all(conn, Q.compactions, {"thread_id": thread_id})


def record_compactions(conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> None:
    """Record the summaries made for turns (``relay.compaction``), each once per (run,
    step), and journal each one recorded, ``context.compacted``, with the estimates of
    the request before and after it."""
    for row in fetch_all(conn, Q.record_compactions, {"compactions": Jsonb(rows)}):
        detail = {
            "step_no": row["step_no"],
            "through_seq": row["through_seq"],
            "tokens_before": row["tokens_before"],
            "tokens_after": row["tokens_after"],
        }
        journal(
            conn,
            "context.compacted",
            row["tenant_id"],
            thread_id=row["thread_id"],
            run_id=row["run_id"],
            detail=detail,
        )
