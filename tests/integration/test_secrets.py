"""The canary-secret test: a tool credential reaches the tool and nothing else.

The relay resolves ``credential_ref`` at call time (``$OUTBOX_SECRET_<REF>``) and sends it
as ``Authorization: Bearer``. A random canary plays the secret; the tool fails once with
500 so that errors get written (``last_error``, journal details, log lines). Then the
canary is searched for everywhere the relay writes: every table of the schema dumped as
text, and every captured log line.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from outbox.logs import JsonFormatter
from outbox.testing.tools import FakeToolService
from tests.relay_harness import (
    all_settled,
    register_tool,
    relay_thread,
    seed,
    tool_call_states,
    wait_until,
)


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        yield svc


def dump_schema(db_url: str, schema: str = "outbox") -> dict[str, str]:
    """Every table of ``schema``, each row rendered as text."""
    dumped: dict[str, str] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY 1",
            [schema],
        ).fetchall()
        for (table,) in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            dumped[table] = "\n".join(row[0] for row in conn.execute(query).fetchall())
    return dumped


def test_the_credential_reaches_the_tool_and_is_stored_and_logged_nowhere(
    db_url, service, monkeypatch, caplog
):
    canary = "canary-" + secrets.token_hex(16)
    monkeypatch.setenv("OUTBOX_SECRET_CRM", canary)
    tool = service.add_tool("crm_update", "key")
    tool.fail(status=500, n=1)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "crm_update", "key", credential_ref="crm")
        conn.commit()
    seed(db_url, ["crm_update"], runs=1, calls_per_batch=2, args=lambda n: {"n": n})
    caplog.set_level(logging.DEBUG, logger="relay")
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the calls to succeed after the 500")
    assert tool_call_states(db_url) == {"succeeded": 2}

    deliveries = tool.deliveries
    assert [d.status for d in deliveries].count(500) == 1 and len(deliveries) == 3
    assert {d.headers["authorization"] for d in deliveries} == {f"Bearer {canary}"}

    tables = dump_schema(db_url)
    assert {"journal", "outbox", "tool_calls", "tool_results", "tools"} <= set(tables)
    assert "HTTP 500" in tables["journal"]  # the error was written, without the secret
    leaks = [name for name, text in tables.items() if canary in text]
    assert leaks == [], f"the canary leaked into {leaks}"

    formatter = JsonFormatter()
    lines = [formatter.format(record) for record in caplog.records]
    assert any("retry_scheduled" in line for line in lines)
    assert not [line for line in lines if canary in line]
    assert canary not in caplog.text


@pytest.mark.parametrize("status", [401, 200])
def test_a_credential_the_tool_echoes_back_is_redacted_before_anything_stores_it(
    db_url, service, monkeypatch, caplog, status
):
    """A careless API echoes the bearer token in its 401 body (or in a result): what the
    relay stores, logs and would replay to the model carries no trace of it."""
    canary = "canary-" + secrets.token_hex(16)
    monkeypatch.setenv("OUTBOX_SECRET_CRM", canary)
    tool = service.add_tool("crm_update", "key")
    tool.echo_credentials(status=status, n=1)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "crm_update", "key", credential_ref="crm")
        conn.commit()
    seed(db_url, ["crm_update"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    caplog.set_level(logging.DEBUG, logger="relay")
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to get its result")
    (delivery,) = tool.deliveries
    assert canary in delivery.headers["authorization"]  # the tool did get it, and echoed it

    tables = dump_schema(db_url)
    assert "[redacted credential]" in tables["tool_results"]
    leaks = [name for name, text in tables.items() if canary in text]
    assert leaks == [], f"the canary leaked into {leaks}"
    formatter = JsonFormatter()
    assert not [r for r in caplog.records if canary in formatter.format(r)]
