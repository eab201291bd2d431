"""A call whose run is over is never started again nor parked for an operator, whichever
write of the relay meets it: the claim (``test_deadlines.py``), a retry (``retry_later``),
a park (``quarantine``) or the rescue of an expired lease (``rescue_expired``). Its queue
row leaves, its call keeps the attempts made and says why (so its tool message says
"outcome unknown", never "not executed"), and the drop is journaled with what it was
instead of.

The relay's own statements (``relay/queries/relay.sql``) run here on a call leased as the
claim leaves it, after its run was cancelled with the call in flight.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import history, lifecycle, registry, writer
from outbox.sql import Queries
from tests.helpers import TENANT, new_run, turn
from tests.relay_harness import REPO

Q = Queries(REPO / "relay" / "queries" / "relay.sql", "outbox")
WORKER = "relay:1:test"
ERROR = "HTTP 500 from keyed"
CALL_ROW = "SELECT id FROM outbox.outbox WHERE kind = 'tool_call'"


@pytest.fixture
def in_flight(db_url: str) -> Iterator[tuple[psycopg.Connection[Any], Any]]:
    """A call leased by ``WORKER`` (attempt 1, its lease run out) whose run was then
    cancelled; a connection and the run."""
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(
            name="keyed", executor="http", endpoint="http://127.0.0.1:9/", idempotency_mode="key"
        )
        registry.register(conn, spec)
        run = new_run(conn, tools=["keyed"])
        writer.record_model_turn(conn, turn(run, 1, ("k1", "keyed", {"order_id": "42"})))
        conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', lease_owner = %s, attempts = 1,"
            " lease_expires_at = now() - interval '1 second', claimed_at = now()"
            " WHERE kind = 'tool_call'",
            [WORKER],
        )
        conn.execute("UPDATE outbox.tool_calls SET status = 'running', attempts = 1")
        lifecycle.cancel_run(conn, run.id, TENANT, actor="test")
        conn.commit()
    with psycopg.connect(db_url) as conn:
        yield conn, run


def queued(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'").fetchone()[0]  # type: ignore[index]


def dropped(conn: psycopg.Connection[Any], event: str) -> list[Any]:
    return conn.execute(
        "SELECT attempt, worker, detail FROM outbox.journal WHERE event = %s", [event]
    ).fetchall()


def the_call(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute("SELECT status, attempts, last_error FROM outbox.tool_calls").fetchone()
    assert row is not None
    return tuple(row)


def told_the_model(conn: psycopg.Connection[Any], run: Any) -> str:
    messages, _ = history.replay(conn, run.thread_id, TENANT, api="chat")
    [tool] = [m for m in messages if m["role"] == "tool"]
    return str(json.loads(tool["content"])["error"])


def test_a_retry_of_a_call_whose_run_is_over_drops_it(in_flight):
    conn, run = in_flight
    params = {"id": None, "worker": WORKER, "attempt": 1, "error": ERROR, "delay_s": 1.0}
    params |= {"charge": 1, "deadline_in_s": None}
    params["id"] = conn.execute(CALL_ROW).fetchone()[0]  # type: ignore[index]
    assert conn.execute(Q.retry_later, params).fetchall() == []  # the worker: not written
    assert queued(conn) == 0
    assert the_call(conn) == ("cancelled", 1, f"its run is over: not retried; {ERROR}")
    detail = {"reason": "run_over", "instead_of": "retry_later", "error": ERROR}
    assert dropped(conn, "tool_call.dropped") == [(1, WORKER, detail)]
    assert told_the_model(conn, run).startswith("outcome unknown: ")


def test_a_park_of_a_call_whose_run_is_over_drops_it(in_flight):
    conn, run = in_flight
    ident = conn.execute(CALL_ROW).fetchone()[0]  # type: ignore[index]
    params = {"id": ident, "worker": WORKER, "attempt": 1, "error": ERROR}
    assert conn.execute(Q.quarantine, params).fetchall() == []
    assert queued(conn) == 0
    note = f"its run is over: not parked for an operator; {ERROR}"
    assert the_call(conn) == ("cancelled", 1, note)
    detail = {"reason": "run_over", "instead_of": "quarantine", "error": ERROR}
    assert dropped(conn, "tool_call.dropped") == [(1, WORKER, detail)]
    assert told_the_model(conn, run).startswith("outcome unknown: ")


def test_the_rescue_of_an_expired_lease_of_a_call_whose_run_is_over_drops_it(in_flight):
    conn, run = in_flight
    ident = conn.execute(CALL_ROW).fetchone()[0]  # type: ignore[index]
    params = {"limit": 10, "max_lost_leases": 3, "worker": "relay:2:test"}
    assert conn.execute(Q.rescue_expired, params).fetchall() == [
        (ident, "tool_call", "dropped", WORKER)
    ]
    assert queued(conn) == 0
    note = (
        f"lease of {WORKER} expired during attempt 1 after its run was over: not started "
        "again, its outcome is unknown"
    )
    assert the_call(conn) == ("cancelled", 1, note)
    detail = {"previous_owner": WORKER, "kind": "tool_call", "reason": "run_over"}
    assert dropped(conn, "lease.expired.dropped") == [(1, "relay:2:test", detail)]
    assert told_the_model(conn, run).startswith("outcome unknown: ")


@pytest.mark.parametrize("write", ["retry_later", "quarantine"])
def test_a_call_whose_run_is_not_over_is_retried_or_parked_as_ever(db_url, write):
    """The other side of the judgment: the same writes on a live run keep the row."""
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(
            name="keyed", executor="http", endpoint="http://127.0.0.1:9/", idempotency_mode="key"
        )
        registry.register(conn, spec)
        run = new_run(conn, tools=["keyed"])
        writer.record_model_turn(conn, turn(run, 1, ("k1", "keyed", {"order_id": "42"})))
        ident = conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', lease_owner = %s, attempts = 1,"
            " lease_expires_at = now() + interval '1 minute', claimed_at = now()"
            " WHERE kind = 'tool_call' RETURNING id",
            [WORKER],
        ).fetchone()[0]  # type: ignore[index]
        params = {"id": ident, "worker": WORKER, "attempt": 1, "error": ERROR, "delay_s": 1.0}
        params |= {"charge": 1, "deadline_in_s": None}
        assert conn.execute(getattr(Q, write), params).fetchall() == [(ident,)]
        status = conn.execute("SELECT status FROM outbox.outbox WHERE id = %s", [ident]).fetchone()
        assert status == ("ready" if write == "retry_later" else "quarantined",)
        assert dropped(conn, "tool_call.dropped") == []
