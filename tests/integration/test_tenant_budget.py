"""Per-tenant token budgets: counted on every recorded turn, checked before the next one."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import writer
from outbox.errors import BudgetExceeded
from outbox.schemas import ToolResultIn
from tests.helpers import TENANT, add_tool, new_run, turn


def test_spent_tenant_budget_fails_the_run_and_refuses_new_ones(conn):
    add_tool(conn)
    writer.set_tenant_budget(conn, TENANT, 20)
    run = new_run(conn, tools=["lookup_order"])
    record = writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"})))
    writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=record.tool_call_refs[0], status="ok")
    )
    delivery = writer.deliver_batch(conn, record.batch_id)
    assert delivery.run_status == "in_progress"  # 15 of 20 used: one more turn allowed
    writer.record_model_turn(conn, turn(run, 2, ("c2", "lookup_order", {"order_id": "2"})))
    batch = conn.execute("SELECT id FROM outbox.tool_batches WHERE step_no = 2").fetchone()[0]
    ref = conn.execute("SELECT id FROM outbox.tool_calls WHERE tool_call_id = 'c2'").fetchone()[0]
    writer.record_tool_result(conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok"))
    assert writer.deliver_batch(conn, batch).run_status == "failed"
    assert writer.get_run(conn, run.id)["failure_reason"] == "budget"
    with pytest.raises(BudgetExceeded, match="its budget is 20"):
        new_run(conn)
    # Another tenant is not affected.
    assert new_run(conn, tenant="other").created


def test_budget_rows_are_isolated_by_tenant(db_url):
    with psycopg.connect(db_url) as conn:
        writer.set_tenant_budget(conn, "a", 100)
        writer.set_tenant_budget(conn, "b", 100)
        conn.commit()
        conn.execute("SET ROLE outbox_writer")
        conn.execute("SELECT set_config('outbox.tenant_id', 'a', true)")
        rows = conn.execute("SELECT tenant_id FROM outbox.tenant_budgets").fetchall()
        assert rows == [("a",)]
        changed = conn.execute(
            "UPDATE outbox.tenant_budgets SET tokens_used = 0 WHERE tenant_id = 'b'"
        ).rowcount
        assert changed == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE outbox.tenant_budgets SET max_tokens = 1000000000")


def test_cli_sets_a_budget(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    result = CliRunner().invoke(cli.main, ["tenants", "budget", "acme", "--max-tokens", "500"])
    assert result.exit_code == 0 and "budget 500 tokens" in result.output
    bad = CliRunner().invoke(cli.main, ["tenants", "budget", "acme", "--max-tokens", "0"])
    assert bad.exit_code == 2 and "must be positive" in bad.output
