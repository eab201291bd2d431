"""A Responses request's ``input`` as typed items, and the history it carries.

Clients that keep their own history (the OpenAI Agents SDK by default) send the whole
conversation on every request: messages, the model's ``function_call`` items, their own
``function_call_output`` items, ``reasoning`` items, and references to stored items. This
module reads such an input into plain items, resolves what names a stored item of ours,
checks the pairing rules (docs/guarantees.md, invariant 7, with OpenAI's texts) and turns a
history into the chat-format messages ``lifecycle.import_thread`` stores.

Design choice: an item is identified as ours only by an id we hand out (``msg_<n>`` for a
message, ``fc_<n>`` for a client function call): such an id must name a stored item of the
tenant (row-level security hides every other tenant's, so a replayed id of another tenant
is a 404 like a missing one) and the item must say what the stored one says. Items without
our ids are the caller's history, compared by content.
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg

from outbox.server.bodies import text_of
from outbox.server.db_pool import Q
from outbox.server.errors import APIError
from outbox.statements import fetch_all

Item = dict[str, Any]
INSTRUCTION_ROLES = ("system", "developer")
SAID_ROLES = ("user", "assistant")
OUR_ID = re.compile(r"^(msg|fc)_([0-9]{1,18})$")  # ids of stored items (bigint ids)
MESSAGE, CALL, OUTPUT = "message", "function_call", "function_call_output"
REASONING, REFERENCE = "reasoning", "item_reference"


def parse(value: str | list[dict[str, Any]] | None) -> list[Item]:
    """The input as items: ``{"type": "message", "role", "text"}``, ``{"type":
    "function_call", "call_id", "name", "arguments"}``, ``{"type": "function_call_output",
    "call_id", "output"}``, ``{"type": "reasoning", "item"}`` (kept verbatim) and ``{"type":
    "item_reference", "ref"}``; an item that carries one of our ids keeps it as ``ref``.
    400 for what we cannot take, naming the item."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": MESSAGE, "role": "user", "text": value}]
    return [_item(item, index) for index, item in enumerate(value)]


def _item(item: dict[str, Any], index: int) -> Item:
    kind = item.get("type", MESSAGE)
    where = f"input[{index}]"
    if kind == REASONING:
        return {"type": REASONING, "item": item, "index": index}
    if kind == REFERENCE:
        ref = item.get("id")
        if not isinstance(ref, str) or not ref:
            raise APIError(400, f"Missing required parameter: '{where}.id'.", param=where)
        return {"type": REFERENCE, "ref": ref, "index": index}
    if kind == OUTPUT:
        call_id, output = item.get("call_id"), item.get("output")
        _need_text(call_id, f"{where}.call_id")
        if not isinstance(output, str):
            output = json.dumps(output)
        parsed: Item = {"type": OUTPUT, "call_id": call_id, "output": output}
    elif kind == CALL:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        _need_text(call_id, f"{where}.call_id")
        _need_text(name, f"{where}.name")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        parsed = {"type": CALL, "call_id": call_id, "name": name, "arguments": arguments}
    elif kind == MESSAGE:
        role, content = item.get("role"), item.get("content")
        if role not in (*SAID_ROLES, *INSTRUCTION_ROLES):
            raise APIError(
                400,
                f"Invalid value for '{where}.role': {role!r}; give user, "
                "assistant, system or developer.",
                param=f"{where}.role",
            )
        try:
            text = text_of(_plain_parts(content))
        except (ValueError, TypeError) as err:
            raise APIError(400, f"Invalid '{where}.content': {err}.", param=where) from None
        parsed = {"type": MESSAGE, "role": role, "text": text}
    else:
        raise APIError(
            400,
            f"Input items of type {kind!r} are not supported by outbox serve: send "
            "messages, function_call, function_call_output, reasoning and item_reference "
            "items.",
            param=where,
        )
    parsed["index"] = index
    ident = item.get("id")
    if isinstance(ident, str) and OUR_ID.match(ident):
        parsed["ref"] = ident
    return parsed


