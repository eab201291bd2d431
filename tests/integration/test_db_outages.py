"""A database that goes away is the relay's problem, never the work's.

Every relay connection is killed with ``pg_terminate_backend`` while the relay is idle,
while runs arrive one by one, and while model turns and tool calls are in flight: every
run completes, no attempt is charged (no retry scheduled, nothing quarantined, ``failures``
stays 0), and no effect happens twice. A relay the server cannot serve refuses to start
with the numbers; a model's ``Retry-After`` is honoured.

A relay that cannot start says why with an exit status that means it: 2 only for what was
typed wrong, 75 (try later) for a database that did not answer within --start-timeout, 78
for a configuration the database refuses (tests/acceptance/test_db_restart.py shows that
without --start-timeout it waits for the database instead).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import db, writer
from outbox.commands.common import EXIT_CONFIG, EXIT_TEMPFAIL
from outbox.commands.relay import RELAY_DEFAULTS
from outbox.relay.links import CONFLICT_RETRY_S, Link
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import (
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
SCRIPT = [{"tool_calls": [{"name": "send_email", "arguments": {"to": "a@b.c"}}]}, {"text": "ok"}]


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(scripts={"mail": SCRIPT}) as server:
        yield server


@pytest.fixture
def service(db_url: str) -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        svc.add_tool("send_email", "key")
        with psycopg.connect(db_url) as conn:
            register_tool(conn, svc, "send_email", "key", timeout_s=10)
            conn.commit()
        yield svc


def start_run(db_url: str, model: ScriptedModel) -> uuid.UUID:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted-1",
                message="script:mail please",
                tools=["send_email"],
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
    return run.id


RELAY_BACKENDS = (
    "FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'outbox-relay-%'"
)


def relay_connections(db_url: str) -> int:
    return int(scalar(db_url, "SELECT count(*) " + RELAY_BACKENDS))


def kill_relay_connections(db_url: str) -> int:
    """Terminate every connection of the relay to this database; how many there were."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) " + RELAY_BACKENDS).fetchall()
    return len(rows)


def completed(db_url: str, runs: list[uuid.UUID]) -> bool:
    done = scalar(
        db_url,
        "SELECT count(*) FROM outbox.runs WHERE id = ANY(%s) AND status = 'completed'",
        [runs],
    )
    return bool(done == len(runs))


def assert_nothing_charged(db_url: str, service: FakeToolService, runs: int) -> None:
    charged = scalar(
        db_url,
        "SELECT count(*) FROM outbox.journal WHERE event LIKE '%%.retry_scheduled' "
        "OR event LIKE '%%quarantined' OR event LIKE '%%outcome_unknown'",
    )
    assert charged == 0
    assert scalar(db_url, "SELECT coalesce(max(failures), 0) FROM outbox.outbox") == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'") == 0
    tool = service.tool("send_email")
    assert len(tool.effects) == runs and tool.duplicate_effects() == 0


def test_killed_connections_while_idle_and_runs_arrive_one_by_one(db_url, model, service):
    runs: list[uuid.UUID] = []
    with relay_thread(db_url, kinds=ALL_KINDS, lease_s=5.0):
        for _ in range(3):  # idle at first, then after each run
            # An idle relay holds its claim and listener links (the others open on use).
            wait_until(lambda: relay_connections(db_url) >= 2, what="the relay's links")
            assert kill_relay_connections(db_url) >= 2
            runs.append(start_run(db_url, model))
            wait_until(lambda: completed(db_url, runs), what="the run that arrived alone")
    assert_nothing_charged(db_url, service, len(runs))


def test_killed_connections_while_model_turns_and_tool_calls_are_in_flight(db_url, model, service):
    model.set_faults(latency_s=0.5)
    service.tool("send_email").stall_after_commit(0.5, n=None)
    with relay_thread(db_url, kinds=ALL_KINDS, lease_s=5.0):
        runs = [start_run(db_url, model) for _ in range(10)]
        wait_until(lambda: len(model.requests) >= 5, what="model turns in flight")
        assert kill_relay_connections(db_url) >= 3  # claim, listener, preparer at least
        wait_until(lambda: len(service.tool("send_email").deliveries) >= 5, what="tool calls")
        assert kill_relay_connections(db_url) >= 3
        wait_until(lambda: completed(db_url, runs), what="every run", timeout_s=60)
    assert_nothing_charged(db_url, service, len(runs))


def test_a_model_retry_after_delays_the_turn_as_asked(db_url, model, service):
    model.fail_next(1, status=429, retry_after_s=30)
    with relay_thread(db_url, kinds=ALL_KINDS, lease_s=5.0):
        run = start_run(db_url, model)
        wait_until(
            lambda: scalar(
                db_url,
                "SELECT count(*) FROM outbox.journal WHERE event = 'model_turn.retry_scheduled'",
            ),
            what="the 429 to be recorded",
        )
    delay = scalar(
        db_url,
        "SELECT extract(epoch FROM available_at - now()) FROM outbox.outbox "
        "WHERE run_id = %s AND kind = 'model_turn'",
        [run],
    )
    assert 20 < delay <= 30  # not the relay's backoff (50 ms here): what the model asked


