"""``outbox.storable``: JSON that parses but that PostgreSQL or Python cannot take is refused
at the edge, naming the problem and where it is; everything else passes unchanged.

Whether PostgreSQL really refuses what is refused here is checked against the server in
``tests/integration/test_unstorable.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox import storable
from outbox.errors import InvalidInput
from outbox.storable import MAX_DEPTH, NotStorable


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "text,problem",
    [
        ('{"a": "x\\u0000y"}', "NUL character (\\u0000) at $.a, which PostgreSQL's jsonb"),
        ('{"k\\u0000": 1}', "NUL character (\\u0000) in a key at $"),
        ('{"a": [1, NaN]}', "it holds NaN, which JSON does not allow"),
        ('{"a": -Infinity}', "it holds -Infinity"),
        ('{"a": [1, 1e400]}', "it holds the number 1e400, beyond a float's range"),
        ('{"s": "\\ud800"}', "lone surrogate (\\ud800) at $.s"),
        ("[" * 100_000 + "]" * 100_000, f"nested more than {MAX_DEPTH} levels deep"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"more than {MAX_DEPTH} levels"),
    ],
)
def test_json_that_cannot_be_stored_is_refused_naming_the_problem(text, problem):
    for data in (text, text.encode()):
        with pytest.raises(NotStorable) as refused:
            storable.loads(data, "tool result")
        assert str(refused.value).startswith("tool result is not storable JSON: ")
        assert problem in str(refused.value)
        assert isinstance(refused.value, InvalidInput)  # a refusal of input, with a hint
        assert refused.value.hint


@pytest.mark.parametrize(
    "text",
    [
        '{"emoji": "\\ud83d\\ude00", "raw": "\U0001f600"}',  # a pair is one character
        '{"escaped": "\\\\u0000 is how JSON writes NUL"}',  # a backslash, not a NUL
        '{"brackets": "' + "[" * 500 + '"}',  # brackets in a string are no nesting
        json.dumps([{"id": i, "tags": [1, 2]} for i in range(1000)]),  # wide, not deep
        "[" * MAX_DEPTH + "]" * MAX_DEPTH,
        '{"big": 1e300, "int": ' + "9" * 400 + "}",
    ],
)
def test_json_that_can_be_stored_passes_unchanged(text):
    assert storable.loads(text, "tool result") == json.loads(text)
    assert storable.loads(text.encode(), "tool result") == json.loads(text)


def test_text_that_is_not_json_is_a_value_error_not_a_refusal():
    with pytest.raises(ValueError) as err:
        storable.loads(b"plain text", "tool result")
    assert not isinstance(err.value, NotStorable)
    with pytest.raises(ValueError):  # invalid UTF-8 (here: a surrogate encoded) is not JSON
        storable.loads(b'{"k": "\xed\xa0\x80"}', "tool result")


@pytest.mark.parametrize(
    "value,problem",
    [
        ({"a": float("nan")}, "NaN at $.a"),
        ({"a": [float("-inf")]}, "-Infinity at $.a[0]"),
        ({"a": "x\x00"}, "NUL character (\\u0000) at $.a"),
        (("ok", "\ud800"), "lone surrogate (\\ud800) at $[1]"),
        ({"a b": {"c": "\x00"}}, "at $['a b'].c"),
        (nested(100_000), f"nested more than {MAX_DEPTH} levels deep"),
        (nested(MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} levels deep"),
    ],
)
def test_python_values_that_cannot_be_stored_are_refused(value, problem):
    with pytest.raises(NotStorable) as refused:
        storable.dumps(value, "python tool result")
    assert problem in str(refused.value)


def test_python_values_that_are_not_json_are_refused_and_never_walked_forever():
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    with pytest.raises(NotStorable, match="refers to itself"):
        storable.dumps(cycle, "result")
    with pytest.raises(NotStorable, match="is not JSON: Object of type set"):
        storable.dumps({1, 2}, "result")


def test_dumps_is_json_dumps_for_what_can_be_stored():
    value = {"t": ("a", 1), "n": None, "f": 1.5, "deep": nested(MAX_DEPTH - 1)}  # 128 with the dict
    assert storable.dumps(value, "x") == json.dumps(value)


def test_text_columns_refuse_nul_and_surrogates_and_our_messages_show_them_escaped():
    with pytest.raises(NotStorable, match=r"message content cannot be stored: it holds a NUL"):
        storable.check_text("message content", "a\x00b")
    with pytest.raises(NotStorable, match=r"lone surrogate \(\\udc00\)"):
        storable.check_text("message content", "a\udc00")
    storable.check_text("message content", "fine \U0001f600")
    storable.check_text("message content", None)
    assert storable.printable("body: a\x00b\ud800") == "body: a\\u0000b\\ud800"
    assert storable.printable("fine") == "fine"
