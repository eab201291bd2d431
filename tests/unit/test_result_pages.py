"""The pages read_result answers and the handles it takes (outbox.context): whole
characters whatever the offsets, every byte read once, nothing but a handle accepted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from outbox import context


@given(st.text(min_size=0, max_size=300), st.integers(min_value=1, max_value=40))
def test_pages_read_in_turn_give_back_the_whole_text(text: str, size: int) -> None:
    offset: int | None = 0
    parts = []
    while offset is not None:
        page = context.page(text, offset, size)
        assert page["offset"] == offset and page["total_bytes"] == len(text.encode())
        parts.append(page["text"])
        assert page["next_offset"] is None or page["next_offset"] > offset  # always moves on
        offset = page["next_offset"]
    assert "".join(parts) == text


def test_an_offset_inside_a_character_starts_at_the_next_one() -> None:
    text = "aé" * 3  # é is two bytes: offsets 1, 4 and 7 start it, 2, 5 and 8 are inside
    assert context.page(text, 2, 3)["text"] == "aé"
    assert context.page(text, 2, 3)["offset"] == 3
    assert context.page(text, 1, 1)["text"] == "é"  # a page too small for one character
    assert context.page(text, 100, 5) == {
        "offset": 9,
        "text": "",
        "next_offset": None,
        "total_bytes": 9,
    }


def test_only_a_handle_names_a_message() -> None:
    assert context.message_of(context.handle(812)) == 812
    for given_text in (
        "812",
        "result-",
        "result-8x",
        "result--1",
        "other-812",
        "result-" + "9" * 30,
    ):
        assert context.message_of(given_text) is None
