"""Budgets in money, the platform's step ceiling and cycles of tool calls.

Through the writer API on a real database: each turn is priced by its model's price when it
is recorded, counted against its run and its tenant, and checked before the next turn.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from click.testing import CliRunner

import cli
from outbox import budgets, writer
from outbox.errors import BudgetExceeded, InvalidInput
from outbox.schemas import ModelTurnIn, ToolCallIn, ToolResultIn
from tests.helpers import TENANT, add_tool, new_run

MODEL = "scripted"  # tests.helpers.new_run's model


def priced_turn(run: writer.RunRef, step: int, args: dict | None = None, **usage: int):
    calls = []
    if args is not None:
        calls = [
            ToolCallIn(tool_call_id=f"c{step}", name="lookup_order", arguments=json.dumps(args))
        ]
    return ModelTurnIn(
        tenant_id=run.tenant_id, run_id=run.id, step_no=step, tool_calls=calls, **usage
    )


def answer_and_deliver(conn, record: writer.TurnRecord) -> str:
    for ref in record.tool_call_refs:
        writer.record_tool_result(
            conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output={})
        )
    assert record.batch_id is not None
    return writer.deliver_batch(conn, record.batch_id).run_status


def test_a_turn_is_priced_with_cached_input_at_its_own_price(conn):
    budgets.set_price(
        conn, MODEL, input_per_mtok="2", cached_input_per_mtok="1", output_per_mtok="10"
    )
    run = new_run(conn)
    writer.record_model_turn(
        conn, priced_turn(run, 1, input_tokens=1000, cached_tokens=400, output_tokens=100)
    )
    cost = conn.execute("SELECT cost FROM outbox.model_turns").fetchone()[0]
    assert cost == Decimal("0.0026")  # (600 * 2 + 400 * 1 + 100 * 10) / 1e6
    assert writer.get_run(conn, run.id)["cost"] == Decimal("0.0026")


def test_a_run_that_spent_its_money_budget_fails_before_its_next_turn(conn):
    add_tool(conn)
    budgets.set_price(conn, MODEL, input_per_mtok="1000", output_per_mtok="1000")
    run = new_run(conn, tools=["lookup_order"], max_cost=Decimal("0.05"))
    first = writer.record_model_turn(
        conn, priced_turn(run, 1, {"order_id": "1"}, input_tokens=20, output_tokens=10)
    )
    assert answer_and_deliver(conn, first) == "in_progress"  # 0.03 of 0.05 spent
    second = writer.record_model_turn(
        conn, priced_turn(run, 2, {"order_id": "2"}, input_tokens=20, output_tokens=10)
    )
    assert answer_and_deliver(conn, second) == "failed"
    ended = writer.get_run(conn, run.id)
    assert ended["failure_reason"] == "budget"
    assert "spent 0.06" in ended["last_error"] and "0.05" in ended["last_error"]


def test_a_tenant_money_budget_stops_its_runs_and_refuses_new_ones(conn):
    add_tool(conn)
    budgets.set_price(conn, MODEL, input_per_mtok="1000", output_per_mtok="0")
    writer.set_tenant_budget(conn, TENANT, None, Decimal("0.01"))
    run = new_run(conn, tools=["lookup_order"])
    first = writer.record_model_turn(conn, priced_turn(run, 1, {"order_id": "1"}, input_tokens=10))
    assert answer_and_deliver(conn, first) == "failed"
    assert "tenant 'acme' spent 0.01" in writer.get_run(conn, run.id)["last_error"]
    with pytest.raises(BudgetExceeded, match=r"0\.01"):
        new_run(conn)
    assert new_run(conn, tenant="other").created


def test_money_is_said_as_priced_and_budgets_as_set(conn):
    """A turn's cost is a quotient PostgreSQL keeps with twenty decimals: a stop read
    "spent 0.60000000000000000000, its budget is 0.5"."""
    add_tool(conn)
    budgets.set_price(conn, MODEL, input_per_mtok="2.50", output_per_mtok="0")
    writer.set_tenant_budget(conn, TENANT, None, Decimal("0.5"))
    run = new_run(conn, tools=["lookup_order"], max_cost=Decimal("0.50"))
    first = writer.record_model_turn(
        conn, priced_turn(run, 1, {"order_id": "1"}, input_tokens=240_000)
    )
    assert answer_and_deliver(conn, first) == "failed"
    assert writer.get_run(conn, run.id)["last_error"] == "the run spent 0.6, its budget is 0.50"
    assert writer.tenant_budget_spent(conn, TENANT) == "tenant 'acme' spent 0.6, its budget is 0.5"
    with pytest.raises(BudgetExceeded) as refused:
        new_run(conn)
    assert refused.value.args[0] == (
        "tenant 'acme' used 240000 tokens and 0.6 in money; its budget is no limit on tokens "
        "and 0.5 in money"
    )


def test_a_money_budget_needs_the_models_price(conn):
    with pytest.raises(InvalidInput, match="needs the price of model 'scripted'"):
        new_run(conn, max_cost=Decimal("1"))
    with pytest.raises(InvalidInput):
        writer.set_tenant_budget(conn, TENANT, None, None)
    with pytest.raises(InvalidInput, match="finite"):
        budgets.set_price(conn, MODEL, input_per_mtok="NaN", output_per_mtok="1")


def test_the_platform_step_ceiling_holds_runs_that_asked_for_more(conn):
    add_tool(conn)
    budgets.set_platform_limits(conn, max_steps=2, actor="ops")
    run = new_run(conn, tools=["lookup_order"], max_steps=50)
    first = writer.record_model_turn(conn, priced_turn(run, 1, {"order_id": "1"}))
    assert answer_and_deliver(conn, first) == "in_progress"
    second = writer.record_model_turn(conn, priced_turn(run, 2, {"order_id": "2"}))
    assert answer_and_deliver(conn, second) == "failed"
    ended = writer.get_run(conn, run.id)
    assert ended["failure_reason"] == "step_cap"
    assert "platform's step ceiling of 2" in ended["last_error"]


def test_a_cycle_of_two_turns_is_a_loop(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"], loop_limit=2)
    status = "in_progress"
    for step, order in enumerate(["a", "b", "a", "b"], start=1):
        record = writer.record_model_turn(conn, priced_turn(run, step, {"order_id": order}))
        if record.run_status == "failed":
            status = "failed"
            break
        assert step < 4, "A, B, A, B was not caught"
        answer_and_deliver(conn, record)
    assert status == "failed" and step == 4
    ended = writer.get_run(conn, run.id)
    assert ended["failure_reason"] == "loop"
    assert "cycle of 2 turns" in ended["last_error"]


@pytest.mark.parametrize(
    ("turns", "repeats", "period"),
    [
        (["a", "a", "a"], 3, 1),
        (["a", "a"], 3, None),
        (["b", "a", "b", "a"], 2, 2),
        (["b", "a", "b", "c"], 2, None),
        (["c", "b", "a", "c", "b", "a"], 2, 3),
        (["a", "b", "a", "b", "a", "b"], 3, 2),
        (["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"], 2, None),  # longer than we look
    ],
)
def test_loop_period(turns, repeats, period):
    assert writer.loop_period([(t,) for t in turns], repeats) == period


def test_cli_prices_platform_and_money_budgets(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)

    def outbox(*args: str, code: int = 0) -> str:
        done = CliRunner().invoke(cli.main, list(args))
        assert done.exit_code == code, done.output
        return done.output

    assert "priced gpt-x" in outbox("prices", "set", "gpt-x", "--input", "1.25", "--output", "10")
    assert "1.25" in outbox("prices", "list")
    assert "must be a number" in outbox("prices", "set", "m", "--input", "x", "--output", "1",
                                        code=2)  # fmt: skip
    assert "max_steps 40" in outbox("platform", "limit", "--max-steps", "40")
    assert "max_steps 40" in outbox("platform", "limit")
    assert "max_steps none" in outbox("platform", "limit", "--max-steps", "none")
    shown = outbox("tenants", "budget", "acme", "--max-cost", "25")
    assert "unlimited tokens" in shown and "25 in money" in shown
    assert "needs a limit" in outbox("tenants", "budget", "acme", code=2)
