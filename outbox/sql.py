"""Named SQL queries, kept in ``.sql`` files and loaded once per schema.

A file holds blocks that start with ``-- name: query_name`` followed by a one-line comment
saying what the query does. ``{s}`` stands for the quoted schema name; it is substituted
once when the file is loaded (the schema name is validated as a plain identifier first), so
running a query costs nothing more than its text.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString, cast

from outbox.db import quote_ident, schema_name

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a file into ``{name: sql}``."""
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@cache
def load(path: Path, schema: str) -> dict[str, LiteralString]:
    quoted = quote_ident(schema)
    return {
        name: cast(LiteralString, body.replace("{s}", quoted))  # type: ignore[redundant-cast]
        for name, body in parse(path.read_text()).items()
    }


class Queries:
    """Attribute access to the queries of one file: ``Q.claim``."""

    def __init__(self, path: Path, schema: str | None = None) -> None:
        self._path = path
        self._schema = schema

    def __getattr__(self, name: str) -> LiteralString:
        queries = load(self._path, self._schema or schema_name())
        try:
            return queries[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in {self._path.name}") from None


def queries(filename: str, package_dir: Path | None = None) -> Queries:
    base = package_dir or Path(__file__).parent / "queries"
    return Queries(base / filename)
