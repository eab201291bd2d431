"""Named SQL queries, kept in ``.sql`` files and loaded once per schema; and the SQL DBAs run.

This package holds the plain SQL a DBA or a backend without Python reads, every live object
of the schema that is not a table, as it stands at the head revision: ``roles.sql`` (the
roles); the versioned functions with their grants, one file a concern (``FUNCTION_FILES``:
tenancy, runs, payloads, claims, results, turns, approvals, journal, retention, spans);
``views.sql`` (the DBA views), ``policies.sql`` (the grants on tables and views, row-level
security) and ``triggers.sql`` (the triggers and their functions). A function's name
carries a version, so old and new code can overlap during a deploy. Each migration applies
a frozen copy of what it changes; ``tests/migration/test_history.py`` checks that these
files equal what the head revision creates and that nothing it creates is missing from
them. ``sql_file`` reads them; ``LIVE_FILES`` lists them in the order they apply.

Named queries:

A file holds blocks that start with ``-- name: query_name`` followed by a one-line comment
saying what the query does. ``{s}`` stands for the quoted schema name; it is substituted
once when the file is loaded (the schema name is validated as a plain identifier first), so
running a query costs nothing more than its text.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import LiteralString, cast

from outbox.db import quote_ident, schema_name

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)

# The files of the functions, by concern. A plain SQL function is checked against the
# functions it calls when it is created, so a file comes after those it calls: claims.sql
# calls run_over_v1 (runs.sql), retention.sql run_ended_v1 (runs.sql) and the readers of
# payloads.sql.
FUNCTION_FILES: tuple[str, ...] = (
    "tenancy.sql",
    "runs.sql",
    "payloads.sql",
    "claims.sql",
    "results.sql",
    "turns.sql",
    "approvals.sql",
    "journal.sql",
    "retention.sql",
    "spans.sql",
)

# The files of the schema's live objects, in the order they apply to a database whose tables
# exist: the roles the grants name, the functions the views and policies call, the views the
# grants name, then grants and policies, then the triggers.
LIVE_FILES: tuple[str, ...] = (
    "roles.sql",
    *FUNCTION_FILES,
    "views.sql",
    "policies.sql",
    "triggers.sql",
)


def parse(text: str) -> dict[str, str]:
    """Split a file into ``{name: sql}``."""
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def sql_file(name: str) -> str:
    """The text of ``sql/<name>`` (one of ``LIVE_FILES``), read as package data."""
    return resources.files(__name__).joinpath(name).read_text()


def load(path: Traversable, schema: str) -> dict[str, LiteralString]:
    """The queries of ``path`` for ``schema``, read and substituted once."""
    return _load(path, schema)  # type: ignore[arg-type]  # files() paths are hashable


@cache
def _load(path: Hashable, schema: str) -> dict[str, LiteralString]:
    assert isinstance(path, Traversable)
    quoted = quote_ident(schema)
    return {
        name: cast(LiteralString, body.replace("{s}", quoted))  # type: ignore[redundant-cast]
        for name, body in parse(path.read_text()).items()
    }


class Queries:
    """Attribute access to the queries of one file: ``Q.claim``."""

    def __init__(self, path: Traversable, schema: str | None = None) -> None:
        self._path = path
        self._schema = schema

    def __getattr__(self, name: str) -> LiteralString:
        queries = load(self._path, self._schema or schema_name())
        try:
            return queries[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in {self._path.name}") from None


def queries(filename: str, package: str = "outbox") -> Queries:
    """The named queries of ``<package>/queries/<filename>``, read as package data."""
    return Queries(resources.files(package) / "queries" / filename)
