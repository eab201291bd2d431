"""Our rows as the objects of OpenAI's Assistants protocol (what the openai SDK parses).

Ids are ours as they are (run and thread ids are UUIDs, messages ``msg_<id>``, steps
``step_<id>``), so an id seen in the API is the id ``outbox runs show`` takes. Our statuses
map one to one, except two: a run stopped by its step cap or a token budget is
``incomplete`` (OpenAI's word for a run cut short by a limit), and ``cancelling`` never
shows because cancelling is one transaction here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from outbox.constants import ACTIVE, ENDED

Row = dict[str, Any]
LIMIT_REASONS = {"step_cap": "max_steps", "budget": "max_completion_tokens"}


def ts(value: datetime | None) -> int | None:
    """Seconds since the epoch, as OpenAI's ``created_at`` and friends."""
    return None if value is None else int(value.timestamp())


def thread(row: Row) -> Row:
    return {
        "id": str(row["id"]),
        "object": "thread",
        "created_at": ts(row["created_at"]),
        "metadata": row["metadata"] or {},
        "tool_resources": None,
    }


def assistant(row: Row) -> Row:
    return {
        "id": str(row["id"]),
        "object": "assistant",
        "created_at": ts(row["created_at"]),
        "name": row["name"],
        "description": row["description"],
        "model": row["model"],
        "instructions": row["instructions"],
        "tools": row["tools"],
        "metadata": row["metadata"] or {},
        "tool_resources": None,
        "temperature": None,
        "top_p": None,
        "response_format": "auto",
    }


def message(row: Row, thread_id: object) -> Row:
    return {
        "id": f"msg_{row['id']}",
        "object": "thread.message",
        "created_at": ts(row["created_at"]),
        "thread_id": str(thread_id),
        "role": row["role"],
        "content": [{"type": "text", "text": {"value": row["content"], "annotations": []}}],
        "assistant_id": None if row.get("assistant_id") is None else str(row["assistant_id"]),
        "run_id": None if row["run_id"] is None else str(row["run_id"]),
        "attachments": [],
        "metadata": {},
        "status": "completed",
        "completed_at": ts(row["created_at"]),
        "incomplete_at": None,
        "incomplete_details": None,
    }


def run_status(row: Row) -> str:
    """The run's status in OpenAI's words. A run past its deadline for client outputs is
    ``expired`` at once, by the database clock: the library refuses outputs from then on,
    whether or not the relay's sweep has recorded the expiry yet."""
    if row["status"] == "failed" and row["failure_reason"] in LIMIT_REASONS:
        return "incomplete"
    if row["status"] == "requires_action" and row.get("deadline_passed"):
        return "expired"
    return str(row["status"])


def run(row: Row, pending: list[Row]) -> Row:
    """A run as OpenAI showed it; ``pending``: the client calls it waits for."""
    status = run_status(row)
    ended = ts(row["ended_at"])
    required = None
    if status == "requires_action":
        required = {
            "type": "submit_tool_outputs",
            "submit_tool_outputs": {
                "tool_calls": [
                    {
                        "id": call["tool_call_id"],
                        "type": "function",
                        "function": {"name": call["tool_name"], "arguments": call["arguments_raw"]},
                    }
                    for call in pending
                ]
            },
        }
    last_error = None
    if status == "failed":
        last_error = {"code": "server_error", "message": row["last_error"] or "the run failed"}
    incomplete = None
    if status == "incomplete":
        incomplete = {"reason": LIMIT_REASONS[row["failure_reason"]]}
    usage = None
    if status in ENDED or status == "incomplete":
        usage = {
            "prompt_tokens": int(row["input_tokens"]),
            "completion_tokens": int(row["output_tokens"]),
            "total_tokens": int(row["input_tokens"]) + int(row["output_tokens"]),
        }
    return {
        "id": str(row["id"]),
        "object": "thread.run",
        "created_at": ts(row["created_at"]),
        "thread_id": str(row["thread_id"]),
        "assistant_id": None if row["assistant_id"] is None else str(row["assistant_id"]),
        "status": status,
        "required_action": required,
        "last_error": last_error,
        "expires_at": ts(row["action_deadline"]) if status == "requires_action" else None,
        "started_at": None if status == "queued" else ts(row["created_at"]),
        "cancelled_at": ended if status == "cancelled" else None,
        "failed_at": ended if status == "failed" else None,
        "completed_at": ended if status == "completed" else None,
        "incomplete_details": incomplete,
        "model": row["model"],
        "instructions": row["instructions"] or "",
        "tools": row["declared_tools"] or [],
        "metadata": row["api_metadata"] or {},
        "usage": usage,
        "max_completion_tokens": row["max_tokens"],
        **assistants_options(row.get("model_options") or {}),
    }


