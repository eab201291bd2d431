"""Least-privilege roles and tenant row-level security (migration 0002), attacked for real.

Each test connects as the superuser that owns the test database and drops to a role with
``SET LOCAL ROLE`` inside a transaction, exactly the rights a backend, a relay or an auditor
logged in as a member of that role would have.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import db, migrate, ops, registry, tenancy, trace_export, writer
from outbox.errors import OutboxError
from outbox.schemas import ToolResultIn
from outbox.sql import Queries
from tests.helpers import add_tool, new_run, turn

A, B = "tenant-a", "tenant-b"
RELAY_Q = Queries(Path(__file__).parents[2] / "relay" / "queries" / "relay.sql", "outbox")
TENANT_TABLES = [
    "compactions",
    "threads",
    "runs",
    "messages",
    "model_turns",
    "tool_batches",
    "tool_calls",
    "tool_results",
    "orphaned_results",
    "submissions",
    "outbox",
    "tools",
    "journal",
    "archived_runs",  # partitioned, like the journal: checked on the parent
    "tenant_budgets",
    "approvals",
    "risk_policies",
    "tool_switches",
    "tenant_pauses",
    "tenant_roles",
    "credentials",
    "api_keys",  # migration 0020 (outbox serve)
    "console_users",  # the console's accounts and sessions
    "console_sessions",
    "assistants",
    "assistant_runs",
    "webhook_endpoints",  # migration 0024
    "webhook_deliveries",
    "responses",  # migration 0025
    "mcp_servers",
    "retention_policies",
    "payloads",  # migration 0040
    "model_routes",  # migration 0048
]


def seed(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Each tenant: a thread, a run, a model turn with one http tool call (an outbox row)."""
    add_tool(conn)
    made: dict[str, Any] = {}
    for tenant in (A, B):
        run = new_run(conn, tenant=tenant, tools=["lookup_order"])
        rec = writer.record_model_turn(
            conn, turn(run, 1, (f"call_{tenant}", "lookup_order", {"order_id": "1"}))
        )
        made[tenant] = {"run": run, "call": rec.tool_call_refs[0]}
    conn.commit()
    return made


def as_role(conn: psycopg.Connection[Any], role: str, tenant: str | None = None) -> None:
    conn.execute(f"SET LOCAL ROLE {role}")
    if tenant is not None:
        tenancy.scope(conn, tenant)


def tenants_seen(conn: psycopg.Connection[Any], table: str) -> set[str]:
    return {r[0] for r in conn.execute(f"SELECT DISTINCT tenant_id FROM outbox.{table}")}


def test_roles_exist_without_bypass_and_own_nothing(conn):
    roles = conn.execute(
        "SELECT rolname, rolsuper, rolbypassrls, rolcanlogin FROM pg_roles "
        "WHERE rolname LIKE 'outbox\\_%' ORDER BY rolname"
    ).fetchall()
    assert [r[0] for r in roles] == [
        "outbox_api",
        "outbox_auditor",
        "outbox_relay",
        "outbox_writer",
    ]
    assert all(not r[1] and not r[2] and not r[3] for r in roles), roles
    owned = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'outbox' AND pg_get_userbyid(c.relowner) LIKE 'outbox\\_%'"
    ).fetchall()
    assert owned == []


