"""Isolation holes found by review, each attacked the way it was found (each test failed
before 0014).

- A run whose work is quarantined stayed ``in_progress`` and no view reported it.
- The journal's owner could delete events by setting ``outbox.journal_prune`` to its own
  transaction id by hand, with no ``journal.pruned`` event.
- ``submit_tool_outputs_v1`` (SECURITY DEFINER) checked the tenant only when the session
  had one: an unscoped ``outbox_writer`` submitted into another tenant's run (0015).
"""

from __future__ import annotations

import json

import psycopg
import pytest

from outbox import ops, registry, writer
from tests.helpers import add_tool, new_run, turn


def stuck(conn: psycopg.Connection, reason: str) -> list[tuple]:
    return conn.execute(
        "SELECT run_id, status, outbox_id, detail FROM outbox.stuck_runs WHERE reason = %s",
        (reason,),
    ).fetchall()


def test_a_run_waiting_on_a_quarantined_call_is_reported_stuck(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    ref = writer.record_model_turn(
        conn, turn(run, 1, ("call_1", "lookup_order", {"order_id": "1"}))
    ).tool_call_refs[0]
    conn.commit()
    assert stuck(conn, "parked_call") == []
    ops.quarantine(conn, f"call:{ref}", reason="tool keeps failing", actor="ops")
    conn.commit()
    ((run_id, status, outbox_id, detail),) = stuck(conn, "parked_call")
    assert (run_id, status) == (run.id, "in_progress")
    assert outbox_id is not None and "lookup_order" in detail and "requeue" in detail
    ops.requeue(conn, f"call:{ref}", actor="ops")  # the operator acts: no longer stuck
    conn.commit()
    assert stuck(conn, "parked_call") == []


def test_a_hand_set_prune_flag_deletes_nothing(conn):
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) "
        "VALUES (now() - interval '40 days', 'acme', 'evidence')"
    )
    conn.commit()
    # The flag as the old guard wanted it: this transaction's own id.
    conn.execute("SELECT set_config('outbox.journal_prune', pg_current_xact_id()::text, true)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM outbox.journal WHERE event = 'evidence'")
    conn.rollback()


def test_a_pruned_event_of_another_transaction_opens_nothing(conn):
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) "
        "VALUES (now() - interval '40 days', 'acme', 'evidence')"
    )
    conn.commit()
    assert conn.execute("SELECT outbox.prune_journal(interval '1000 days')").fetchone() == (0,)
    conn.commit()
    (event_id,) = conn.execute(
        "SELECT id FROM outbox.journal WHERE event = 'journal.pruned'"
    ).fetchone()
    conn.execute("SELECT set_config('outbox.journal_prune', %s, true)", (str(event_id),))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM outbox.journal WHERE event = 'evidence'")
    conn.rollback()


def test_prune_journals_before_it_deletes_and_deletes_only_older_events(conn):
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) "
        "VALUES (now() - interval '40 days', 'acme', 'old'), (now(), 'acme', 'new')"
    )
    conn.commit()
    assert conn.execute("SELECT outbox.prune_journal(interval '30 days', 'dba')").fetchone() == (1,)
    conn.commit()
    events = [e for (e,) in conn.execute("SELECT event FROM outbox.journal ORDER BY id")]
    assert "old" not in events and "new" in events
    ((actor, detail),) = conn.execute(
        "SELECT actor, detail FROM outbox.journal WHERE event = 'journal.pruned'"
    ).fetchall()
    assert actor == "dba" and detail["removed"] == 1 and detail["older_than"] == "30 days"
    # Within the same transaction as a prune, a later DELETE of newer rows is still refused.
    conn.execute("SELECT outbox.prune_journal(interval '30 days', 'dba')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM outbox.journal WHERE event = 'new'")
    conn.rollback()


def test_outputs_from_an_unscoped_writer_are_refused_and_change_nothing(conn):
    """submit_tool_outputs_v1 runs as the owner, beyond row-level security: as
    outbox_writer with no tenant scope, outputs went into another tenant's run."""
    registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
    run = new_run(conn, tenant="tenant-b", tools=["approve"])
    writer.record_model_turn(conn, turn(run, 1, ("call_1", "approve", {})))
    conn.commit()
    outputs = json.dumps([{"tool_call_id": "call_1", "output": {"approved": True}}])
    submit = "SELECT outbox.submit_tool_outputs_v1(%s, %s, %s::jsonb)"
    conn.execute("SET LOCAL ROLE outbox_writer")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="has none") as err:
        conn.execute(submit, ["tenant-b", run.id, outputs])
    assert "enter_tenant_v1('tenant-b')" in (err.value.diag.message_hint or "")
    conn.rollback()
    conn.execute("SET LOCAL ROLE outbox_writer")
    conn.execute("SELECT outbox.enter_tenant_v1('tenant-a')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not tenant-b"):
        conn.execute(submit, ["tenant-b", run.id, outputs])
    conn.rollback()
    status = conn.execute("SELECT status FROM outbox.runs WHERE id = %s", [run.id]).fetchone()
    assert status == ("requires_action",)
    assert conn.execute("SELECT count(*) FROM outbox.tool_results").fetchone() == (0,)
    # Scoped to its own tenant, the backend submits as before.
    conn.execute("SET LOCAL ROLE outbox_writer")
    conn.execute("SELECT outbox.enter_tenant_v1('tenant-b')")
    assert conn.execute(submit, ["tenant-b", run.id, outputs]).fetchone() == ("in_progress",)
    conn.commit()