def _need_text(value: Any, param: str) -> None:
    if not isinstance(value, str) or not value:
        raise APIError(400, f"Missing required parameter: '{param}'.", param=param)


def _plain_parts(content: Any) -> str | list[dict[str, Any]]:
    """Responses' text parts (input_text, output_text) as the text parts ``text_of`` reads."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError("give a string or a list of text parts")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in (
            "input_text",
            "output_text",
            "text",
        ):
            raise ValueError("only text content parts are supported")
        parts.append({"type": "text", "text": part.get("text")})
    return parts


# -- stored items ------------------------------------------------------------------------


def resolve(conn: psycopg.Connection[Any], items: list[Item]) -> list[Item]:
    """Items with every reference replaced by the stored item it names, and every item
    that carries one of our ids checked against the stored one; each stored item gets its
    ``thread_id``. 404 naming an id the tenant has no item for (another tenant's looks
    missing); 400 for an item that says something else than the stored item of its id."""
    wanted = [i for i in items if "ref" in i]
    if not wanted:
        return items
    found = _stored(conn, [i["ref"] for i in wanted])
    resolved = []
    for item in items:
        if "ref" not in item:
            resolved.append(item)
            continue
        where = f"input[{item['index']}]"
        stored = found.get(item["ref"])
        if stored is None:
            raise APIError(404, f"Item with id '{item['ref']}' not found.", param=where)
        if item["type"] != REFERENCE and key(item) != key(stored):
            raise APIError(
                400,
                f"Invalid '{where}': it carries the id '{item['ref']}' of a stored item but "
                "says something else; send the item as it was given, or drop its id.",
                param=where,
            )
        resolved.append({**stored, "index": item["index"]})
    return resolved


def _stored(conn: psycopg.Connection[Any], refs: list[str]) -> dict[str, Item]:
    """The tenant's stored items of these ids (``msg_<n>``, ``fc_<n>``), by id."""
    numbers = {
        kind: [int(m[2]) for r in refs if (m := OUR_ID.match(r)) and m[1] == kind]
        for kind in ("msg", "fc")
    }
    found: dict[str, Item] = {}
    for row in fetch_all(conn, Q.stored_messages, {"ids": numbers["msg"]}):
        ident = f"msg_{row['id']}"
        found[ident] = {
            "type": MESSAGE,
            "role": row["role"],
            "text": row["content"],
            "ref": ident,
            "thread_id": row["thread_id"],
        }
    for row in fetch_all(conn, Q.stored_calls, {"ids": numbers["fc"]}):
        ident = f"fc_{row['id']}"
        found[ident] = {**_call(row), "ref": ident, "thread_id": row["thread_id"]}
    return found


def _call(row: dict[str, Any]) -> Item:
    return {
        "type": CALL,
        "call_id": row["tool_call_id"],
        "name": row["tool_name"],
        "arguments": row["arguments_raw"],
    }


def stored_history(conn: psycopg.Connection[Any], thread_id: Any) -> list[Item]:
    """A thread's history as its caller saw it, in order: user and assistant messages,
    the caller's function calls (client calls and imported ones) and their outputs. Calls
    the relay ran for registry tools never showed, so they are not in it."""
    calls: dict[int, list[Item]] = {}
    for row in fetch_all(conn, Q.history_calls, {"thread_id": thread_id}):
        calls.setdefault(row["message_id"], []).append(_call(row))
    history: list[Item] = []
    for row in fetch_all(conn, Q.history_messages, {"thread_id": thread_id}):
        if row["role"] == "tool":
            if row["shown"]:
                history.append(
                    {"type": OUTPUT, "call_id": row["answers_call"], "output": row["content"]}
                )
            continue
        if row["content"]:
            history.append({"type": MESSAGE, "role": row["role"], "text": row["content"]})
        history += calls.get(row["id"], [])
    return history


def key(item: Item) -> tuple[str, ...]:
    """What an item says, for comparing a given history with a stored one (ids apart)."""
    if item["type"] == MESSAGE:
        return (MESSAGE, item["role"], item["text"])
    if item["type"] == CALL:
        return (CALL, item["call_id"], item["name"], item["arguments"])
    return (OUTPUT, item["call_id"], item["output"])


