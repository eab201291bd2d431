"""The credential masker (``outbox.credentials.redact``): a secret in the forms tools
re-encode it in.

No database: every expected encoding here is made with the standard library, never with
the masker's own helpers, so a form the masker forgets shows up as a test that fails.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from outbox.credentials import MIN_BASE64_CHARS, REDACTED, forms, redact, redact_value

SECRET = 'sk-live-"q\\/é~~~???&= 42'  # quotes, slashes, non-ASCII, URL- and base64-specials


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


WHOLE_FORMS = {
    "plain": SECRET,
    "base64": b64(SECRET.encode()),
    "base64 unpadded": b64(SECRET.encode()).rstrip("="),
    "base64url": b64url(SECRET.encode()),
    "base64url unpadded": b64url(SECRET.encode()).rstrip("="),
    "quote": urllib.parse.quote(SECRET, safe=""),
    "quote keeping /": urllib.parse.quote(SECRET),
    "quote_plus": urllib.parse.quote_plus(SECRET),
    "quote, lower-case hex": re.sub(
        "%[0-9A-F]{2}", lambda m: m[0].lower(), urllib.parse.quote(SECRET, safe="")
    ),
    "json": json.dumps(SECRET)[1:-1],
    "json, non-ASCII kept": json.dumps(SECRET, ensure_ascii=False)[1:-1],
    "json, / escaped": json.dumps(SECRET)[1:-1].replace("/", "\\/"),
    "json twice": json.dumps(json.dumps(SECRET))[3:-3],
}


@pytest.mark.parametrize("name", WHOLE_FORMS)
def test_each_encoding_of_the_secret_is_cut_whole_inside_a_longer_text(name: str) -> None:
    text = f"the token was {WHOLE_FORMS[name]}, and nothing else"
    assert redact(text, SECRET) == f"the token was {REDACTED}, and nothing else"


def test_the_forms_differ_from_each_other_so_each_case_above_tests_one() -> None:
    assert len(set(WHOLE_FORMS.values())) == len(WHOLE_FORMS)


def _kept_bounds(prefix: int, size: int, encoded: str) -> tuple[int, int]:
    """How many characters may stay before and after the secret's base64: those of the
    neighbours plus the one character each side shared with a neighbour's bits."""
    return -(-8 * prefix // 6), len(encoded) - 8 * (prefix + size) // 6


@pytest.mark.parametrize("encode", [b64, b64url], ids=["base64", "base64url"])
@pytest.mark.parametrize("prefix", ["", "u", "us", "use", "user:", "Bearer "])
@pytest.mark.parametrize("suffix", ["", "\n", "xy", ":xyz"])
def test_base64_of_the_secret_inside_a_longer_value_is_cut_at_every_alignment(
    encode: Any, prefix: str, suffix: str
) -> None:
    raw = SECRET.encode()
    encoded = encode(prefix.encode() + raw + suffix.encode())
    out = redact(f"Authorization: Basic {encoded}", SECRET)
    head, tail = out.removeprefix("Authorization: Basic ").split(REDACTED)
    most_head, most_tail = _kept_bounds(len(prefix.encode()), len(raw), encoded)
    assert len(head) <= most_head and len(tail) <= most_tail, (encoded, out)


def test_basic_credentials_of_a_user_and_the_secret_keep_only_the_user() -> None:
    """``user:`` is 5 bytes: the secret starts at byte 2 of a 3-byte group."""
    value = b64(b"user:" + SECRET.encode())
    out = redact(f"Basic {value}", SECRET)
    assert out.startswith(f"Basic {b64(b'use')}") and REDACTED in out
    assert len(out.partition(REDACTED)[0]) <= len("Basic ") + 7  # "user:" is 6.7 characters


@given(
    secret=st.text(min_size=7, max_size=40).filter(lambda s: len(s.encode()) >= 7),
    prefix=st.binary(max_size=8),
    suffix=st.binary(max_size=8),
)
@example(secret="0000000", prefix=b"0", suffix=b"")  # the secret at two offsets
def test_any_secret_of_7_bytes_is_cut_from_any_base64_it_is_part_of(
    secret: str, prefix: bytes, suffix: bytes
) -> None:
    raw = secret.encode()
    whole = prefix + raw + suffix
    # The bounds are those of the secret at len(prefix). Where it is found at another
    # offset too (secret "0000000" after prefix b"0"), the first occurrence is cut and the
    # bounds do not apply.
    assume(whole.find(raw) == whole.rfind(raw) == len(prefix))
    for encode in (b64, b64url):
        encoded = encode(whole)
        out = redact(encoded, secret)
        assert out.count(REDACTED) >= 1, (secret, encoded)
        head, _, rest = out.partition(REDACTED)
        tail = rest.rpartition(REDACTED)[2]
        most_head, most_tail = _kept_bounds(len(prefix), len(raw), encoded)
        assert len(head) <= most_head and len(tail) <= most_tail, (secret, encoded, out)


def test_a_short_secret_is_cut_plain_but_its_short_base64_is_not() -> None:
    """A few base64 characters of a short secret turn up in any encoded text: cutting them
    would redact unrelated content. The plain text is cut at any length, and from 7 bytes
    on, its base64 at every alignment."""
    assert redact("pin abc, again abc", "abc") == f"pin {REDACTED}, again {REDACTED}"
    unrelated = "YWJjZGVmZ2hp"  # base64 of "abcdefghi": starts with base64("abc")
    assert redact(unrelated, "abc") == unrelated
    assert forms("abc") == ("abc",)
    for size, every_alignment in ((6, False), (7, True)):
        secret = "abcdefg"[:size]
        inside = [b64(b"x" * at + secret.encode() + b"yz") for at in range(3)]
        cut = [REDACTED in redact(encoded, secret) for encoded in inside]
        assert all(cut) is every_alignment, (secret, cut)
    assert min(map(len, forms("abcdefg")[:-1])) >= MIN_BASE64_CHARS


def test_forms_are_cut_longest_first_so_no_padding_or_edge_is_left() -> None:
    padded = b64(b"0123456")  # 7 bytes: two characters of padding
    assert padded.endswith("==")
    assert redact(f"[{padded}]", "0123456") == f"[{REDACTED}]"
    assert list(forms(SECRET)) == sorted(forms(SECRET), key=lambda f: (-len(f), f))


def test_a_structured_answer_is_redacted_string_by_string_and_stays_json() -> None:
    answer: dict[str, Any] = {
        "got": f"Bearer {SECRET}",
        SECRET: "the secret as a key",
        "encoded": (b64(b"user:" + SECRET.encode()), urllib.parse.quote_plus(SECRET)),
        "raw": json.dumps({"token": SECRET}),
        "n": 42,
        "ok": True,
        "none": None,
    }
    out = redact_value(answer, SECRET)
    assert out["got"] == f"Bearer {REDACTED}"
    assert out[REDACTED] == "the secret as a key"
    assert isinstance(out["encoded"], list) and all(REDACTED in e for e in out["encoded"])
    assert json.loads(out["raw"]) == {"token": REDACTED}  # the JSON text inside is intact
    assert (out["n"], out["ok"], out["none"]) == (42, True, None)
    text = json.dumps(out)
    assert json.loads(text) == out
    for form in WHOLE_FORMS.values():
        assert form not in text


def test_no_secret_redacts_nothing() -> None:
    assert redact("anything", "") == "anything"
    assert redact_value({"a": ["b"]}, "") == {"a": ["b"]}
