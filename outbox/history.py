"""History replay: a thread as provider messages in which every call has its result.

Stored history is well-formed by construction (docs/guarantees.md, invariant 7: a tool
message has a foreign key to its call, and outputs enter the history only when their whole
batch is submitted), but a thread can still hold calls without results: a batch still running, a
run cancelled or expired mid-batch, or history imported from elsewhere. ``repair`` is the
one place that makes any list of chat-format messages pairable: results that answer no
earlier call are dropped, calls without a result are closed with an explicit error output,
and the counts are returned so the caller can journal them.

Chat-format messages are the internal lingua franca; ``outbox.providers`` converts them to
each provider API's input (Responses items: ``function_call`` / ``function_call_output``).
A message may carry the reasoning items a client's history gave before it (``reasoning``,
verbatim): the Responses API gets them back before the message, chat completions never.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from outbox import providers, tenancy
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, owned, pg

Q = queries("history.sql")
Message = dict[str, Any]
REASONING = providers.REASONING
UNANSWERED = "no result was recorded for this call ({reason})"


@dataclass
class Repair:
    """What ``repair`` changed: dropped orphan results and closed unanswered calls."""

    dropped_orphans: list[str] = field(default_factory=list)
    closed_calls: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.dropped_orphans or self.closed_calls)

    def as_detail(self) -> dict[str, Any]:
        return {
            "dropped_orphan_results": len(self.dropped_orphans),
            "closed_unanswered_calls": len(self.closed_calls),
            "dropped_call_ids": self.dropped_orphans,
            "closed_call_ids": self.closed_calls,
        }


def repair(messages: list[Message], reason: str = "interrupted") -> tuple[list[Message], Repair]:
    """Pair every assistant tool call with exactly one tool message, right after it."""
    fixed: list[Message] = []
    report = Repair()
    open_calls: dict[str, None] = {}  # ordered: calls of the last assistant turn
    answered: set[str] = set()

    def close_open() -> None:
        for call_id in open_calls:
            error = json.dumps({"error": UNANSWERED.format(reason=reason)})
            fixed.append({"role": "tool", "tool_call_id": call_id, "content": error})
            report.closed_calls.append(call_id)
        open_calls.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in open_calls and call_id not in answered:
                answered.add(call_id)
                del open_calls[call_id]
                fixed.append(message)
            else:
                report.dropped_orphans.append(str(call_id))
            continue
        close_open()
        fixed.append(message)
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                open_calls[call["id"]] = None
    close_open()
    return fixed, report


def stored_messages(db: Any, thread_id: uuid.UUID) -> list[Message]:
    """A thread's stored messages in chat format, in order (no repair)."""
    conn = pg(db)
    return from_rows(
        fetch_all(conn, Q.thread_messages, {"thread_id": thread_id}),
        fetch_all(conn, Q.thread_calls, {"thread_id": thread_id}),
    )


def from_rows(message_rows: list[dict[str, Any]], call_rows: list[dict[str, Any]]) -> list[Message]:
    """Chat-format messages from a thread's message rows (in order, each tool message with
    the call id it answers) and call rows (by assistant message and position): the shape of
    the ``thread_messages`` and ``thread_calls`` queries, which the relay reads for many
    threads at once."""
    calls: dict[int, list[Message]] = {}
    for row in call_rows:
        calls.setdefault(row["message_id"], []).append(
            {
                "id": row["tool_call_id"],
                "type": "function",
                "function": {"name": row["tool_name"], "arguments": row["arguments_raw"]},
            }
        )
    messages: list[Message] = []
    for row in message_rows:
        if row["role"] == "tool":
            message: Message = {
                "role": "tool",
                "tool_call_id": row["answers_call"],
                "content": row["content"],
            }
        else:
            message = {"role": row["role"], "content": row["content"]}
            if row["id"] in calls:
                message["tool_calls"] = calls[row["id"]]
        if row.get("reasoning"):
            message[REASONING] = row["reasoning"]
        messages.append(message)
    return messages


def for_provider(messages: list[Message], api: str) -> tuple[list[Message], Repair]:
    """Stored messages made pairable (calls still waiting for their batch are closed in
    this copy only) in the format of ``api`` (``chat`` or ``responses``)."""
    fixed, report = repair(messages, reason="batch not delivered")
    return providers.as_input(fixed, api), report


def replay(
    db: Any, thread_id: uuid.UUID, tenant_id: str, *, api: str = "chat"
) -> tuple[list[Message], Repair]:
    """The thread ready to send to a provider (``api`` = ``chat`` or ``responses``).

    Checks the thread belongs to ``tenant_id``. Calls still waiting for their batch are
    closed in the replayed copy only; the stored history is not changed.
    """
    conn = pg(db)
    tenancy.scope(conn, tenant_id)
    thread = fetch_one(conn, Q.get_thread, {"thread_id": thread_id})
    owned(thread, "thread", thread_id, tenant_id)
    return for_provider(stored_messages(conn, thread_id), api)
