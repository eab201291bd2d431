"""The operator CLI against a real database: happy paths, unknown ids, refused transitions.

States the relay would produce (quarantined after max attempts, outcome_unknown, leased)
are set up with plain SQL, as the relay's own queries would leave them.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from cli import main
from outbox import ops, writer
from outbox.schemas import ToolResultIn
from tests.helpers import TENANT, add_tool, new_run, turn


@pytest.fixture
def cli(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


@pytest.fixture
def db(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def one(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, list(params)).fetchone()
    return None if row is None else (row[0] if len(row) == 1 else row)


def make_call(db_url: str, tool: str = "lookup_order", n: int = 1) -> list[int]:
    """A run whose model turn asked for ``n`` calls of ``tool``; their outbox rows are ready."""
    with psycopg.connect(db_url) as conn:
        if one(conn, "SELECT count(*) FROM outbox.tools WHERE name = %s", tool) == 0:
            add_tool(conn, tool)
        run = new_run(conn, tools=[tool])
        calls = [(f"c{i}", tool, {"order_id": str(i)}) for i in range(n)]
        rec = writer.record_model_turn(conn, turn(run, 1, *calls))
        conn.commit()
    return rec.tool_call_refs


def quarantine_like_relay(db: psycopg.Connection[Any], ref: int, unknown: bool = False) -> None:
    attempts = 1 if unknown else 5
    db.execute(
        "UPDATE outbox.outbox SET status = 'quarantined', attempts = %s, failures = %s, "
        "max_attempts = 5, last_error = 'HTTP 502' WHERE tool_call_ref = %s",
        [attempts, attempts, ref],
    )
    db.execute(
        "UPDATE outbox.tool_calls SET status = %s, attempts = %s, last_error = 'HTTP 502', "
        "dispatched_attempt = %s WHERE id = %s",
        ["outcome_unknown" if unknown else "quarantined", attempts, 1 if unknown else None, ref],
    )


def lease_like_relay(db: psycopg.Connection[Any], ref: int) -> None:
    db.execute(
        "UPDATE outbox.outbox SET status = 'leased', attempts = attempts + 1, "
        "lease_owner = 'host:1:w', lease_expires_at = now() + interval '1 minute', "
        "claimed_at = now() WHERE tool_call_ref = %s",
        [ref],
    )


def queue_row(db: psycopg.Connection[Any], ref: int) -> Any:
    return one(
        db,
        "SELECT status, attempts, max_attempts, available_at <= now() FROM outbox.outbox "
        "WHERE tool_call_ref = %s",
        ref,
    )


def operator_events(db: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT event, actor, tool_call_ref FROM outbox.journal "
        "WHERE event LIKE 'operator.%' ORDER BY id"
    ).fetchall()


def refused(result: Result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "error: " in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


# -- queue stats, runs ------------------------------------------------------------------


def test_queue_stats(cli, db_url, db):
    ref, other = make_call(db_url, n=2)
    quarantine_like_relay(db, ref)
    lease_like_relay(db, other)
    db.execute(
        "UPDATE outbox.outbox SET available_at = now() - interval '1 minute' "
        "WHERE kind = 'model_turn'"
    )
    out = cli("queue", "stats", "--json")
    assert out.exit_code == 0, out.output
    stats = json.loads(out.stdout)
    by_kind = {r["kind"]: r for r in stats["by_kind"]}
    assert by_kind["tool_call"] | {"lag_s": 0} == {
        "kind": "tool_call",
        "ready": 0,
        "delayed": 0,
        "held": 0,
        "in_flight": 1,
        "quarantined": 1,
        "lag_s": 0,
    }
    assert by_kind["model_turn"]["ready"] == 1 and by_kind["model_turn"]["lag_s"] >= 60
    assert stats["oldest_ready_lag_s"] >= 60
    assert stats["by_tool"] == [
        {
            "tool": "lookup_order",
            "ready": 0,
            "delayed": 0,
            "held": 0,
            "in_flight": 1,
            "quarantined": 1,
        }
    ]
    assert stats["claim_to_start"]["samples"] == 1
    human = cli("queue", "stats")
    assert human.exit_code == 0 and "lookup_order" in human.stdout and "p99" in human.stdout


def test_runs_list_and_filters(cli, db_url):
    with psycopg.connect(db_url) as conn:
        a = new_run(conn)
        b = new_run(conn, tenant="other")
        conn.commit()
    listed = json.loads(cli("runs", "list", "--json").stdout)
    assert {r["id"] for r in listed} == {str(a.id), str(b.id)}
    only = json.loads(cli("runs", "list", "--tenant", "other", "--json").stdout)
    assert [r["id"] for r in only] == [str(b.id)]
    assert json.loads(cli("runs", "list", "--status", "completed", "--json").stdout) == []
    assert json.loads(cli("runs", "list", "--since", "1h", "--json").stdout) != []
    assert cli("runs", "list", "--since", "2999-01-01", "--json").stdout.strip() == "[]"
    refused(cli("runs", "list", "--since", "yesterday-ish"), "neither an age nor a date")


def test_runs_show_by_prefix_is_a_timeline(cli, db_url):
    ref = make_call(db_url)[0]
    with psycopg.connect(db_url) as conn:
        run_id = one(conn, "SELECT run_id FROM outbox.tool_calls WHERE id = %s", ref)
    out = cli("runs", "show", str(run_id)[:8], "--json")
    assert out.exit_code == 0, out.output
    shown = json.loads(out.stdout)
    assert shown["run"]["id"] == str(run_id)
    events = [e["event"] for e in shown["timeline"]]
    assert events == ["run.created", "model_turn.recorded", "tool_call.intended"]
    assert shown["timeline"][2]["tool_call_ref"] == ref
    human = cli("runs", "show", str(run_id))
    assert "tool_call.intended" in human.stdout and "run " + str(run_id) in human.stdout


def test_runs_show_unknown_and_ambiguous(cli, db):
    refused(cli("runs", "show", str(uuid.uuid4())), "does not exist")
    refused(cli("runs", "show", "not-a-uuid!"), "is not a run id")
    thread = one(db, "INSERT INTO outbox.threads (tenant_id) VALUES ('t') RETURNING id")
    for suffix in ("1", "2"):
        db.execute(
            "INSERT INTO outbox.runs (id, tenant_id, thread_id, model, correlation_id, status) "
            "VALUES (%s, 't', %s, 'm', 'c', 'completed')",
            [f"abcdef00-0000-0000-0000-00000000000{suffix}", thread],
        )
    refused(cli("runs", "show", "abcdef"), "ambiguous")
    assert cli("runs", "show", "abcdef00-0000-0000-0000-000000000002").exit_code == 0


# -- requeue ----------------------------------------------------------------------------


def test_requeue_a_quarantined_call_keeps_its_attempts(cli, db_url, db):
    ref = make_call(db_url)[0]
    quarantine_like_relay(db, ref)
    out = cli("requeue", str(ref), "--actor", "alice", "--json")
    assert out.exit_code == 0, out.output
    [change] = json.loads(out.stdout)
    assert change["from_state"] == "quarantined" and change["to_state"] == "ready"
    assert change["applied"] is True
    # attempts kept (the fencing token is never reused), one more attempt allowed, due now
    assert queue_row(db, ref) == ("ready", 5, 6, True)
    assert one(db, "SELECT status FROM outbox.tool_calls WHERE id = %s", ref) == "pending"
    assert operator_events(db) == [("operator.requeue", "alice", ref)]


def test_requeue_dry_run_changes_nothing(cli, db_url, db):
    ref = make_call(db_url)[0]
    quarantine_like_relay(db, ref)
    out = cli("requeue", f"call:{ref}", "--dry-run")
    assert out.exit_code == 0 and "would requeue" in out.stdout
    assert queue_row(db, ref) == ("quarantined", 5, 5, True)
    assert operator_events(db) == []


def test_requeue_refusals_change_nothing(cli, db_url, db):
    done, unknown, leased, ready = make_call(db_url, n=4)
    with psycopg.connect(db_url) as conn:
        writer.record_tool_result(
            conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=done, status="ok", attempt=1)
        )
        conn.execute("DELETE FROM outbox.outbox WHERE tool_call_ref = %s", [done])
        conn.commit()
    quarantine_like_relay(db, unknown, unknown=True)
    lease_like_relay(db, leased)
    before = db.execute("SELECT * FROM outbox.outbox ORDER BY id").fetchall()
    refused(cli("requeue", str(done)), "succeeded", "has its result")
    refused(cli("requeue", str(unknown)), "outcome is unknown", "outbox reconcile")
    refused(cli("requeue", str(leased)), "holds its lease")
    refused(cli("requeue", str(ready)), "already ready")
    refused(cli("requeue", "999999"), "tool call 999999 does not exist")
    refused(cli("requeue", "outbox:999999"), "outbox row 999999 does not exist")
    assert db.execute("SELECT * FROM outbox.outbox ORDER BY id").fetchall() == before
    assert operator_events(db) == []


def test_requeue_bulk_by_tool_and_status(cli, db_url, db):
    first, second, unknown = make_call(db_url, "create_ticket", n=3)
    other = make_call(db_url, "lookup_order")[0]
    for ref in (first, second, other):
        quarantine_like_relay(db, ref)
    quarantine_like_relay(db, unknown, unknown=True)
    dry = cli("requeue", "--tool", "create_ticket", "--status", "quarantined", "--dry-run")
    assert dry.exit_code == 0 and dry.stdout.count("would requeue") == 2
    assert queue_row(db, first)[0] == "quarantined"
    out = cli(
        "requeue", "--tool", "create_ticket", "--status", "quarantined", "--since", "1h", "--json"
    )
    assert out.exit_code == 0, out.output
    changes = json.loads(out.stdout)
    assert [(c["tool_call_ref"], c["applied"]) for c in changes] == [
        (first, True),
        (second, True),
        (unknown, False),
    ]
    assert "outcome is unknown" in changes[2]["note"]
    assert [queue_row(db, r)[0] for r in (first, second, unknown, other)] == [
        "ready",
        "ready",
        "quarantined",
        "quarantined",
    ]
    refused(cli("requeue", "--status", "succeeded"), "cannot requeue succeeded work")
    usage = cli("requeue")
    assert usage.exit_code == 2 and "give an ID" in usage.stderr


def test_requeue_a_delayed_row_runs_it_now(cli, db_url, db):
    ref = make_call(db_url)[0]
    db.execute(
        "UPDATE outbox.outbox SET available_at = now() + interval '1 hour' "
        "WHERE tool_call_ref = %s",
        [ref],
    )
    outbox_id = one(db, "SELECT id FROM outbox.outbox WHERE tool_call_ref = %s", ref)
    out = cli("requeue", f"outbox:{outbox_id}")
    assert out.exit_code == 0 and "delayed -> ready" in out.stdout
    assert queue_row(db, ref)[3] is True


# -- quarantine, release ----------------------------------------------------------------


def test_quarantine_then_release(cli, db_url, db):
    ref = make_call(db_url)[0]
    out = cli("quarantine", str(ref), "--reason", "tool vendor incident", "--actor", "bob")
    assert out.exit_code == 0 and "ready -> quarantined" in out.stdout
    assert queue_row(db, ref)[0] == "quarantined"
    assert one(db, "SELECT last_error FROM outbox.outbox WHERE tool_call_ref = %s", ref) == (
        "quarantined by bob: tool vendor incident"
    )
    assert one(db, "SELECT status FROM outbox.tool_calls WHERE id = %s", ref) == "quarantined"
    refused(cli("quarantine", str(ref), "--reason", "again"), "already quarantined")
    out = cli("release", str(ref), "--actor", "bob", "--json")
    assert out.exit_code == 0
    assert json.loads(out.stdout)[0]["to_state"] == "ready"
    assert queue_row(db, ref)[0] == "ready"
    detail = one(db, "SELECT detail FROM outbox.journal WHERE event = 'operator.quarantine'")
    assert detail == {"from": "ready", "reason": "tool vendor incident"}
    assert operator_events(db) == [
        ("operator.quarantine", "bob", ref),
        ("operator.release", "bob", ref),
    ]


def test_release_and_quarantine_refusals(cli, db_url, db):
    ready, leased = make_call(db_url, n=2)
    lease_like_relay(db, leased)
    refused(cli("release", str(ready)), "not quarantined (it is ready)")
    refused(cli("quarantine", str(leased), "--reason", "x"), "holds its lease")
    refused(cli("release", "424242"), "does not exist")
    refused(cli("quarantine", "424242", "--reason", "x"), "does not exist")
    refused(cli("quarantine", "what", "--reason", "x"), "not a tool call or outbox row id")
    assert queue_row(db, ready)[0] == "ready" and queue_row(db, leased)[0] == "leased"
    assert operator_events(db) == []


# -- reconcile --------------------------------------------------------------------------


def test_reconcile_happened_records_the_result_and_completes_the_batch(cli, db_url, db):
    ref = make_call(db_url)[0]
    quarantine_like_relay(db, ref, unknown=True)
    out = cli("reconcile", str(ref), "--happened", "--result", '{"ticket": 7}', "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)[0]["to_state"] == "result stored"
    assert one(db, "SELECT status, output, source FROM outbox.tool_results") == (
        "ok",
        {"ticket": 7},
        "operator",
    )
    assert one(db, "SELECT status FROM outbox.tool_calls WHERE id = %s", ref) == "succeeded"
    assert queue_row(db, ref) is None  # settled: it left the queue
    assert one(db, "SELECT count(*) FROM outbox.outbox WHERE kind = 'deliver_batch'") == 1
    assert one(db, "SELECT status FROM outbox.tool_batches") == "complete"
    events = [e[0] for e in db.execute("SELECT event FROM outbox.journal ORDER BY id")]
    assert events[-3:] == ["tool_result.stored", "batch.complete", "operator.reconcile"]


def test_reconcile_not_happened_runs_it_again(cli, db_url, db):
    ref = make_call(db_url)[0]
    quarantine_like_relay(db, ref, unknown=True)
    out = cli("reconcile", str(ref), "--not-happened", "--actor", "carol")
    assert out.exit_code == 0, out.output
    assert queue_row(db, ref) == ("ready", 1, 5, True)
    assert one(
        db, "SELECT status, dispatched_attempt, attempts FROM outbox.tool_calls WHERE id = %s", ref
    ) == ("pending", None, 1)
    assert one(db, "SELECT count(*) FROM outbox.tool_results") == 0
    assert operator_events(db) == [("operator.reconcile", "carol", ref)]


def test_reconcile_refusals(cli, db_url, db):
    ref = make_call(db_url)[0]
    refused(cli("reconcile", str(ref), "--not-happened"), "not outcome_unknown")
    quarantine_like_relay(db, ref, unknown=True)
    usage = cli("reconcile", str(ref), "--happened")
    assert usage.exit_code == 2 and "--result" in usage.stderr
    bad = cli("reconcile", str(ref), "--happened", "--result", "{nope")
    assert bad.exit_code == 2 and "not JSON" in bad.stderr
    refused(cli("reconcile", "31337", "--not-happened"), "does not exist")
    assert queue_row(db, ref)[0] == "quarantined"
    assert one(db, "SELECT count(*) FROM outbox.tool_results") == 0


# -- journal, prune ---------------------------------------------------------------------


def test_journal_tail_json_lines_and_run_filter(cli, db_url):
    make_call(db_url)
    with psycopg.connect(db_url) as conn:
        other = new_run(conn, tenant="other")
        conn.commit()
    out = cli("journal", "tail", "--json", "-n", "3")
    assert out.exit_code == 0
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 3 and lines[0]["id"] < lines[1]["id"] < lines[2]["id"]
    assert lines[-1]["event"] == "run.created" and lines[-1]["run_id"] == str(other.id)
    mine = [
        json.loads(x)
        for x in cli("journal", "tail", "--run", str(other.id), "--json").stdout.splitlines()
    ]
    assert [e["event"] for e in mine] == ["run.created"]
    human = cli("journal", "tail")
    assert "tool_call.intended" in human.stdout


def test_tail_follow_sees_events_that_commit_out_of_id_order(db_url):
    with (
        psycopg.connect(db_url, autocommit=True) as reader,
        psycopg.connect(db_url) as slow,
        psycopg.connect(db_url) as fast,
    ):
        stop = threading.Event()
        events = ops.tail(reader, limit=5, follow=True, stop=stop, poll_s=0.01)
        assert list(_take(events, 0)) == []  # the journal is empty
        writer.journal(slow, "slow.event", TENANT)  # takes the lower id, commits last
        writer.journal(fast, "fast.event", TENANT)
        fast.commit()
        assert next(events)["event"] == "fast.event"
        slow.commit()
        assert next(events)["event"] == "slow.event"
        stop.set()
        assert list(events) == []


def _take(it: Any, n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


def test_prune_removes_only_old_events_and_journals_itself(cli, db_url, db):
    make_call(db_url)
    db.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) "
        "VALUES (now() - interval '40 days', 'acme', 'ancient'), "
        "(now() - interval '29 days', 'acme', 'recent')"
    )
    total = one(db, "SELECT count(*) FROM outbox.journal")
    out = cli("prune", "--older-than", "30d", "--actor", "dba", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"removed": 1, "older_than": "30d"}
    events = [e[0] for e in db.execute("SELECT event FROM outbox.journal ORDER BY id")]
    assert "ancient" not in events and "recent" in events
    assert len(events) == total  # one removed, one journal.pruned added
    assert one(
        db, "SELECT actor, detail->>'removed' FROM outbox.journal WHERE event = 'journal.pruned'"
    ) == ("dba", "1")
    refused(cli("prune", "--older-than", "soon"), "is not an age")


def test_after_a_prune_plain_deletes_are_still_refused(conn):
    conn.execute("INSERT INTO outbox.journal (tenant_id, event) VALUES ('acme', 'x')")
    assert ops.prune(conn, ops.parse_age("1s"), actor="dba") == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM outbox.journal")
    conn.rollback()
    # setting the flag by hand does not open the door either
    conn.execute("INSERT INTO outbox.journal (tenant_id, event) VALUES ('acme', 'y')")
    conn.execute("SELECT set_config('outbox.journal_prune', 'on', true)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute("DELETE FROM outbox.journal")