def test_every_tenant_table_forces_row_level_security(conn):
    rows = conn.execute(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' "
        "WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "ORDER BY c.relname"
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(TENANT_TABLES)
    assert all(r[1] and r[2] for r in rows), rows
    # The journal's partitions (0036) are read and written through the journal, whose
    # policies apply: nobody but their owner has any right on a partition itself.
    grants = conn.execute(
        "SELECT c.relname, c.relacl::text FROM pg_class c "
        "JOIN pg_inherits i ON i.inhrelid = c.oid "
        "WHERE i.inhparent = 'outbox.journal'::regclass"
    ).fetchall()
    assert grants and all(acl is None for _, acl in grants), grants


def test_writer_sees_only_its_tenant(conn):
    seed(conn)
    as_role(conn, "outbox_writer", A)
    for table in ("threads", "runs", "messages", "tool_batches", "tool_calls", "outbox"):
        assert tenants_seen(conn, table) == {A}, table
    # shared tools ('*') stay visible
    assert tenants_seen(conn, "tools") == {"*"}


def test_writer_without_a_tenant_sees_nothing(conn):
    seed(conn)
    as_role(conn, "outbox_writer")
    for table in ("threads", "runs", "tool_calls", "outbox"):
        assert tenants_seen(conn, table) == set(), table


def test_tenant_scope_ends_with_the_transaction(conn):
    seed(conn)
    as_role(conn, "outbox_writer", A)
    assert tenants_seen(conn, "runs") == {A}
    conn.commit()
    as_role(conn, "outbox_writer")
    assert tenants_seen(conn, "runs") == set()


def test_writer_cannot_insert_rows_for_another_tenant(conn):
    made = seed(conn)
    as_role(conn, "outbox_writer", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        conn.execute("INSERT INTO outbox.threads (tenant_id) VALUES (%s)", [B])
    conn.rollback()
    as_role(conn, "outbox_writer", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        conn.execute(
            "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, run_id) "
            "VALUES (%s, 'model_turn', 'evil', %s)",
            [B, made[B]["run"].id],
        )


# Each insert names one row of its own tenant through ``ref``. Foreign-key checks do not
# go through row-level security, so only the keys themselves (migration 0007) keep a writer
# from naming another tenant's thread, run, batch, call or message there.
CROSS_TENANT_REFERENCES = {
    "message -> run": (
        "run",
        "INSERT INTO outbox.messages (tenant_id, thread_id, seq, role, content, run_id) "
        "VALUES (%(tenant)s, %(thread)s, 1000, 'user', 'x', %(ref)s)",
    ),
    "model turn -> run": (
        "run",
        "INSERT INTO outbox.model_turns (tenant_id, run_id, step_no, message_id) "
        "VALUES (%(tenant)s, %(ref)s, 99, %(message)s)",
    ),
    "model turn -> message": (
        "message",
        "INSERT INTO outbox.model_turns (tenant_id, run_id, step_no, message_id) "
        "VALUES (%(tenant)s, %(run)s, 99, %(ref)s)",
    ),
    "batch -> run": (
        "run",
        "INSERT INTO outbox.tool_batches "
        "(tenant_id, run_id, thread_id, step_no, message_id, size, pending) "
        "VALUES (%(tenant)s, %(ref)s, %(thread)s, 99, %(message)s, 1, 1)",
    ),
    "tool call -> batch": (
        "batch",
        "INSERT INTO outbox.tool_calls (tenant_id, run_id, thread_id, batch_id, message_id, "
        "position, tool_call_id, tool_name, arguments_raw, arguments_hash, executor, "
        "idempotency_key) VALUES (%(tenant)s, %(run)s, %(thread)s, %(ref)s, %(message)s, "
        "99, 'call_evil', 'lookup_order', '{}', 'h', 'http', 'key-evil')",
    ),
    "tool call -> run": (
        "run",
        "INSERT INTO outbox.tool_calls (tenant_id, run_id, thread_id, batch_id, message_id, "
        "position, tool_call_id, tool_name, arguments_raw, arguments_hash, executor, "
        "idempotency_key) VALUES (%(tenant)s, %(ref)s, %(thread)s, %(batch)s, %(message)s, "
        "99, 'call_evil', 'lookup_order', '{}', 'h', 'http', 'key-evil')",
    ),
    "result -> tool call": (
        "call",
        "INSERT INTO outbox.tool_results "
        "(tool_call_ref, tenant_id, run_id, batch_id, status, source) "
        "VALUES (%(ref)s, %(tenant)s, %(run)s, %(batch)s, 'ok', 'client')",
    ),
    "result -> batch": (
        "batch",
        "INSERT INTO outbox.tool_results "
        "(tool_call_ref, tenant_id, run_id, batch_id, status, source) "
        "VALUES (%(call)s, %(tenant)s, %(run)s, %(ref)s, 'ok', 'client')",
    ),
    "orphaned result -> tool call": (
        "call",
        "INSERT INTO outbox.orphaned_results (tenant_id, tool_call_ref, status, reason, source) "
        "VALUES (%(tenant)s, %(ref)s, 'ok', 'duplicate', 'client')",
    ),
    "tool call -> batch, by update": (
        "batch",
        "UPDATE outbox.tool_calls SET batch_id = %(ref)s, position = 99 WHERE id = %(call)s",
    ),
    # The relay acts on outbox rows: one naming another tenant's run or call would make it
    # call that tenant's model or tool.
    "outbox -> thread": (
        "thread",
        "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, run_id, thread_id) "
        "VALUES (%(tenant)s, 'model_turn', 'model_turn:' || %(run)s || ':9', %(run)s, %(ref)s)",
    ),
    "outbox -> run": (
        "run",
        "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, run_id) "
        "VALUES (%(tenant)s, 'model_turn', 'model_turn:' || %(ref)s || ':9', %(ref)s)",
    ),
    "outbox -> batch": (
        "batch",
        "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, batch_id) "
        "VALUES (%(tenant)s, 'deliver_batch', 'deliver:' || %(ref)s, %(ref)s)",
    ),
    "outbox -> tool call": (
        "call",
        "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, tool_call_ref) "
        "VALUES (%(tenant)s, 'tool_call', 'tool_call:' || %(ref)s, %(ref)s)",
    ),
    "submission -> run": (
        "run",
        "INSERT INTO outbox.submissions (tenant_id, run_id, batch_id, outputs_count) "
        "VALUES (%(tenant)s, %(ref)s, %(batch)s, 1)",
    ),
    "submission -> batch": (
        "batch",
        "INSERT INTO outbox.submissions (tenant_id, run_id, batch_id, outputs_count) "
        "VALUES (%(tenant)s, %(run)s, %(ref)s, 1)",
    ),
}


def ids_of(conn: psycopg.Connection[Any], made: dict[str, Any], tenant: str) -> dict[str, Any]:
    run = made[tenant]["run"]
    batch, message = conn.execute(
        "SELECT b.id, b.message_id FROM outbox.tool_batches b WHERE b.run_id = %s", [run.id]
    ).fetchone()  # type: ignore[misc]
    return {
        "tenant": tenant,
        "run": run.id,
        "thread": run.thread_id,
        "batch": batch,
        "message": message,
        "call": made[tenant]["call"],
    }


@pytest.mark.parametrize("reference", sorted(CROSS_TENANT_REFERENCES))
def test_writer_cannot_reference_rows_of_another_tenant(conn, reference):
    made = seed(conn)
    own, theirs = ids_of(conn, made, A), ids_of(conn, made, B)
    target, statement = CROSS_TENANT_REFERENCES[reference]
    # Queued work holds dedup keys naming these rows: a key already taken would fail the
    # insert on uniqueness before the reference is looked at.
    conn.execute("DELETE FROM outbox.outbox")
    as_role(conn, "outbox_writer", A)
    # The statement is valid with a row of its own tenant: only the reference can fail it.
    with conn.transaction(force_rollback=True):
        conn.execute(statement, {**own, "ref": own[target]})
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(statement, {**own, "ref": theirs[target]})


def test_writer_cannot_take_the_dedup_key_of_another_tenants_work(conn):
    """The outbox dedups by key across tenants (ON CONFLICT DO NOTHING): a key held by
    tenant A would swallow tenant B's delivery. A key names the row it dedups, so A can
    only hold keys of its own runs, batches and calls."""
    made = seed(conn)
    own, theirs = ids_of(conn, made, A), ids_of(conn, made, B)
    as_role(conn, "outbox_writer", A)
    squat = (
        "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, batch_id) "
        "VALUES (%(tenant)s, 'deliver_batch', %(key)s, %(batch)s)"
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="outbox_dedup_key_names_its_row"):
        conn.execute(squat, {**own, "key": f"deliver:{theirs['batch']}"})
    conn.rollback()
    as_role(conn, "outbox_writer", A)
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="not 'tenant-a''s"):
        conn.execute(squat, {**own, "key": f"deliver:{theirs['batch']}", "batch": theirs["batch"]})


def test_writer_cannot_update_or_move_rows_of_another_tenant(conn):
    made = seed(conn)
    b_run = made[B]["run"].id
    as_role(conn, "outbox_writer", A)
    cur = conn.execute("UPDATE outbox.runs SET model = 'hijacked' WHERE id = %s", [b_run])
    assert cur.rowcount == 0
    # nor move its own row into tenant B
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        conn.execute("UPDATE outbox.runs SET tenant_id = %s WHERE id = %s", [B, made[A]["run"].id])
    conn.rollback()
    row = conn.execute("SELECT model, tenant_id FROM outbox.runs WHERE id = %s", [b_run]).fetchone()
    assert row == ("scripted", B)


def test_writer_api_of_one_tenant_cannot_reach_another(conn):
    made = seed(conn)
    as_role(conn, "outbox_writer", A)
    with pytest.raises(OutboxError, match="does not exist"):
        writer.get_run(conn, made[B]["run"].id, A)
    with pytest.raises(OutboxError, match="does not exist"):
        writer.record_tool_result(
            conn, ToolResultIn(tenant_id=A, tool_call_ref=made[B]["call"], status="ok")
        )


def test_writer_api_works_with_writer_rights_only(conn):
    add_tool(conn, "approve", executor="client", endpoint=None)
    conn.commit()
    as_role(conn, "outbox_writer")
    run = new_run(conn, tenant=A, tools=["approve"])
    rec = writer.record_model_turn(conn, turn(run, 1, ("c1", "approve", {"order_id": "7"})))
    assert rec.run_status == "requires_action"
    stored = writer.record_tool_result(
        conn,
        ToolResultIn(
            tenant_id=A, tool_call_ref=rec.tool_call_refs[0], status="ok", source="client"
        ),
    )
    assert stored.outcome == "stored" and stored.batch_complete
    assert writer.get_run(conn, run.id, A)["status"] == "requires_action"
    conn.commit()
    kinds = conn.execute("SELECT kind FROM outbox.outbox ORDER BY id").fetchall()
    assert kinds == [("model_turn",), ("deliver_batch",)]


def test_writer_cannot_claim_lease_or_finish_rows(conn):
    seed(conn)
    as_role(conn, "outbox_writer", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
        conn.execute(
            RELAY_Q.claim,
            {"kinds": ["tool_call", "model_turn"], "limit": 10, "worker": "w", "lease_s": 30}
            | {"tenant_cap": 1000, "held": "{}"},
        )
    conn.rollback()
    for statement in (
        "UPDATE outbox.outbox SET status = 'leased', lease_owner = 'w', lease_expires_at = now()",
        "DELETE FROM outbox.outbox",
        "SELECT id FROM outbox.outbox FOR UPDATE SKIP LOCKED",
    ):
        as_role(conn, "outbox_writer", A)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute(statement)
        conn.rollback()


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT count(*) FROM outbox.journal",
        "UPDATE outbox.journal SET event = 'x'",
        "DELETE FROM outbox.journal",
        "TRUNCATE outbox.journal",
        "SELECT outbox.prune_journal(interval '1 day')",
    ],
)
def test_writer_cannot_read_or_change_the_journal(conn, statement):
    seed(conn)
    as_role(conn, "outbox_writer", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_writer_appends_journal_events_only_for_its_tenant(conn):
    seed(conn)
    as_role(conn, "outbox_writer", A)
    writer.journal(conn, "backend.note", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        writer.journal(conn, "backend.note", B)


def test_an_event_filed_under_another_tenants_run_stays_out_of_its_timeline(conn):
    """The journal has no foreign keys: a writer of tenant A may file an event under a
    run id of tenant B. It stays in the journal, under A, and out of B's run timeline and
    of ``outbox journal --run`` for B's run (migration 0008)."""
    made = seed(conn)
    b_run = made[B]["run"].id
    as_role(conn, "outbox_writer", A)
    writer.journal(conn, "backend.forged", A, run_id=b_run)
    conn.commit()
    timeline = [row["event"] for row in ops.show_run(conn, str(b_run))["timeline"]]
    tail = [row["event"] for row in ops.tail(conn, run=str(b_run), limit=100)]
    forged = conn.execute(
        "SELECT tenant_id FROM outbox.journal WHERE event = 'backend.forged'"
    ).fetchall()
    assert timeline and tail  # B's own events are there
    assert "backend.forged" not in timeline
    assert "backend.forged" not in tail
    assert forged == [(A,)]


def test_relay_sees_and_claims_every_tenant(conn):
    seed(conn)
    as_role(conn, "outbox_relay")
    assert tenants_seen(conn, "runs") == {A, B}
    claimed = conn.execute(
        RELAY_Q.claim,
        {"kinds": ["tool_call"], "limit": 10, "worker": "w1", "lease_s": 30}
        | {"tenant_cap": 1000, "held": "{}"},
    ).fetchall()
    assert len(claimed) == 2
    # and completes: done rows leave the hot table
    ids = [r[0] for r in claimed]
    for outbox_id in ids:
        done = conn.execute(
            RELAY_Q.finish, {"id": outbox_id, "worker": "w1", "attempt": 1}
        ).fetchone()
        assert done == (outbox_id,)
    assert conn.execute(
        "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'"
    ).fetchone() == (0,)


def test_the_trace_exporter_takes_every_tenants_ended_runs_once_as_the_relay(conn):
    """The trace exporter runs under the relay's login: it takes every tenant's ended runs
    and reads their span events through run_span_events_v1, never the journal itself."""
    made = seed(conn)
    for tenant in (A, B):
        as_role(conn, "outbox_writer", tenant)
        conn.execute(
            "SELECT outbox.cancel_run_v1(%s, %s, %s)",
            [tenant, made[tenant]["run"].id, f"ops-{tenant}"],
        )
        conn.commit()
    as_role(conn, "outbox_relay")  # as the relay's login is: it may not read the journal
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT count(*) FROM outbox.journal")
    conn.rollback()
    as_role(conn, "outbox_relay")
    events = conn.execute(
        "SELECT run_id, event FROM outbox.run_span_events_v1(%s, '-infinity')",
        [[made[A]["run"].id, made[B]["run"].id]],
    ).fetchall()
    assert {(r, e) for r, e in events} == {
        (made[A]["run"].id, "run.created"),
        (made[B]["run"].id, "run.created"),
    }
    spans = InMemorySpanExporter()
    assert trace_export.export_due(conn, [spans]).runs == 2
    conn.commit()
    agents = {s.attributes["outbox.run.id"]: s for s in spans.get_finished_spans()}
    assert set(agents) == {str(made[A]["run"].id), str(made[B]["run"].id)}
    assert {
        s.attributes["outbox.tenant.id"]: s.attributes["outbox.run.ended_by"]
        for s in agents.values()
    } == {A: f"ops-{A}", B: f"ops-{B}"}
    as_role(conn, "outbox_relay")
    assert trace_export.export_due(conn, [spans]).runs == 0


def test_relay_cannot_change_the_journal(conn):
    seed(conn)
    as_role(conn, "outbox_relay")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM outbox.journal")


def test_auditor_reads_journal_and_views_of_every_tenant(conn):
    seed(conn)
    as_role(conn, "outbox_auditor")
    assert tenants_seen(conn, "journal") == {A, B}
    lag = conn.execute("SELECT tenant_id, kind, due FROM outbox.queue_lag ORDER BY 1, 2").fetchall()
    # nobody ran the relay: each tenant has its first model turn and its tool call due
    assert lag == [
        (A, "model_turn", 1),
        (A, "tool_call", 1),
        (B, "model_turn", 1),
        (B, "tool_call", 1),
    ]
    events = conn.execute("SELECT count(DISTINCT run_id) FROM outbox.run_timeline").fetchone()
    assert events == (2,)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT count(*) FROM outbox.runs",
        "INSERT INTO outbox.journal (tenant_id, event) VALUES ('tenant-a', 'x')",
        "INSERT INTO outbox.threads (tenant_id) VALUES ('tenant-a')",
        "UPDATE outbox.outbox SET status = 'quarantined'",
        "DELETE FROM outbox.outbox",
        "DELETE FROM outbox.journal",
        "UPDATE outbox.tools SET enabled = false",
        "SELECT outbox.prune_journal(interval '1 day')",
    ],
)
def test_auditor_cannot_write_anything(conn, statement):
    seed(conn)
    as_role(conn, "outbox_auditor")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_prune_as_non_owner_is_refused_with_a_hint(conn):
    as_role(conn, "outbox_auditor")
    with pytest.raises(OutboxError, match="refused") as err:
        ops.prune(conn, ops.parse_age("1d"), actor="mallory")
    assert "owns the outbox schema" in err.value.hint


def _as_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def test_a_non_superuser_owner_migrates_and_keeps_working(server_url):
    """FORCE ROW LEVEL SECURITY must not lock out the (non-superuser) owner of the tables."""
    suffix = uuid.uuid4().hex[:10]
    # Not named outbox_*: the tests that list the schema's roles by that prefix may run on
    # the same server at the same time.
    owner, database = f"schema_owner_{suffix}", f"outbox_own_{suffix}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {owner} LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")
        admin.execute(f"CREATE DATABASE {database} OWNER {owner}")
    try:
        url = _as_user(db.with_database(server_url, database), owner, "pw")
        migrate.upgrade(url, schema="outbox")
        with psycopg.connect(url) as conn:
            seed(conn)  # no tenant scope: the owner writes for both tenants
            assert tenants_seen(conn, "runs") == {A, B}
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute("DELETE FROM outbox.journal")
            conn.rollback()
            assert ops.prune(conn, ops.parse_age("1d"), actor="owner") == 0
            conn.commit()
        migrate.downgrade(url, "base", schema="outbox")
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            admin.execute(f"DROP ROLE IF EXISTS {owner}")


def test_the_api_role_reads_its_tenants_journal_and_registers_only_its_own_tools(conn):
    seed(conn)
    as_role(conn, "outbox_api", A)
    assert tenants_seen(conn, "journal") == {A}
    assert tenants_seen(conn, "runs") == {A}
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM outbox.api_keys")  # keys are the owner's only
    conn.rollback()
    as_role(conn, "outbox_api", A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # row-level security's check
        registry.register(conn, registry.ToolSpec(name="shared", executor="client"))
    conn.rollback()
    as_role(conn, "outbox_api", A)
    registry.register(conn, registry.ToolSpec(name="mine", tenant_id=A, executor="client"))
