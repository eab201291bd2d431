"""A call whose run is over is never started again nor parked for an operator, whichever
write of the relay meets it: the claim (``test_deadlines.py``), a retry (``retry_later_many``),
a park (``quarantine``) or the rescue of an expired lease (``rescue_expired``). Its queue
row leaves, its call keeps the attempts made and says why (so its tool message says
"outcome unknown", never "not executed"), and the drop is journaled with what it was
instead of.

The relay's own statements (``relay/queries/relay.sql``) run here on a call leased as the
claim leaves it, after its run was cancelled with the call in flight.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from outbox import history, lifecycle, registry, writer
from outbox.sql import Queries
from tests.helpers import TENANT, new_run, turn
from tests.relay_harness import REPO

Q = Queries(REPO / "relay" / "queries" / "relay.sql", "outbox")
WORKER = "relay:1:test"
RESCUER = "relay:2:test"
ERROR = "HTTP 500 from keyed"
# What each write is given, and what it leaves of a call whose run is over: the call's
# last error, the journal's event and its detail.
RETRY = {"attempts": [1], "errors": [ERROR], "delays": [1.0], "charges": [1]} | {
    "deadlines": [None],
    "unsent": [False],
    "answered": [True],
    "tool_call_ids": ["k1"],
    "details": [Jsonb({"error": ERROR, "delay_s": 1.0})],
}
WRITES: dict[str, tuple[dict[str, Any], str, str, dict[str, Any]]] = {
    "retry_later_many": (
        {"worker": WORKER, **RETRY},
        f"its run is over: not retried; {ERROR}",
        "tool_call.dropped",
        {"reason": "run_over", "instead_of": "retry_later", "error": ERROR, "worker": WORKER},
    ),
    "quarantine": (
        {"worker": WORKER, "attempt": 1, "error": ERROR},
        f"its run is over: not parked for an operator; {ERROR}",
        "tool_call.dropped",
        {"reason": "run_over", "instead_of": "quarantine", "error": ERROR, "worker": WORKER},
    ),
    "rescue_expired": (
        {"limit": 10, "max_lost_leases": 3, "worker": RESCUER},
        f"lease of {WORKER} expired during attempt 1 after its run was over: not started "
        "again, its outcome is unknown",
        "lease.expired.dropped",
        {"previous_owner": WORKER, "kind": "tool_call", "reason": "run_over", "worker": RESCUER},
    ),
}


def a_leased_call(conn: psycopg.Connection[Any], *, lease: str) -> tuple[writer.RunRef, int]:
    """A run whose call ``WORKER`` leased (attempt 1, its lease ending ``lease`` from now),
    as the claim leaves it; the run and the call's queue row."""
    spec = registry.ToolSpec(
        name="keyed", executor="http", endpoint="http://127.0.0.1:9/", idempotency_mode="key"
    )
    registry.register(conn, spec)
    run = new_run(conn, tools=["keyed"])
    writer.record_model_turn(conn, turn(run, 1, ("k1", "keyed", {"order_id": "42"})))
    row = conn.execute(
        "UPDATE outbox.outbox SET status = 'leased', lease_owner = %s, attempts = 1,"
        " lease_expires_at = now() + %s::interval, claimed_at = now()"
        " WHERE kind = 'tool_call' RETURNING id",
        [WORKER, lease],
    ).fetchone()
    conn.execute("UPDATE outbox.tool_calls SET status = 'running', attempts = 1")
    assert row is not None
    return run, int(row[0])


def journaled(conn: psycopg.Connection[Any], event: str) -> list[Any]:
    rows = conn.execute(
        "SELECT attempt, worker, detail FROM outbox.journal WHERE event = %s", [event]
    ).fetchall()
    return [(attempt, detail | {"worker": worker}) for attempt, worker, detail in rows]


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_that_meets_a_call_whose_run_is_over_drops_it(db_url, write):
    params, note, event, detail = WRITES[write]
    with psycopg.connect(db_url) as conn:
        run, ident = a_leased_call(conn, lease="-1 second")  # run out: the rescue takes it
        lifecycle.cancel_run(conn, run.id, TENANT, actor="test")  # the call in flight
        conn.commit()
        returned = conn.execute(getattr(Q, write), params | _ident(write, ident)).fetchall()
        # Nothing for the worker to report as written; the rescue names the row it dropped.
        assert returned == (
            [(ident, "tool_call", "dropped", WORKER)] if write == "rescue_expired" else []
        )
        assert conn.execute(
            "SELECT count(*) FROM outbox.outbox WHERE id = %s", [ident]
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT status, attempts, last_error FROM outbox.tool_calls"
        ).fetchone() == (
            "cancelled",
            1,
            note,
        )
        assert journaled(conn, event) == [(1, detail)]
        messages, _ = history.replay(conn, run.thread_id, TENANT, api="chat")
        [tool] = [m for m in messages if m["role"] == "tool"]
        assert json.loads(tool["content"])["error"].startswith("outcome unknown: ")


def _ident(write: str, ident: int) -> dict[str, Any]:
    return {"ids": [ident]} if write == "retry_later_many" else {"id": ident}


@pytest.mark.parametrize("write", ["retry_later_many", "quarantine"])
def test_the_same_write_on_a_live_run_retries_or_parks_the_call_as_ever(db_url, write):
    params = WRITES[write][0]
    with psycopg.connect(db_url) as conn:
        _, ident = a_leased_call(conn, lease="1 minute")
        returned = conn.execute(getattr(Q, write), params | _ident(write, ident)).fetchall()
        assert returned == [(ident,)]
        status = conn.execute("SELECT status FROM outbox.outbox WHERE id = %s", [ident]).fetchone()
        assert status == ("ready" if write == "retry_later_many" else "quarantined",)
        assert journaled(conn, "tool_call.dropped") == []
