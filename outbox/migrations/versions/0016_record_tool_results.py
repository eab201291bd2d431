"""One function records tool results; run status sets and dedup keys defined once.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24

"Store the result, count the batch down, enqueue its delivery once, journal it" was written
three times: ``writer.record_tool_result``, the relay's ``store_results`` and
``enqueue_deliveries``, and ``submit_tool_outputs_v1``. ``record_tool_results_v1`` is now
that rule, set-based (a JSON array of results, so the relay keeps one call per completion
transaction), and every path calls it. The run status sets and the outbox's dedup-key
formats become SQL functions (``run_active_v1``, ``run_ended_v1``, ``deliver_key_v1``,
``tool_call_key_v1``, ``model_turn_key_v1``; inlined by the planner), used by
``start_run_v1``, ``end_run_v1``, ``cancel_run_v1``, ``submit_tool_outputs_v1`` and
``stuck_runs``; ``outbox/constants.py`` is their Python twin.

The SQL is ``0016_record_tool_results.sql`` beside this file, frozen. The downgrade runs
again the frozen SQL of the revisions that last defined what 0016 replaced, oldest first
(0010: start_run_v1, end_run_v1, cancel_run_v1 and the functions around them; 0014:
stuck_runs; 0015: submit_tool_outputs_v1), then drops the new functions.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0016_record_tool_results.sql")

# Every statement of these files is CREATE OR REPLACE (or a grant): run again in order, they
# restore the definitions 0016 replaced, and nothing else changes.
BEFORE_0016 = [
    frozen_sql(__file__, "0010_sql_api.sql"),
    frozen_sql(__file__, "0014_parked_runs_and_journal_guard.sql"),
    frozen_sql(__file__, "0015_outputs_need_a_tenant_scope.sql"),
]

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
    for sql in BEFORE_0016:
        run_sql(sql)
    run_sql(DOWNGRADE)