def assistants_options(options: Row) -> Row:
    """A run's model options as the Assistants protocol shows them (chat completions'
    shapes: the format as ``response_format``, a forced function under ``function``)."""
    choice = options.get("tool_choice", "auto")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    fmt = options.get("format")
    if fmt is not None and fmt["type"] == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return {
        "response_format": fmt or "auto",
        "tool_choice": choice,
        "parallel_tool_calls": options.get("parallel_tool_calls", True),
        "temperature": options.get("temperature"),
        "top_p": options.get("top_p"),
        "max_prompt_tokens": options.get("max_prompt_tokens"),
        "truncation_strategy": {
            "type": "auto",
            "last_messages": None,
            **(options.get("truncation_strategy") or {}),
        },
    }


def steps(rows: list[Row], run_row: Row) -> list[Row]:
    """A run's steps: one per model turn, ``tool_calls`` when it asked for tools, else
    ``message_creation``."""
    out = []
    for row in rows:
        if row["batch_id"] is not None:
            details: Row = {
                "type": "tool_calls",
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": call["arguments"],
                            "output": call["output"],
                        },
                    }
                    for call in row["calls"]
                ],
            }
            done = row["batch_status"] in ("delivered", "complete")
            status = "completed" if done else _open_step_status(run_row)
        else:
            details = {
                "type": "message_creation",
                "message_creation": {"message_id": f"msg_{row['message_id']}"},
            }
            status = "completed"
        out.append(
            {
                "id": f"step_{row['id']}",
                "object": "thread.run.step",
                "created_at": ts(row["created_at"]),
                "run_id": str(run_row["id"]),
                "thread_id": str(run_row["thread_id"]),
                "assistant_id": None
                if run_row["assistant_id"] is None
                else str(run_row["assistant_id"]),
                "type": details["type"],
                "status": status,
                "step_details": details,
                "last_error": None,
                "expired_at": None,
                "cancelled_at": None,
                "failed_at": None,
                "completed_at": ts(row["created_at"]) if status == "completed" else None,
                "metadata": None,
                "usage": {
                    "prompt_tokens": row["input_tokens"],
                    "completion_tokens": row["output_tokens"],
                    "total_tokens": row["input_tokens"] + row["output_tokens"],
                },
            }
        )
    return out


def _open_step_status(run_row: Row) -> str:
    """A step whose batch is not delivered: in progress while its run is, else how it ended."""
    status = run_status(run_row)
    if status in ACTIVE:
        return "in_progress"
    return {"cancelled": "cancelled", "expired": "expired"}.get(status, "failed")


def deleted(ident: str, kind: str) -> Row:
    """OpenAI's answer to a delete (``assistant.deleted``, ...)."""
    return {"id": ident, "object": kind, "deleted": True}


def page(items: list[Row], has_more: bool) -> Row:
    """OpenAI's list envelope."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def event_data(event: Row) -> str:
    """A journal event as the data of an SSE event (the fields `journal tail --json` shows)."""
    return json.dumps(event, default=str)
