"""MCP tools' registry names and the modes their annotations give (outbox.mcpservers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outbox import mcpservers

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI takes as a function name


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("create_ticket", "tk__create_ticket"),
        ("files.read", "tk__files_read"),
        ("résumé/parse tool", "tk__r_sum__parse_tool"),
    ],
)
def test_names_are_function_names(remote, expected):
    assert mcpservers.tool_name("tk", remote) == expected


def test_long_names_are_cut_and_stay_apart():
    a = mcpservers.tool_name("server", "x" * 80 + "a")
    b = mcpservers.tool_name("server", "x" * 80 + "b")
    assert FUNCTION_NAME.fullmatch(a) and FUNCTION_NAME.fullmatch(b)
    assert len(a) == 64 and a != b


@pytest.mark.parametrize(
    ("annotations", "trusted", "expected"),
    [
        ({"readOnlyHint": True}, True, ("key", "low")),
        ({"idempotentHint": True, "destructiveHint": False}, True, ("key", "medium")),
        ({"idempotentHint": True}, True, ("key", "high")),
        ({"readOnlyHint": False, "idempotentHint": False}, True, ("none", "high")),
        (None, True, ("none", "high")),
        ({"readOnlyHint": True}, False, ("none", "high")),
        ({"idempotentHint": True, "destructiveHint": False}, False, ("none", "high")),
    ],
)
def test_modes_come_from_annotations_only_when_trusted(annotations, trusted, expected):
    assert mcpservers.from_annotations(annotations, trusted) == expected


def test_a_tool_with_an_invalid_schema_is_skipped_with_its_reason():
    server = {
        "name": "tk",
        "prefix": "tk",
        "tenant_id": "*",
        "trusted": False,
        "overrides": {},
        "timeout_s": 30.0,
        "settle_s": 5.0,
        "max_attempts": 5,
    }
    listed = [
        {"name": "good", "inputSchema": {"type": "object"}},
        {"name": "bad", "inputSchema": {"type": "no-such-type"}},
    ]
    specs, skipped = mcpservers.tool_specs(server, listed)
    assert [s.name for s in specs] == ["tk__good"]
    assert skipped[0]["tool"] == "bad" and "JSON Schema" in skipped[0]["problem"]


# MCP's grammar of a `_meta` key (2025-11-25, 2026-07-28): an optional prefix of labels
# separated by dots and ended by "/", then a name.
LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
META_KEY_FORM = re.compile(
    rf"(?:(?P<prefix>{LABEL}(?:\.{LABEL})*)/)?[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?"
)


def test_our_meta_key_is_valid_not_reserved_and_the_one_the_docs_give():
    found = META_KEY_FORM.fullmatch(mcpservers.META_KEY)
    assert found is not None and found["prefix"]
    labels = found["prefix"].split(".")
    # Reserved: a prefix whose second label is modelcontextprotocol or mcp (2025-11-25), or
    # with either in any label but the last (2025-06-18).
    assert labels[1:2] not in (["modelcontextprotocol"], ["mcp"])
    assert not {"modelcontextprotocol", "mcp"} & set(labels[:-1])
    docs = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    assert f'"{mcpservers.META_KEY}": {{' in docs
    assert f"`{mcpservers.META_KEY}` (`outbox.mcpservers.META_KEY`" in docs
    # What it carries is what docs/mcp.md's table lists.
    from outbox.relay.mcpclient import meta
    from outbox.relay.outcomes import Claimed

    row = Claimed(1, "tool_call", "acme", None, "r", None, 1, "c", 2, 0, 5, None, 0.0)
    carried = meta(row._replace(idempotency_key="k", tool_call_id="call_1"), "00-x")
    assert set(carried) == {mcpservers.META_KEY, "traceparent"}
    members = set(carried[mcpservers.META_KEY])
    assert members == {"idempotency_key", "run_id", "tool_call_id", "attempt", "correlation_id"}
    for member in members:
        assert f"| `{member}` |" in docs


def test_a_deadline_is_for_tools_over_the_network_only():
    from outbox import registry

    for executor in ("http", "mcp"):
        extra = (
            {"endpoint": "http://t/x"}
            if executor == "http"
            else {"mcp_server": "s", "mcp_tool": "t"}
        )
        spec = registry.ToolSpec(name="t", executor=executor, deadline_s=60, **extra)
        assert spec.deadline_s == 60
    with pytest.raises(ValueError, match="a deadline is for tools called over the network"):
        registry.ToolSpec(name="t", executor="python", callable="m:f", deadline_s=60)
    with pytest.raises(ValueError, match="greater than 0"):
        registry.ToolSpec(name="t", endpoint="http://t/x", deadline_s=0)


def test_an_event_streams_answer_is_seen_in_any_line_ending_and_in_a_batch():
    """``AnswerSeen`` (the poster's ``enough`` for MCP calls) finds the answer to its request
    once its event is complete, whatever the line endings, skipping notifications, other
    ids and unreadable data, and in a batch; never in a body that is not an event stream."""
    from outbox.relay.mcpclient import AnswerSeen
    from outbox.relay.poster import Answer

    def fed(kind: bytes, *pieces: bytes) -> list[bool]:
        answer, seen, said = Answer(), AnswerSeen(7), []
        answer.status, answer.headers = 200, [(b"Content-Type", kind)]
        for piece in pieces:
            answer.body += piece
            said.append(seen(answer))
        return said

    note = b'data: {"jsonrpc":"2.0","method":"notifications/message","params":{}}'
    other = b'data: {"jsonrpc":"2.0","id":6,"result":{}}'
    mine = b'data: {"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    for end in (b"\n", b"\r\n", b"\r"):
        stream = b"text/event-stream; charset=utf-8"
        assert fed(stream, note + end + end, other + end, end, mine, end + end) == [
            False,
            False,
            False,
            False,
            True,
        ]
        assert fed(stream, b"data: {not json" + end + end + mine + end + end) == [True]
    batch = b'data: [{"jsonrpc":"2.0","id":7,"result":{"content":[]}}]\n\n'
    assert fed(b"text/event-stream", batch) == [True]
    assert fed(b"application/json", mine[6:] + b"\n\n") == [False]
