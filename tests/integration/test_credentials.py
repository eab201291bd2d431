"""The credential broker: per-tenant secrets, by reference or encrypted,
minted per call into the tool's own request, rotated, revoked, and never stored, logged or
shown to the model.

The canary test: a random secret per tenant, a tool that echoes the credential it got,
and then the canary is searched for in every table, every log line and every request the
model received.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import credentials, ops, registry, writer
from outbox.logs import JsonFormatter
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService, credential_encodings
from tests.helpers import new_run, turn
from tests.integration.test_secrets import CANARY_TAIL, dump_schema, encoded_windows
from tests.relay_harness import (
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        yield svc


@pytest.fixture
def key(monkeypatch) -> str:
    value = credentials.new_key()
    monkeypatch.setenv(credentials.KEY_ENV, value)
    return value


def call_tool(db_url: str, tenant: str, tool: str, n: int = 1) -> list[int]:
    """A run of ``tenant`` whose first turn asks for ``n`` calls of ``tool``."""
    with psycopg.connect(db_url) as conn:
        run = new_run(conn, tenant=tenant, tools=[tool])
        calls = [(f"call_{i}", tool, {"n": i}) for i in range(n)]
        refs = writer.record_model_turn(conn, turn(run, 1, *calls)).tool_call_refs
        conn.commit()
    return refs


def results(db_url: str) -> dict[str, tuple[str, Any, Any]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT tc.tenant_id, r.status, r.output, r.error FROM outbox.tool_results r "
            "JOIN outbox.tool_calls tc ON tc.id = r.tool_call_ref"
        ).fetchall()
    return {tenant: (status, output, error) for tenant, status, output, error in rows}


def settled(db_url: str, n: int) -> bool:
    return scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == n


def test_each_tenant_s_call_carries_its_own_secret_and_none_is_stored(db_url, service, key, caplog):
    tool = service.add_tool("crm_update", "key")
    canaries = {t: f"canary-{t}-{secrets.token_hex(12)}" for t in ("tenant-a", "default")}
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "crm_update", "key", credential_ref="crm")
        credentials.set_credential(conn, "crm", tenant_id="tenant-a", value=canaries["tenant-a"])
        credentials.set_credential(
            conn, "crm", value=canaries["default"], header="X-Api-Key", scheme=""
        )
        conn.commit()
    tool.echo_credentials(status=200, n=None)  # every answer echoes what it was sent
    call_tool(db_url, "tenant-a", "crm_update")
    call_tool(db_url, "tenant-b", "crm_update")  # no credential of its own: the default
    caplog.set_level(logging.DEBUG, logger="relay")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 2), what="both calls")
    sent = {d.headers["x-outbox-run-id"]: d.headers for d in tool.deliveries}
    assert len(sent) == 2
    by_tenant = {
        tenant: headers
        for headers in sent.values()
        for tenant in ("tenant-a", "tenant-b")
        if scalar(
            db_url, "SELECT tenant_id FROM outbox.runs WHERE id = %s", [headers["x-outbox-run-id"]]
        )
        == tenant
    }
    assert by_tenant["tenant-a"]["authorization"] == f"Bearer {canaries['tenant-a']}"
    assert "x-api-key" not in by_tenant["tenant-a"]
    assert by_tenant["tenant-b"]["x-api-key"] == canaries["default"]
    assert "authorization" not in by_tenant["tenant-b"]

    stored = results(db_url)
    assert stored["tenant-a"][1]["got"] == "Bearer [redacted credential]"
    assert stored["tenant-b"][1]["got"] == "[redacted credential]"
    tables = dump_schema(db_url)
    assert "gAAAAA" in tables["credentials"]  # the Fernet ciphertext, not the value
    for canary in canaries.values():
        assert [name for name, text in tables.items() if canary in text] == []
        formatter = JsonFormatter()
        assert not [r for r in caplog.records if canary in formatter.format(r)]


def test_rotation_revocation_and_a_missing_reference(db_url, service, key, monkeypatch):
    tool = service.add_tool("crm_update", "key")
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "crm_update", "key", credential_ref="crm")
        first = credentials.set_credential(conn, "crm", tenant_id="acme", env="CRM_TOKEN")
        conn.commit()
    assert (first["source"], first["version"]) == ("env", 1)

    # The variable the reference names is missing: the call is parked for an operator with
    # an error that names it, nothing reaches the tool; fixed and requeued, it runs.
    (ref,) = call_tool(db_url, "acme", "crm_update")
    parked = (
        "SELECT last_error FROM outbox.outbox WHERE tool_call_ref = %s AND status = 'quarantined'"
    )
    with relay_thread(db_url):
        error = wait_until(lambda: scalar(db_url, parked, [ref]), what="the call to be parked")
        assert "the relay has no $CRM_TOKEN" in error
        assert tool.deliveries == []
        monkeypatch.setenv("CRM_TOKEN", "token-one")
        with psycopg.connect(db_url) as conn:
            ops.requeue(conn, str(ref), actor="ops")
            conn.commit()
        wait_until(lambda: settled(db_url, 1), what="the call once the variable is there")
    assert tool.deliveries[-1].headers["authorization"] == "Bearer token-one"

    with psycopg.connect(db_url) as conn:
        rotated = credentials.set_credential(conn, "crm", tenant_id="acme", value="token-two")
        conn.commit()
    assert (rotated["source"], rotated["version"]) == ("db", 2)
    call_tool(db_url, "acme", "crm_update")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 2), what="the call after rotation")
    assert tool.deliveries[-1].headers["authorization"] == "Bearer token-two"

    with psycopg.connect(db_url) as conn:
        credentials.revoke(conn, "crm", tenant_id="acme", actor="sec-team")
        conn.commit()
    refs = call_tool(db_url, "acme", "crm_update")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 3), what="the call after revocation")
    assert len(tool.deliveries) == 2  # not called with the revoked secret
    error = scalar(db_url, "SELECT error FROM outbox.tool_results WHERE tool_call_ref = %s", refs)
    assert "credential 'crm' of tenant acme was revoked" in error
    events = [
        r[0]
        for r in psycopg.connect(db_url).execute(
            "SELECT event FROM outbox.journal WHERE event LIKE 'credential.%' ORDER BY id"
        )
    ]
    assert events == ["credential.set", "credential.rotated", "credential.revoked"]


def test_an_in_process_tool_gets_its_context_and_only_its_secret(db_url, key):
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(
                name="ctx", executor="python", callable="tests.tooling:with_context",
                credential_ref="crm", idempotency_mode="key",
            ),
        )  # fmt: skip
        credentials.set_credential(conn, "crm", value="py-secret")
        credentials.set_credential(conn, "other", value="not-for-this-tool")
        conn.commit()
    refs = call_tool(db_url, "acme", "ctx")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 1), what="the python call")
    output = scalar(db_url, "SELECT output FROM outbox.tool_results")
    key_of_call = scalar(
        db_url, "SELECT idempotency_key FROM outbox.tool_calls WHERE id = %s", refs
    )
    assert output["idempotency_key"] == key_of_call
    assert output["credentials"] == {"crm": "[redacted credential]"}  # it got it; it is cut
    assert output["arguments"] == {"n": 0} and output["tenant_id"] == "acme"


def test_an_in_process_tool_answering_the_secret_in_a_tuple_is_redacted(db_url, key):
    """JSON stores a tuple as a list: the secret inside one must be cut like in a list."""
    canary = "canary-" + secrets.token_hex(16)
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(
                name="tup", executor="python", callable="tests.tooling:secret_in_a_tuple",
                credential_ref="crm", idempotency_mode="key",
            ),
        )  # fmt: skip
        credentials.set_credential(conn, "crm", value=canary)
        conn.commit()
    call_tool(db_url, "acme", "tup")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 1), what="the python call")
    output = scalar(db_url, "SELECT output FROM outbox.tool_results")
    assert output == {
        "pair": ["token", "[redacted credential]"],
        "nested": [{"inner": ["[redacted credential]"]}],
    }
    assert [name for name, text in dump_schema(db_url).items() if canary in text] == []


def test_an_in_process_tool_answering_the_secret_re_encoded_is_redacted(db_url, key):
    """A python tool's answer goes through the same masker as an HTTP tool's."""
    canary = "canary-" + secrets.token_hex(16) + CANARY_TAIL
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(
                name="enc", executor="python", callable="tests.tooling:secret_re_encoded",
                credential_ref="crm", idempotency_mode="key",
            ),
        )  # fmt: skip
        credentials.set_credential(conn, "crm", value=canary)
        conn.commit()
    call_tool(db_url, "acme", "enc")
    with relay_thread(db_url):
        wait_until(lambda: settled(db_url, 1), what="the python call")
    output = scalar(db_url, "SELECT output FROM outbox.tool_results")
    assert set(output) == set(credential_encodings(canary))
    assert all("[redacted credential]" in form for form in output.values()), output
    windows = encoded_windows(canary)
    tables = dump_schema(db_url)
    assert [name for name, text in tables.items() if any(w in text for w in windows)] == []


def test_the_model_never_sees_a_secret_the_tool_echoed(db_url, key):
    canary = "canary-" + secrets.token_hex(16)
    with FakeToolService(standard_tools=False) as service, ScriptedModel() as model:
        tool = service.add_tool("crm_update", "key")
        tool.echo_credentials(status=401, n=1)
        model.add_script(
            "echo",
            [{"tool_calls": [{"name": "crm_update", "arguments": {"n": 1}}]}, {"text": "done"}],
        )
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "crm_update", "key", credential_ref="crm")
            credentials.set_credential(conn, "crm", value=canary)
            thread = writer.create_thread(conn, "acme").id
            run = writer.start_run(
                conn,
                StartRun(tenant_id="acme", thread_id=thread, model="m", message="script:echo",
                         tools=["crm_update"], base_url=model.url + "/v1"),
            )  # fmt: skip
            conn.commit()
        with relay_thread(db_url, kinds=ALL_KINDS):
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id])
                    == "completed"
                ),
                what="the run",
            )
        assert canary in tool.deliveries[0].headers["authorization"]
        seen = [item.text for r in model.requests for item in r.history]
        assert any("[redacted credential]" in text for text in seen)
        assert not [text for text in seen if canary in text]


def test_a_canary_echoed_every_way_is_in_no_table_log_line_error_or_model_request(
    db_url, key, monkeypatch, tmp_path: Path
):
    """A real relay process, the scripted model and a tool that echoes the credential it
    was sent: in a 401 body long enough to be cut inside the secret, in a result, in a 500
    that is retried, and each time in the response headers too. The canary (and any
    16-character start of it) is then searched for in every table, the relay's log output
    at DEBUG, what the model received, and what an operator's commands print."""
    canary = "canary-" + secrets.token_hex(16)
    calls = [{"name": "crm_update", "arguments": {"n": n}} for n in range(3)]
    with FakeToolService(standard_tools=False) as service, ScriptedModel() as model:
        tool = service.add_tool("crm_update", "key")
        # The body is {"message": "<filler>credentials rejected: Bearer <canary>", ...}: with
        # 440 characters of filler, the relay's 500-character preview ends inside the canary.
        tool.echo_credentials(status=401, n=1, padding=440)
        tool.echo_credentials(status=200, n=1)
        tool.echo_credentials(status=500, n=1)
        model.add_script("echo", [{"tool_calls": calls}, {"text": "done"}])
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "crm_update", "key", credential_ref="crm")
            credentials.set_credential(conn, "crm", value=canary)
            thread = writer.create_thread(conn, "acme").id
            run = writer.start_run(
                conn,
                StartRun(tenant_id="acme", thread_id=thread, model="m", message="script:echo",
                         tools=["crm_update"], base_url=model.url + "/v1"),
            )  # fmt: skip
            conn.commit()
        log = tmp_path / "relay.log"
        kinds = [a for k in ALL_KINDS for a in ("--kind", k)]
        relay = start_relay_process(db_url, log, *kinds, "--log-level", "DEBUG")
        try:
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id])
                    == "completed"
                ),
                timeout_s=60,
                what="the run",
            )
        finally:
            relay.terminate()
            relay.wait(timeout=30)
        deliveries = tool.deliveries
        requests = json.dumps([r.to_json() for r in model.requests], default=str)

    assert [d.status for d in deliveries].count(500) == 1 and len(deliveries) == 4
    assert {d.headers["authorization"] for d in deliveries} == {f"Bearer {canary}"}
    assert "HTTP 401 from crm_update" in requests and "[redacted credential]" in requests
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    printed = [
        runner.invoke(cli.main, args).output
        for args in (
            ["runs", "show", str(run.id), "--json"],
            ["journal", "tail", "--run", str(run.id), "-n", "200", "--json"],
        )
    ]
    assert "HTTP 500" in printed[1]  # the retried error was journaled (and is printed)
    texts = {f"table {name}": text for name, text in dump_schema(db_url).items()}
    texts |= {"relay log": log.read_text(), "model requests": requests}
    texts |= {"runs show": printed[0], "journal tail": printed[1]}
    assert "retry_scheduled" in texts["relay log"]  # the log is there, at DEBUG
    for needle in (canary, canary[:16]):
        assert [where for where, text in texts.items() if needle in text] == []


def test_cli_manages_credentials(db_url, key, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def outbox(*args: str, stdin: str | None = None, code: int = 0) -> str:
        done = runner.invoke(cli.main, list(args), input=stdin)
        assert done.exit_code == code, done.output
        return done.output

    assert len(outbox("credentials", "new-key").strip()) == 44
    assert "set (db)" in outbox("credentials", "set", "crm", "--value-stdin", stdin="s3cret\n")
    assert "rotated to version 2 (env)" in outbox("credentials", "set", "crm", "--env", "CRM")
    assert "exactly one of" in outbox("credentials", "set", "x", code=2)
    listed = outbox("credentials", "list", "--json")
    assert '"reference": "CRM"' in listed and "s3cret" not in listed and "gAAAA" not in listed
    assert "revoked credential crm" in outbox("credentials", "revoke", "crm", "--actor", "sec")
    assert "has no credential" in outbox("credentials", "revoke", "nope", code=2)
