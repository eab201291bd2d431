"""The DBA views (sql/views.sql) on a seeded scenario: a duplicate, an orphan, stuck runs."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outbox import writer
from outbox.schemas import ToolResultIn
from tests.helpers import TENANT, add_tool, new_run, turn

ARGS = {"order_id": "42"}


def result(conn, ref: int, status: str = "ok", source: str = "relay") -> writer.ResultRecord:
    return writer.record_tool_result(
        conn,
        ToolResultIn(
            tenant_id=TENANT,
            tool_call_ref=ref,
            status=status,
            output={"ticket": ref} if status == "ok" else None,
            error="boom" if status == "error" else None,
            source=source,
            attempt=1,
        ),
    )


def rows(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


@pytest.fixture
def scenario(conn) -> dict[str, Any]:
    add_tool(conn, "create_ticket")
    add_tool(conn, "approve", executor="client", endpoint=None)
    made: dict[str, Any] = {}

    # The same ticket created by two runs (a double-submitted turn): a duplicate by
    # fingerprint. The first call also ran twice under its key (a late second attempt kept
    # in orphaned_results): a duplicate by idempotency key.
    refs = []
    for n in (1, 2):
        run = new_run(conn, tools=["create_ticket"])
        rec = writer.record_model_turn(conn, turn(run, 1, (f"dup_{n}", "create_ticket", ARGS)))
        result(conn, rec.tool_call_refs[0])
        refs.append(rec.tool_call_refs[0])
        made[f"dup_run_{n}"] = run.id
    made["dup_refs"] = refs
    conn.execute(
        "INSERT INTO outbox.orphaned_results (tenant_id, run_id, tool_call_ref, tool_call_id, "
        "status, reason, source, attempt) "
        "SELECT tenant_id, run_id, id, tool_call_id, 'ok', 'fenced', 'relay', 2 "
        "FROM outbox.tool_calls WHERE id = %s",
        [refs[0]],
    )

    # An orphan: a result that arrives after the run was cancelled and its batch closed.
    run = new_run(conn, tools=["create_ticket"])
    rec = writer.record_model_turn(
        conn, turn(run, 1, ("late", "create_ticket", {"order_id": "late"}))
    )
    conn.execute("UPDATE outbox.tool_batches SET status = 'cancelled' WHERE run_id = %s", [run.id])
    conn.execute(
        "UPDATE outbox.runs SET status = 'cancelled', ended_at = now() WHERE id = %s", [run.id]
    )
    assert result(conn, rec.tool_call_refs[0], status="error").outcome == "orphaned"
    made["orphan_run"] = run.id
    made["orphan_ref"] = rec.tool_call_refs[0]

    # Stuck: a client tool's result completed the batch, but its delivery row was lost.
    run = new_run(conn, tools=["approve"])
    rec = writer.record_model_turn(conn, turn(run, 1, ("approval", "approve", ARGS)))
    assert result(conn, rec.tool_call_refs[0], source="client").batch_complete
    conn.execute("DELETE FROM outbox.outbox WHERE batch_id = %s", [rec.batch_id])
    conn.execute(
        "UPDATE outbox.tool_batches SET completed_at = now() - interval '2 minutes' WHERE id = %s",
        [rec.batch_id],
    )
    made["stuck_run"] = run.id
    made["stuck_batch"] = rec.batch_id

    # Stuck: a worker died holding a lease; and a run waiting for client outputs too long.
    run = new_run(conn)
    conn.execute(
        "UPDATE outbox.outbox SET status = 'leased', lease_owner = 'w-dead', attempts = 1, "
        "claimed_at = now() - interval '10 minutes', "
        "lease_expires_at = now() - interval '5 minutes' WHERE run_id = %s",
        [run.id],
    )
    made["leased_run"] = run.id
    run = new_run(conn, tools=["approve"])
    writer.record_model_turn(conn, turn(run, 1, ("wait", "approve", ARGS)))
    conn.execute(
        "UPDATE outbox.runs SET action_deadline = now() - interval '1 minute' WHERE id = %s",
        [run.id],
    )
    made["late_run"] = run.id
    # One model turn is 90 s overdue.
    conn.execute(
        "UPDATE outbox.outbox SET available_at = now() - interval '90 seconds' "
        "WHERE run_id = %s AND kind = 'model_turn'",
        [made["dup_run_1"]],
    )
    return made


def test_duplicate_executions(conn, scenario):
    found = rows(
        conn,
        "SELECT kind, tool_name, executions, tool_call_refs, idempotency_key IS NOT NULL "
        "FROM outbox.duplicate_executions ORDER BY kind",
    )
    first, second = scenario["dup_refs"]
    assert found == [
        ("fingerprint", "create_ticket", 3, [first, second], False),
        ("idempotency_key", "create_ticket", 2, [first], True),
    ]


def test_orphaned_results_report(conn, scenario):
    found = rows(
        conn,
        "SELECT run_id, run_status, batch_status, tool_call_ref, tool_name, reason, status "
        "FROM outbox.orphaned_results_report WHERE reason = 'batch_closed'",
    )
    assert found == [
        (
            scenario["orphan_run"],
            "cancelled",
            "cancelled",
            scenario["orphan_ref"],
            "create_ticket",
            "batch_closed",
            "error",
        )
    ]


def test_stuck_runs(conn, scenario):
    found = rows(
        conn,
        "SELECT reason, run_id, status, batch_id, stuck_for > interval '0' "
        "FROM outbox.stuck_runs ORDER BY reason",
    )
    assert found == [
        ("lease_expired", scenario["leased_run"], "queued", None, True),
        ("past_deadline", scenario["late_run"], "requires_action", None, True),
        (
            "undelivered_batch",
            scenario["stuck_run"],
            "requires_action",
            scenario["stuck_batch"],
            True,
        ),
    ]


def test_run_timeline(conn, scenario):
    found = rows(
        conn,
        "SELECT seq, event, tool_call_id FROM outbox.run_timeline WHERE run_id = %s ORDER BY seq",
        [scenario["dup_run_1"]],
    )
    assert found == [
        (1, "run.created", None),
        (2, "model_turn.recorded", None),
        (3, "tool_call.intended", "dup_1"),
        (4, "tool_result.stored", "dup_1"),
        (5, "batch.complete", "dup_1"),
    ]


def test_tool_stats(conn, scenario):
    found = rows(
        conn,
        "SELECT tool_name, calls, finished, ok, errors, error_rate, p50_s >= 0 "
        "FROM outbox.tool_stats ORDER BY tool_name",
    )
    from decimal import Decimal

    # the orphaned error never became the call's result: 3 calls, 2 finished, both ok
    assert found == [
        ("approve", 2, 1, 1, 0, Decimal("0.0000"), True),
        ("create_ticket", 3, 2, 2, 0, Decimal("0.0000"), True),
    ]


def test_tool_stats_error_rate(conn):
    add_tool(conn, "flaky")
    for n in range(4):
        run = new_run(conn, tools=["flaky"])
        rec = writer.record_model_turn(conn, turn(run, 1, (f"f{n}", "flaky", ARGS)))
        result(conn, rec.tool_call_refs[0], status="error" if n == 0 else "ok")
    found = rows(conn, "SELECT errors, error_rate::float FROM outbox.tool_stats")
    assert found == [(1, 0.25)]


def test_queue_lag(conn, scenario):
    found = rows(
        conn,
        "SELECT kind, sum(due)::int, sum(in_flight)::int, sum(expired_leases)::int, "
        "max(lag_s) >= 90 FROM outbox.queue_lag GROUP BY kind ORDER BY kind",
    )
    # Nobody ran the relay: 6 first model turns (one leased by the dead worker), the three
    # http tool calls still queued, and the deliveries of the two duplicate runs' batches.
    assert found == [
        ("deliver_batch", 2, 0, 0, False),
        ("model_turn", 5, 1, 1, True),
        ("tool_call", 3, 0, 0, False),
    ]