def with_reasoning(items: list[Item]) -> list[Item]:
    """The items but the reasoning ones, each of those given with the next item (its
    ``reasoning``: the items verbatim), as the model that wrote them put them before
    its message or call; a reasoning item with nothing after it stays in the response's
    input only."""
    out: list[Item] = []
    pending: list[dict[str, Any]] = []
    for item in items:
        if item["type"] == REASONING:
            pending.append(item["item"])
            continue
        out.append({**item, "reasoning": pending} if pending else item)
        pending = []
    return out


def is_history(item: Item) -> bool:
    """Items that are the conversation itself (not instructions, not reasoning)."""
    return item["type"] in (CALL, OUTPUT) or (
        item["type"] == MESSAGE and item["role"] in SAID_ROLES
    )


# -- pairing --------------------------------------------------------------------------------


def check_pairs(history: list[Item]) -> None:
    """Every function call answered by exactly one output before the conversation moves
    on, and every output answering a call given before it: 400 with OpenAI's texts
    otherwise (docs/guarantees.md, invariant 7: a stored history is always pairable)."""
    open_calls: dict[str, None] = {}  # ordered: the calls of the current turn
    seen: set[str] = set()
    answering = False  # outputs came since the last call

    def unanswered() -> None:
        for call_id in open_calls:
            raise APIError(400, f"No tool output found for function call {call_id}.")

    for item in history:
        if item["type"] == CALL:
            if answering:
                unanswered()
                answering = False
            if item["call_id"] in seen:
                raise APIError(
                    400,
                    f"Duplicate function call id {item['call_id']!r} in 'input': each "
                    "function_call needs its own call_id.",
                )
            seen.add(item["call_id"])
            open_calls[item["call_id"]] = None
        elif item["type"] == OUTPUT:
            if item["call_id"] not in open_calls:
                raise APIError(
                    400,
                    f"No tool call found for function call output with call_id {item['call_id']}.",
                )
            del open_calls[item["call_id"]]
            answering = True
        else:
            unanswered()
            answering = False
    unanswered()


def as_chat(history: list[Item]) -> list[dict[str, Any]]:
    """A checked history as chat-format messages: an assistant message and the calls
    after it form one assistant turn, as the relay stores a model turn. Reasoning items
    (``with_reasoning``) go with the message they came before."""
    chat: list[dict[str, Any]] = []
    for item in history:
        if item["type"] == MESSAGE:
            message: dict[str, Any] = {"role": item["role"], "content": item["text"]}
        elif item["type"] == OUTPUT:
            message = {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
        else:
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = chat[-1] if chat else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                chat.append(last)
            last.setdefault("tool_calls", []).append(call)
            if item.get("reasoning"):
                last["reasoning"] = [*last.get("reasoning", []), *item["reasoning"]]
            continue
        if item.get("reasoning"):
            message["reasoning"] = item["reasoning"]
        chat.append(message)
    return chat


def recorded(items: list[Item]) -> list[Item]:
    """The input as ``input_items`` lists it: what the request gave, normalised, in order
    (reasoning items verbatim)."""
    listed: list[Item] = []
    for n, item in enumerate(items):
        if item["type"] == MESSAGE:
            listed.append(
                {
                    "type": "message",
                    "id": f"msg_in_{n}",
                    "role": item["role"],
                    "status": "completed",
                    "content": [{"type": "input_text", "text": item["text"]}],
                }
            )
        elif item["type"] == OUTPUT:
            listed.append(
                {
                    "type": OUTPUT,
                    "id": f"fco_in_{n}",
                    "call_id": item["call_id"],
                    "output": item["output"],
                    "status": "completed",
                }
            )
        elif item["type"] == CALL:
            listed.append(
                {
                    "type": CALL,
                    "id": f"fc_in_{n}",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                    "status": "completed",
                }
            )
        else:
            listed.append({**item["item"], "id": item["item"].get("id") or f"rs_in_{n}"})
    return listed
