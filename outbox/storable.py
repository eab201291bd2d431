"""JSON and text at the edge: what PostgreSQL and Python can take, decided once.

Whatever arrives from outside (a tool's answer, a python tool's return value, a model's
answer, a client's tool outputs, a body sent to ``outbox serve``, JSON given to the CLI)
passes through here before it is stored. Some JSON that parses is still not storable:

- a NUL character (``\\u0000``) in a string or a key: PostgreSQL's ``jsonb`` refuses it
  (SQLSTATE 22P05) and so does a ``text`` column (22021);
- a lone UTF-16 surrogate (``\\ud800`` without its pair): not Unicode text, so it cannot
  be encoded to UTF-8 for the server;
- ``NaN``, ``Infinity`` and numbers beyond a float's range (``1e400`` parses as ``inf``):
  not JSON, and ``jsonb`` refuses them (22P02);
- nesting deeper than ``MAX_DEPTH``: Python's parser and encoder recurse (a body nested
  100,000 deep raises ``RecursionError``), pydantic stops serializing at about 250
  levels, and PostgreSQL's parser at its stack depth (54001).

Nothing here is removed or replaced to make a value fit: dropping a NUL or a surrogate
changes what a tool said, so such a value is refused with ``NotStorable`` (an
``InvalidInput``), naming the problem and where it is. The only cleaning is what JSON
itself does without changing meaning (a tuple becomes a list). The errors the relay
composes about foreign bytes (``printable``) are the exception: they are our own text, and
a NUL in them is shown escaped.

The checks are cheap for the usual case: the text is searched (in C) for what could be a
problem, and only when something could be is the value walked (iteratively) to find it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from outbox.errors import InvalidInput

# Levels of arrays and objects a value may nest: serde_json's default limit, well inside
# what Python's recursive JSON code, pydantic's serializer (about 250) and PostgreSQL's
# parser take. Not configurable: past about 250 levels no value makes the round trip.
MAX_DEPTH = 128
PATH_KEY_CHARS = 40  # of a key shown in the path of a problem
SURROGATE = re.compile("[\ud800-\udfff]")
# A surrogate escaped in JSON text (a pair, as json.dumps writes characters beyond the
# BMP, matches too: the walk tells them apart).
ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
NOT_BRACKET = re.compile(r"[^\[\]{}]+")
EMPTY_PAIR = re.compile(r"\[\]|\{\}")
IN_TEXT = "PostgreSQL cannot store"
IN_JSONB = "PostgreSQL's jsonb cannot store"


class NotStorable(InvalidInput):
    """A value that parses but that PostgreSQL or Python cannot take as it is; ``problem``
    says what it holds and where, for a caller who words the message itself."""

    problem: str = ""

    hint = (
        "send it without NUL characters, lone surrogates, NaN or Infinity, nested at most "
        f"{MAX_DEPTH} levels deep; binary data can travel as base64"
    )


def loads(data: str | bytes, what: str) -> Any:
    """Parse ``data`` as JSON that can be stored. ``NotStorable`` names what could not
    (``what`` says whose it is: "tool result"); a ``ValueError`` when it is not JSON
    (bytes that are not UTF-8, -16 or -32 included)."""
    text = data if isinstance(data, str) else data.decode(json.detect_encoding(data))
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise _refused(what, f"it is nested more than {MAX_DEPTH} levels deep") from None
    except _Refused as err:
        raise _refused(what, err.args[0]) from None
    # Bytes decoded strictly hold no raw surrogate (UTF-8 cannot encode one); a str may.
    _check(value, text, what, raw_surrogates=isinstance(data, str))
    return value


def dumps(value: Any, what: str) -> str:
    """``value`` as JSON text that can be stored (``json.dumps``' default format), or
    ``NotStorable`` naming why not."""
    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise _refused(what, f"it is nested more than {MAX_DEPTH} levels deep") from None
    except TypeError as err:
        raise NotStorable(f"{what} is not JSON: {err}") from None
    except ValueError as err:
        if "ircular" in str(err):  # a walk of a cycle would not end
            raise NotStorable(f"{what} is not JSON: it refers to itself") from None
        raise _refused(what, _problem(value) or str(err)) from None
    _check(value, text, what, raw_surrogates=False)  # ensure_ascii: every one escaped
    return text


def check(value: Any, what: str) -> None:
    """Raise ``NotStorable`` when ``value`` could not be stored as ``jsonb``."""
    dumps(value, what)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot go into a ``text`` column, or None."""
    if "\x00" in text:
        return f"it holds a NUL character (\\u0000), which {IN_TEXT}"
    found = SURROGATE.search(text)
    if found:
        return f"it holds a lone surrogate ({_escaped(found.group())}), which is not Unicode text"
    return None


def check_text(what: str, text: str | None) -> None:
    """Raise ``NotStorable`` when ``text`` cannot go into a ``text`` column."""
    problem = None if text is None else text_problem(text)
    if problem:
        raise NotStorable(f"{what} cannot be stored: {problem}")


def printable(text: str) -> str:
    """``text`` with what a ``text`` column refuses shown escaped: for messages we compose
    (errors quoting a foreign body), never for a value we were given to store."""
    if "\x00" not in text and not SURROGATE.search(text):
        return text
    return SURROGATE.sub(lambda m: _escaped(m.group()), text.replace("\x00", "\\u0000"))


# -- inside -----------------------------------------------------------------------------


class _Refused(ValueError):
    """Raised from inside the parser, to stop it at the first problem."""


def _constant(name: str) -> Any:
    raise _Refused(f"it holds {name}, which JSON does not allow")


def _finite(literal: str) -> float:
    """A float the parser read; ``1e400`` would be ``inf``, which no jsonb can hold. (A
    Python call per float cost 0.14 us each; a search of the text for big exponents cost
    more for every result.)"""
    number = float(literal)
    if math.isinf(number):
        shown = literal if len(literal) <= 40 else literal[:40] + "..."
        raise _Refused(f"it holds the number {shown}, beyond a float's range")
    return number


def _refused(what: str, problem: str) -> NotStorable:
    err = NotStorable(f"{what} is not storable JSON: {problem}")
    err.problem = problem
    return err


def _check(value: Any, text: str, what: str, *, raw_surrogates: bool) -> None:
    """Find what ``text`` (the JSON of ``value``) hints at, walking ``value`` only then."""
    if _deeper_than_max(text):
        raise _refused(what, f"it is nested more than {MAX_DEPTH} levels deep")
    if (
        "\\u0000" in text
        or ESCAPED_SURROGATE.search(text)
        or (raw_surrogates and SURROGATE.search(text))
    ):
        problem = _problem(value)
        if problem:
            raise _refused(what, problem)


def _deeper_than_max(text: str) -> bool:
    """Whether well-formed JSON ``text`` nests more than ``MAX_DEPTH`` levels, by regular
    expressions (in C): its brackets outside strings, then the innermost empty pairs
    removed once per level. A walk of the parsed value cost as much as parsing it."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    shape = NOT_BRACKET.sub("", JSON_STRING.sub("", text))
    for _ in range(MAX_DEPTH):
        shape, removed = EMPTY_PAIR.subn("", shape)
        if not shape or not removed:
            return False
    return bool(shape)


def _problem(value: Any) -> str | None:
    """The first problem of ``value`` (a walk, not a recursion), with where it is."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        item, depth, path = stack.pop()
        problem = None
        if isinstance(item, str):
            problem = _string_problem(item, path)
        elif isinstance(item, float) and not math.isfinite(item):
            problem = f"it holds {_constant_name(item)} at {path}, which JSON does not allow"
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return f"it is nested more than {MAX_DEPTH} levels deep (at {path})"
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        problem = problem or _string_problem(key, path, key=True)
                    stack.append((child, depth + 1, _at(path, key)))
            else:
                stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item))
        if problem:
            return problem
    return None


def _string_problem(text: str, path: str, *, key: bool = False) -> str | None:
    where = f"in a key at {path}" if key else f"at {path}"
    if "\x00" in text:
        return f"it holds a NUL character (\\u0000) {where}, which {IN_JSONB}"
    found = SURROGATE.search(text)
    if found:
        return (
            f"it holds a lone surrogate ({_escaped(found.group())}) {where}, which is not "
            "Unicode text"
        )
    return None


def _constant_name(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


def _at(path: str, key: Any) -> str:
    name = str(key)
    if len(name) > PATH_KEY_CHARS:
        name = name[:PATH_KEY_CHARS] + "..."
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return f"{path}.{name}"
    return f"{path}[{name!r}]"


def _escaped(char: str) -> str:
    return f"\\u{ord(char):04x}"
