"""NOTIFY outbox_runs: every change of a run's status reaches a listener after its
transaction commits, in order, and nothing of a transaction rolled back; a client tool's
``requires_action`` and the outputs that move the run on are told too."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import lifecycle, registry, writer
from outbox.schemas import StartRun
from outbox.statements import journal
from outbox.testing.scripted_model import ScriptedModel
from tests.relay_harness import TENANT, relay_thread

ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
WAIT_S = 30.0  # the most a test waits for one notification


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script(
            "approve",
            [{"tool_calls": [{"name": "approve", "arguments": {}}]}, {"text": "approved"}],
        )
        yield server


@pytest.fixture
def listener(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"}),
        )
        conn.commit()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("LISTEN outbox_runs")
        yield conn


def start(conn: psycopg.Connection[Any], model: ScriptedModel, script: str) -> writer.RunRef:
    thread = writer.create_thread(conn, TENANT).id
    return writer.start_run(
        conn,
        StartRun(
            tenant_id=TENANT,
            thread_id=thread,
            model="scripted-1",
            message=f"script:{script} please",
            tools=["approve"],
            base_url=model.url + "/v1",
        ),
    )


def told(listener: psycopg.Connection[Any], run_id: uuid.UUID, until: str) -> list[dict[str, Any]]:
    """This run's notifications, in order, up to the one with status ``until``."""
    seen = []
    for note in listener.notifies(timeout=WAIT_S):
        payload = json.loads(note.payload)
        if payload["run_id"] == str(run_id):
            seen.append(payload)
            if payload["status"] == until:
                return seen
    raise AssertionError(f"no {until!r} for run {run_id} within {WAIT_S}s; saw {seen}")


def test_a_runs_status_changes_are_told_in_order_after_commit(db_url, model, listener):
    with psycopg.connect(db_url) as conn:
        rolled_back = start(conn, model, "approve")
        conn.rollback()
        run = start(conn, model, "approve")
        conn.commit()
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = told(listener, run.id, "requires_action")
        assert waiting[0] == {
            "schema": "outbox",
            "tenant_id": TENANT,
            "thread_id": str(run.thread_id),
            "run_id": str(run.id),
            "status": "queued",
            "previous_status": None,
        }
        with psycopg.connect(db_url) as conn:
            (call,) = conn.execute(
                "SELECT tool_call_id FROM outbox.tool_calls WHERE run_id = %s", [run.id]
            ).fetchall()
            outputs = [{"tool_call_id": call[0], "output": "yes"}]
            lifecycle.submit_tool_outputs(conn, TENANT, run.id, outputs)
            conn.commit()
        done = told(listener, run.id, "completed")
    chain = waiting + done
    for before, after in itertools.pairwise(chain):
        assert after["previous_status"] == before["status"], chain
    assert "in_progress" in [n["status"] for n in done]
    leftovers = list(listener.notifies(timeout=0.5))
    assert all(json.loads(n.payload)["run_id"] != str(rolled_back.id) for n in leftovers)
    assert all(n["run_id"] != str(rolled_back.id) for n in chain)


def test_run_notify_off_tells_nothing(db_url, model, listener):
    with psycopg.connect(db_url) as conn:
        conn.execute("SET outbox.run_notify = 'off'")
        quiet = start(conn, model, "hello")
        conn.commit()
        conn.execute("RESET outbox.run_notify")
        loud = start(conn, model, "hello")
        conn.commit()
    assert told(listener, loud.id, "queued")[0]["status"] == "queued"
    assert all(
        json.loads(n.payload)["run_id"] != str(quiet.id) for n in listener.notifies(timeout=0.5)
    )


def test_a_runs_journal_events_are_told_once_a_transaction_after_commit(db_url, model, listener):
    """NOTIFY outbox_journal: a transaction that journals events of a run tells it once,
    when it commits; nothing for one rolled back, for an event of no run, or under
    ``outbox.run_notify = 'off'``."""
    with psycopg.connect(db_url) as conn:
        run, other = start(conn, model, "approve"), start(conn, model, "approve")
        conn.commit()
        listener.execute("LISTEN outbox_journal")  # from here on: not the starts' own
        for n in range(3):
            journal(conn, f"test.step_{n}", TENANT, run_id=run.id)
        journal(conn, "test.of_no_run", TENANT)
        conn.commit()
        journal(conn, "test.rolled_back", TENANT, run_id=run.id)
        conn.rollback()
        conn.execute("SET outbox.run_notify = 'off'")
        journal(conn, "test.unnoticed", TENANT, run_id=run.id)
        conn.commit()
        conn.execute("SET outbox.run_notify = 'on'")
        journal(conn, "test.last", TENANT, run_id=other.id)
        conn.commit()
    seen = []
    for note in listener.notifies(timeout=WAIT_S):
        if note.channel == "outbox_journal":
            seen.append(json.loads(note.payload))
        if len(seen) == 2:
            break
    told = [{"schema": "outbox", "tenant_id": TENANT, "run_id": str(r.id)} for r in (run, other)]
    assert seen == told  # the three of one transaction, then the other run's, nothing between
