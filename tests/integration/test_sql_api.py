"""The SQL API (sql/runs.sql, results.sql, approvals.sql) as a backend without Python calls it.

Every call runs as ``outbox_writer`` (``SET LOCAL ROLE`` from the owner's connection, the
rights a backend logged in as a member of that role has), with plain SQL only: no writer
API, no knowledge of dedup keys or payload shapes. The relay then finds the work the
functions queued. CI runs this file on the embedded PostgreSQL 18 and the machine's 15.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from outbox import writer
from tests.helpers import add_tool, turn

A, B = "tenant-a", "tenant-b"


def as_writer(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET LOCAL ROLE outbox_writer")


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def refused(conn: psycopg.Connection[Any], sqlstate: str, query: str, params: Any) -> Any:
    """Run ``query`` and expect the function to refuse with ``sqlstate``; roll back."""
    with pytest.raises(psycopg.Error) as err:
        conn.execute(query, params)
    conn.rollback()
    assert err.value.sqlstate == sqlstate, err.value
    return err.value


def start(conn: psycopg.Connection[Any], tenant: str, thread: uuid.UUID, **kw: Any) -> Any:
    names = ", ".join(f"p_{k} => %({k})s" for k in kw)
    query = f"SELECT * FROM outbox.start_run_v1(%(t)s, %(th)s, 'gpt-5'{', ' if kw else ''}{names})"
    return conn.execute(query, {"t": tenant, "th": thread, **kw}).fetchone()


def new_thread(conn: psycopg.Connection[Any], tenant: str = A) -> uuid.UUID:
    as_writer(conn)
    thread = scalar(conn, "SELECT outbox.create_thread_v1(%s)", [tenant])
    conn.commit()
    return thread


def test_a_backend_starts_a_run_with_plain_sql_as_outbox_writer(conn):
    add_tool(conn)
    conn.commit()
    as_writer(conn)
    thread = scalar(
        conn,
        "SELECT outbox.create_thread_v1(%s, p_title => 'refunds', p_messages => %s)",
        [A, json.dumps([{"role": "system", "content": "You are the refunds desk."}])],
    )
    run_id, status, created, correlation = start(
        conn, A, thread, message="Refund order 42", tools=["lookup_order"], idempotency_key="r-1"
    )
    conn.commit()
    assert (status, created) == ("queued", True) and correlation

    # what the relay needs is there, written by the function, not by the caller
    messages = conn.execute(
        "SELECT seq, role, content FROM outbox.messages WHERE thread_id = %s ORDER BY seq",
        [thread],
    ).fetchall()
    assert messages == [
        (1, "system", "You are the refunds desk."),
        (2, "user", "Refund order 42"),
    ]
    queued = conn.execute(
        "SELECT kind, dedup_key, payload, correlation_id FROM outbox.outbox WHERE run_id = %s",
        [run_id],
    ).fetchall()
    assert queued == [("model_turn", f"model_turn:{run_id}:1", {"step_no": 1}, correlation)]
    events = conn.execute(
        "SELECT event, tenant_id FROM outbox.journal WHERE thread_id = %s ORDER BY id", [thread]
    ).fetchall()
    assert events == [("thread.created", A), ("run.created", A)]
    # and the run goes on like any other: the model turn the relay would record
    run = writer.RunRef(run_id, thread, A, status, correlation, True, {})
    record = writer.record_model_turn(
        conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "42"}))
    )
    assert record.run_status == "in_progress" and len(record.tool_call_refs) == 1


def test_the_same_idempotency_key_returns_the_run_and_another_thread_is_refused(conn):
    thread = new_thread(conn)
    as_writer(conn)
    first = start(conn, A, thread, idempotency_key="k")
    again = start(conn, A, thread, idempotency_key="k")
    conn.commit()
    assert again[0] == first[0] and (first[2], again[2]) == (True, False)
    other = new_thread(conn)
    as_writer(conn)
    err = refused(
        conn,
        "OB002",
        "SELECT * FROM outbox.start_run_v1(%s, %s, 'm', p_idempotency_key => 'k')",
        [A, other],
    )
    assert "already started run" in err.diag.message_primary
    assert scalar(conn, "SELECT count(*) FROM outbox.runs") == 1


def test_a_second_turn_on_a_busy_thread_names_the_active_run(conn):
    thread = new_thread(conn)
    as_writer(conn)
    (run_id, *_) = start(conn, A, thread)
    conn.commit()
    as_writer(conn)
    err = refused(conn, "OB001", "SELECT * FROM outbox.start_run_v1(%s, %s, 'm')", [A, thread])
    assert json.loads(err.diag.message_detail) == {
        "thread_id": str(thread),
        "run_id": str(run_id),
        "status": "queued",
    }
    assert err.diag.message_hint


def test_unknown_tools_a_spent_budget_and_bad_arguments_are_refused(conn):
    thread = new_thread(conn)
    as_writer(conn)
    err = refused(
        conn,
        "P0002",
        "SELECT * FROM outbox.start_run_v1(%s, %s, 'm', p_tools => ARRAY['nope'])",
        [A, thread],
    )
    assert "unknown tools {nope}" in err.diag.message_primary
    for args in ("''", "'m', p_api => 'soap'", "'m', p_max_steps => 0", "'m', p_loop_limit => 1"):
        as_writer(conn)
        refused(conn, "22023", f"SELECT * FROM outbox.start_run_v1(%s, %s, {args})", [A, thread])
    as_writer(conn)
    refused(conn, "22023", "SELECT outbox.create_thread_v1(%s)", ["no spaces allowed"])

    conn.execute(
        "INSERT INTO outbox.tenant_budgets (tenant_id, max_tokens, tokens_used)"
        " VALUES (%s, 10, 10)",
        [A],
    )
    conn.commit()
    as_writer(conn)
    err = refused(conn, "OB003", "SELECT * FROM outbox.start_run_v1(%s, %s, 'm')", [A, thread])
    assert "its budget is 10" in err.diag.message_primary
    assert scalar(conn, "SELECT count(*) FROM outbox.runs") == 0


def test_row_level_security_keeps_each_tenant_to_its_own(conn):
    theirs = new_thread(conn, B)
    as_writer(conn)
    # a thread of another tenant is invisible under tenant A's row-level security
    refused(conn, "P0002", "SELECT * FROM outbox.start_run_v1(%s, %s, 'm')", [A, theirs])
    # a session scoped to A (e.g. by the backend's middleware) may not act for B
    as_writer(conn)
    conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [A])
    err = refused(conn, "42501", "SELECT * FROM outbox.start_run_v1(%s, %s, 'm')", [B, theirs])
    assert "scoped to tenant tenant-a" in err.diag.message_primary
    as_writer(conn)
    conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [A])
    refused(conn, "42501", "SELECT outbox.create_thread_v1(%s)", [B])
    # the owner sees every tenant, and is told the thread is another tenant's
    refused(conn, "OB004", "SELECT * FROM outbox.start_run_v1(%s, %s, 'm')", [A, theirs])


def test_cancel_run_as_outbox_writer_ends_the_run_once(conn):
    thread = new_thread(conn)
    as_writer(conn)
    (run_id, *_) = start(conn, A, thread)
    conn.commit()
    as_writer(conn)
    # outbox_writer may not delete outbox rows; cancel_run_v1 does it for the run's tenant
    ended = conn.execute(
        "SELECT status, failure_reason FROM outbox.cancel_run_v1(%s, %s, p_actor => 'ops')",
        [A, run_id],
    ).fetchone()
    conn.commit()
    assert ended == ("cancelled", "cancelled")
    assert scalar(conn, "SELECT count(*) FROM outbox.outbox WHERE run_id = %s", [run_id]) == 0
    assert conn.execute(
        "SELECT actor, detail->>'reason' FROM outbox.journal WHERE event = 'run.cancelled'"
    ).fetchall() == [("ops", "cancelled")]
    as_writer(conn)
    refused(conn, "OB005", "SELECT * FROM outbox.cancel_run_v1(%s, %s)", [A, run_id])
    as_writer(conn)
    refused(conn, "P0002", "SELECT * FROM outbox.cancel_run_v1(%s, %s)", [B, run_id])
    # a new run may start on the thread
    as_writer(conn)
    assert start(conn, A, thread)[2] is True


def test_writer_may_not_end_runs_directly(conn):
    thread = new_thread(conn)
    as_writer(conn)
    (run_id, *_) = start(conn, A, thread)
    conn.commit()
    as_writer(conn)
    refused(
        conn,
        "42501",
        "SELECT * FROM outbox.end_run_v1(%s, 'failed', 'step_cap')",
        [run_id],
    )


def test_stuck_runs_reports_a_run_inserted_without_its_outbox_row(conn):
    thread = new_thread(conn)
    as_writer(conn)
    (started, *_) = start(conn, A, thread)
    conn.commit()
    # what an ORM insert of a Run alone does: a queued run nothing will ever pick up
    other = new_thread(conn)
    bare = scalar(
        conn,
        "INSERT INTO outbox.runs (tenant_id, thread_id, model, correlation_id) "
        "VALUES (%s, %s, 'gpt-5', 'c') RETURNING id",
        [A, other],
    )
    conn.commit()
    stuck = conn.execute("SELECT run_id, reason, detail FROM outbox.stuck_runs").fetchall()
    assert [(r[0], r[1]) for r in stuck] == [(bare, "no_work_queued")]
    assert "no outbox row" in stuck[0][2]
    assert started not in {r[0] for r in stuck}
