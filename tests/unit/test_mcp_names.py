"""MCP tools' registry names and the modes their annotations give (outbox.mcpservers)."""

from __future__ import annotations

import re

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
