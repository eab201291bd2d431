"""The canary-secret test: a tool credential reaches the tool and nothing else.

The relay resolves ``credential_ref`` at call time (``$OUTBOX_SECRET_<REF>``) and sends it
as ``Authorization: Bearer``. A random canary plays the secret; the tool fails once with
500 so that errors get written (``last_error``, journal details, log lines). Then the
canary is searched for everywhere the relay writes: every table of the schema dumped as
text, and every captured log line.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from outbox import writer
from outbox.logs import JsonFormatter
from outbox.relay.executors import RESPONSE_PREVIEW_CHARS
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService, credential_encodings, echo_body
from tests.relay_harness import (
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    seed,
    tool_call_states,
    wait_until,
)

# After 39 characters ("canary-" and 32 hex digits), "~~~" and "???" fall on 3-byte
# boundaries and encode to "fn5+" and "Pz8/": the canary's base64 then differs from its
# base64url. The quote, the backslash and the rest differ in JSON and in URL-encoding.
CANARY_TAIL = '~~~???"\\/&=+'
WINDOW = 12  # characters: no run this long of any encoded form may be left anywhere


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


def encoded_windows(canary: str) -> set[str]:
    """Every ``WINDOW``-character run of the canary and of each form a tool re-encodes it
    in, computed with the standard library (``credential_encodings``), not the masker."""
    forms = credential_encodings(canary)
    forms["basic"] = forms["basic"].removeprefix("Basic ")
    forms["json"] = json.dumps(canary)[1:-1]  # the secret's own part of the JSON text
    forms["plain"] = canary
    return {f[i : i + WINDOW] for f in forms.values() for i in range(len(f) - WINDOW + 1)}


def test_a_credential_echoed_re_encoded_reaches_no_table_log_error_or_model_request(
    db_url, monkeypatch, caplog
):
    """A tool that answers with the credential plain, in base64, inside the base64 of
    ``Basic user:secret``, in base64url, URL-encoded and JSON-escaped: in a 401 whose
    error preview is cut inside the ``Basic`` value, in a result, in a 500 that is
    retried, and in a 500 of a tool that is not called twice (its outbox row is parked
    with the error). No run of 12 characters of any of those forms is left in any table
    (results, messages, journal, last_error), any log line, or any request the model
    received."""
    canary = "canary-" + secrets.token_hex(16) + CANARY_TAIL
    assert credential_encodings(canary)["base64url"] not in credential_encodings(canary)["base64"]
    monkeypatch.setenv("OUTBOX_SECRET_CRM", canary)
    # The 401's preview ends 20 characters into the base64 of "user:<canary>".
    body_without_filler = json.dumps(echo_body(f"Bearer {canary}", encoded=True))
    basic_at = body_without_filler.index(credential_encodings(canary)["basic"]) + len("Basic ")
    padding = RESPONSE_PREVIEW_CHARS - basic_at - 20
    calls = [{"name": "crm_update", "arguments": {"n": n}} for n in range(3)]
    with FakeToolService(standard_tools=False) as service, ScriptedModel() as model:
        tool = service.add_tool("crm_update", "key")
        tool.echo_credentials(status=401, n=1, padding=padding, encoded=True)
        tool.echo_credentials(status=200, n=1, encoded=True)
        tool.echo_credentials(status=500, n=1, encoded=True)
        parked = service.add_tool("crm_send", "none")
        parked.echo_credentials(status=500, n=1, encoded=True)
        model.add_script("echo", [{"tool_calls": calls}, {"text": "done"}])
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "crm_update", "key", credential_ref="crm")
            register_tool(conn, service, "crm_send", "none", credential_ref="crm")
            thread = writer.create_thread(conn, "acme").id
            run = writer.start_run(
                conn,
                StartRun(tenant_id="acme", thread_id=thread, model="m", message="script:echo",
                         tools=["crm_update"], base_url=model.url + "/v1"),
            )  # fmt: skip
            conn.commit()
        seed(db_url, ["crm_send"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
        caplog.set_level(logging.DEBUG, logger="relay")
        with relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")):
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id])
                    == "completed"
                ),
                what="the run",
            )
            last_error = wait_until(
                lambda: scalar(
                    db_url, "SELECT last_error FROM outbox.outbox WHERE status = 'quarantined'"
                ),
                what="the call that is not repeated to be parked",
            )
        deliveries = tool.deliveries
        requests = json.dumps([r.to_json() for r in model.requests], default=str)

    assert [d.status for d in deliveries].count(500) == 1 and len(deliveries) == 4
    assert {d.headers["authorization"] for d in deliveries} == {f"Bearer {canary}"}
    echoed = scalar(
        db_url, "SELECT output->'encoded' FROM outbox.tool_results WHERE output ? 'encoded'"
    )
    assert echoed is not None and set(echoed) == set(credential_encodings(canary))
    assert all("[redacted credential]" in form for form in echoed.values()), echoed
    assert "HTTP 401 from crm_update" in requests and "[redacted credential]" in requests
    assert "HTTP 500" in last_error and "[redacted credential]" in last_error

    formatter = JsonFormatter()
    texts = {f"table {name}": text for name, text in dump_schema(db_url).items()}
    texts |= {"model requests": requests}
    texts |= {"relay log": "\n".join(formatter.format(r) for r in caplog.records)}
    assert "HTTP 500" in texts["table journal"] and "retry_scheduled" in texts["relay log"]
    windows = encoded_windows(canary)
    leaks = {where for where, text in texts.items() for w in windows if w in text}
    assert leaks == set(), f"an encoded form of the canary leaked into {sorted(leaks)}"