def test_a_relay_the_server_cannot_serve_refuses_to_start(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    with psycopg.connect(db_url) as conn:
        max_connections = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
    per_process = RELAY_DEFAULTS.db_connections
    processes = max_connections // per_process + 1
    result = CliRunner().invoke(cli.main, ["relay", "--processes", str(processes)])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert f"needs {processes * per_process} database connections" in result.output
    assert f"max_connections {max_connections}" in result.output
    assert "hint:" in result.output


def test_too_few_connections_for_one_process_is_a_usage_error(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    result = CliRunner().invoke(cli.main, ["relay", "--db-connections", "4"])
    assert result.exit_code == 2
    assert "--db-connections 4 is too few" in result.output


def relay_exit(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, ["relay", *args], env={"OUTBOX_DATABASE_URL": url})
    return result.exit_code, result.output


def test_a_database_that_does_not_answer_in_the_start_timeout_is_exit_75(tmp_path):
    nothing_listens = f"postgresql://postgres@/outbox?host={tmp_path}"
    status, output = relay_exit(nothing_listens, "--start-timeout", "0.5")
    assert status == EXIT_TEMPFAIL == 75, output
    assert "error: the database did not answer within 0.5 s" in output
    assert "hint: is the server running?" in output


def test_a_configuration_the_database_refuses_is_exit_78(empty_db_url, server_url):
    behind, output = relay_exit(empty_db_url)
    assert behind == EXIT_CONFIG == 78, output
    assert "schema 'outbox' is at revision none" in output
    assert "hint: run `outbox db upgrade`" in output
    missing = db.with_database(server_url, f"nothing_{uuid.uuid4().hex[:8]}")
    no_database, output = relay_exit(missing, "--start-timeout", "30")
    assert no_database == 78 and "does not exist" in output, output
    not_a_url, output = relay_exit("not-a-url")
    assert not_a_url == 78 and "OUTBOX_DATABASE_URL is not a database URL" in output


def test_a_relay_waiting_for_the_database_stops_at_sigterm_with_status_0(tmp_path):
    log = tmp_path / "relay.log"
    relay = start_relay_process(f"postgresql://postgres@/outbox?host={tmp_path}", log)
    try:
        wait_until(
            lambda: "db.unavailable" in log.read_text() or relay.poll() is not None,
            what="the relay to wait for the database",
        )
        assert relay.poll() is None, log.read_text()
    finally:
        relay.terminate()
        status = relay.wait(timeout=30)
    assert status == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_a_deadlock_is_retried_on_the_same_connection_and_is_no_outage(db_url, caplog):
    """A transaction the server ended for a deadlock: the link keeps its connection, says
    ``db.conflict`` (not ``db.unavailable``), marks no outage and pauses only briefly."""
    outages: list[bool] = []
    link = Link(db_url, "test", prepare=False, on_outage=lambda _, waiting: outages.append(waiting))
    victim = link.get()
    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE pair (id int PRIMARY KEY); INSERT INTO pair VALUES (1), (2)")
    victim.execute("SET deadlock_timeout = '10ms'")  # it finds the cycle, so it is rolled back
    victim.commit()
    with psycopg.connect(db_url) as other, psycopg.connect(db_url, autocommit=True) as watch:
        other.execute("SET deadlock_timeout = '10s'")
        other.commit()
        victim.execute("UPDATE pair SET id = id WHERE id = 1")
        other.execute("UPDATE pair SET id = id WHERE id = 2")
        blocked = threading.Thread(
            target=other.execute, args=("UPDATE pair SET id = id WHERE id = 1",)
        )
        blocked.start()
        deadline = time.monotonic() + 10
        waiting = "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted"
        while watch.execute(waiting, (other.info.backend_pid,)).fetchone() != (1,):
            assert time.monotonic() < deadline, "the other transaction never waited on the lock"
            time.sleep(0.01)
        with caplog.at_level(logging.INFO, logger="relay.links"):
            with pytest.raises(psycopg.errors.DeadlockDetected) as deadlock:
                victim.execute("UPDATE pair SET id = id WHERE id = 2")
            pause = link.failed(deadlock.value)
        blocked.join(timeout=10)
        other.commit()
    assert link.conn is victim and not victim.closed and link.get() is victim
    assert victim.execute("SELECT count(*) FROM pair").fetchone() == (2,)  # rolled back, usable
    assert outages == [] and link.failures == 0
    assert 0.0 <= pause <= CONFLICT_RETRY_S
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "db.conflict" in said and "db.unavailable" not in said
