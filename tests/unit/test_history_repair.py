"""The pairing repair: every call answered once, right after its turn; orphans dropped."""

from __future__ import annotations

from outbox.history import repair
from outbox.providers import to_responses_input


def call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "t", "arguments": "{}"}}


def test_orphan_result_dropped_and_unanswered_call_closed():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "ghost", "content": "{}"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "again"},
        {"role": "user", "content": "next"},
    ]
    fixed, report = repair(messages)
    assert report.dropped_orphans == ["ghost", "b"]
    assert report.closed_calls == ["a"]
    roles = [(m["role"], m.get("tool_call_id")) for m in fixed]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "b"),
        ("tool", "a"),
        ("user", None),
    ]


def test_well_formed_history_is_unchanged():
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
    ]
    fixed, report = repair(messages)
    assert fixed == messages and not report.changed


def test_responses_items_pair_calls_and_outputs():
    items = to_responses_input(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "let me see", "tool_calls": [call("a")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
        ]
    )
    assert [i.get("type", i.get("role")) for i in items] == [
        "user",
        "assistant",
        "function_call",
        "function_call_output",
    ]
