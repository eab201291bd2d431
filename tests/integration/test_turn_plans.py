"""record_model_turns_v1 reads the batch's runs, not all of runs, on a relay's connection.

A relay's link keeps one generic plan per statement (plan_cache_mode = force_generic_plan,
enable_seqscan = off), made on its first calls, when runs may be nearly empty: a join of
the turns to runs planned then must still read only the batch's runs once the table has
grown. auto_explain reports, through notices, the rows each statement read from runs, the
foreign-key checks of the rows the function writes among them (nested statements too)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from outbox import tenancy, writer
from tests.helpers import TENANT, add_tool, new_run, turn

GROWN_BY = 3000


def grow_runs(conn: psycopg.Connection[Any], like: Any, n: int) -> None:
    """N completed runs more of the tenant, copies of run ``like``."""
    conn.execute(
        "INSERT INTO outbox.runs SELECT (jsonb_populate_record(r, jsonb_build_object("
        "'id', gen_random_uuid(), 'status', 'completed', 'ended_at', now()))).* "
        "FROM outbox.runs r, generate_series(1, %s) WHERE r.id = %s",
        (n, like.id),
    )


def explained(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The plans of every statement the connection runs from now on, nested ones too, each
    as auto_explain reports it (with its actual rows) in a notice."""
    plans: list[dict[str, Any]] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    conn.add_notice_handler(keep)
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = json",
        "SET auto_explain.log_level = notice",
    ):
        conn.execute(setting)
    return plans


def rows_read_from(plan: dict[str, Any], table: str) -> int:
    """Rows the plan's scans of the table returned or filtered out, over all their loops."""
    own = 0
    if plan.get("Relation Name") == table:
        per_loop = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        own = int(per_loop * plan.get("Actual Loops", 1))
    return own + sum(rows_read_from(child, table) for child in plan.get("Plans", []))


# Runs in the table when the plans are made: a few; and a few hundred, where the generic
# plan of the foreign-key check of model_turns (SELECT 1 FROM ONLY runs x WHERE id = $1 AND
# tenant_id = $2 FOR KEY SHARE) found the tenant's index as cheap as the id's, took it
# (before 0047), and then read every run of the tenant on each check.
@pytest.mark.parametrize("planned_on", [0, 300])
def test_turns_planned_on_few_runs_read_only_their_runs_once_runs_grew(db_url, planned_on):
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        # An autovacuum ANALYZE in the middle would replan the statements on the grown table.
        conn.execute("ALTER TABLE outbox.runs SET (autovacuum_enabled = off)")
        runs = [new_run(conn, tools=["lookup_order"]) for _ in range(6)]
        if planned_on:
            grow_runs(conn, runs[0], planned_on)
        conn.commit()
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET enable_seqscan = off")
        for batch in (runs[0:2], runs[2:4]):
            writer.record_model_turns(
                conn,
                [
                    turn(r, 1, (f"c{i}", "lookup_order", {"order_id": "1"}))
                    for i, r in enumerate(batch)
                ],
            )
            conn.commit()

        grow_runs(conn, runs[0], GROWN_BY)
        conn.commit()

        plans = explained(conn)
        batch = runs[4:6]
        records = writer.record_model_turns(
            conn,
            [turn(r, 1, (f"d{i}", "lookup_order", {"order_id": "2"})) for i, r in enumerate(batch)],
        )
        conn.commit()

    assert [r.created for r in records] == [True, True]
    read = [rows_read_from(p, "runs") for p in plans]
    # The statements of the function, each read from runs, are nested in the caller's one.
    assert len([n for n in read if n]) > 3
    assert max(read) < 10 * len(batch), read


def grow_active_runs(conn: psycopg.Connection[Any], like: Any, n: int) -> None:
    """N active runs more of the tenant, each on a thread of its own: copies of run ``like``."""
    conn.execute(
        "WITH t AS (INSERT INTO outbox.threads (tenant_id) SELECT %s FROM generate_series(1, %s)"
        " RETURNING id) INSERT INTO outbox.runs SELECT (jsonb_populate_record(r,"
        " jsonb_build_object('id', gen_random_uuid(), 'thread_id', t.id))).*"
        " FROM outbox.runs r, t WHERE r.id = %s",
        (like.tenant_id, n, like.id),
    )


def as_api(conn: psycopg.Connection[Any]) -> None:
    """This transaction as the server's role, bound to the tenant (row-level security)."""
    conn.execute("SET LOCAL ROLE outbox_api")
    tenancy.scope(conn, TENANT)


# start_run_v2's look for the thread's active run: the server's connections keep its generic
# plan (PL/pgSQL, from the sixth call on). Planned among a few hundred active runs, the
# tenant's index (tenant_id, status) cost the same as the thread's, and the plan that took
# it read every active run of the tenant on each start (before 0047).
@pytest.mark.parametrize("planned_on", [0, 300])
def test_a_start_planned_on_few_runs_reads_only_its_thread_once_runs_grew(db_url, planned_on):
    with psycopg.connect(db_url) as conn:
        conn.execute("ALTER TABLE outbox.runs SET (autovacuum_enabled = off)")
        first = new_run(conn)
        if planned_on:
            grow_active_runs(conn, first, planned_on)
        conn.commit()
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for _ in range(2):
            as_api(conn)
            new_run(conn)
            conn.commit()

        grow_active_runs(conn, first, GROWN_BY)
        conn.commit()

        plans = explained(conn)
        conn.commit()
        as_api(conn)
        run = new_run(conn)
        conn.commit()

    assert run.created
    read = [rows_read_from(p, "runs") for p in plans]
    assert max(read) < 20, read


def test_no_index_of_runs_or_tool_calls_leads_with_the_tenant_for_any_statement(conn):
    """Row-level security gives each statement of a bound session ``tenant_id = <its
    tenant>``, so an index that starts with tenant_id could serve any lookup of the table,
    and with no statistics it costs what the right one does (the tests above). Such an
    index must be partial: only a statement that states its predicate gets it (0047; the
    server's read of a response's calls ANDed every tool call of the tenant into a lookup
    by run through tool_calls_idempotency_key)."""
    leading = conn.execute(
        "SELECT i.relname FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
        " JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]"
        " WHERE t.relnamespace = 'outbox'::regnamespace AND t.relname IN ('runs', 'tool_calls')"
        " AND a.attname = 'tenant_id' AND x.indpred IS NULL"
    ).fetchall()
    assert leading == []


def test_a_listing_of_a_tenants_runs_by_status_that_states_the_predicate_uses_the_index(conn):
    """runs_tenant_status serves the statements that say ``created_at > '-infinity'``, as
    the query docs/operations.md gives DBAs does (and ops.sql's list_runs); without the
    predicate PostgreSQL cannot use the index for it."""
    run = new_run(conn)
    grow_runs(conn, run, GROWN_BY)
    conn.execute("ANALYZE outbox.runs")
    plan = conn.execute(
        "EXPLAIN (FORMAT JSON) SELECT id, status, created_at FROM outbox.runs"
        " WHERE tenant_id = %s AND status = 'failed' AND created_at > '-infinity'"
        " ORDER BY created_at DESC LIMIT 50",
        [TENANT],
    ).fetchone()
    assert plan is not None
    assert '"Index Name": "runs_tenant_status"' in json.dumps(plan[0])
