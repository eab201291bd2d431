"""One function records tool results; run status sets and dedup keys defined once.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-24

"Store the result, count the batch down, enqueue its delivery once, journal it" was written
three times: ``writer.record_tool_result``, the relay's ``store_results`` and
``enqueue_deliveries``, and ``submit_tool_outputs_v1``. ``record_tool_results_v1`` is now
that rule, set-based (a JSON array of results, so the relay keeps one call per completion
transaction), and every path calls it. The run status sets and the outbox's dedup-key
formats become SQL functions (``run_active_v1``, ``run_ended_v1``, ``deliver_key_v1``,
``tool_call_key_v1``, ``model_turn_key_v1``; inlined by the planner), used by
``start_run_v1``, ``end_run_v1``, ``cancel_run_v1``, ``submit_tool_outputs_v1``,
``decide_approval_v1`` and ``stuck_runs``; ``outbox/constants.py`` is their Python twin.

The SQL is ``0021_record_tool_results.sql`` beside this file, frozen. The downgrade runs
again what the revisions that last defined each replaced object made, cut from their frozen
SQL (0010: cancel_run_v1; 0014: stuck_runs and the journal's functions; 0016: end_run_v1;
0017: start_run_v1; 0018: submit_tool_outputs_v1 and decide_approval_v1), then drops the
new functions. (Written as 0016 on a branch and renumbered when merged after 0016-0020.)
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0021_record_tool_results.sql")


def _cut(name: str, start: str, end: str | None = None) -> str:
    text = frozen_sql(__file__, name)
    first = text.index(start)
    return text[first:] if end is None else text[first : text.index(end, first)]


def _before_0021() -> list[str]:
    """What 0021 replaced, as the revisions that last defined it made it. Every statement
    is CREATE OR REPLACE or a grant, so running them again changes nothing else."""
    return [
        _cut("0010_sql_api.sql", '-- cancel_run_v1: "stop this run".',
             "\nREVOKE ALL ON FUNCTION {s}.enter_tenant_v1(text)"),
        frozen_sql(__file__, "0014_parked_runs_and_journal_guard.sql"),
        _cut("0016_action_layer.sql", "-- A call waiting for approval is closed"),
        _cut("0017_run_pins_and_money_budgets.sql", '-- start_run_v1: "start a run'),
        _cut("0018_tenant_login_roles.sql", "-- submit_tool_outputs_v1:", "-- enter_tenant_v1:"),
        _cut("0018_tenant_login_roles.sql", "-- decide_approval_v1:"),
    ]  # fmt: skip


DOWNGRADE = """
DROP FUNCTION {s}.record_tool_results_v1(jsonb, text);
DROP FUNCTION {s}.model_turn_key_v1(uuid, integer);
DROP FUNCTION {s}.tool_call_key_v1(bigint);
DROP FUNCTION {s}.deliver_key_v1(bigint);
DROP FUNCTION {s}.run_ended_v1(text);
DROP FUNCTION {s}.run_active_v1(text);
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    for sql in _before_0021():
        run_sql(sql)
    run_sql(DOWNGRADE)
