"""The ``invoke_agent`` span of a run cancelled by its backend or an operator.

Revision ID: 0037
Revises: 0036
Create Date: 2026-11-27

``runs.agent_span_due`` marks a run ``cancel_run_v1`` ended, until a relay's sweep takes it
and records the run's ``invoke_agent`` span (``relay.spans.run_cancelled``): the cancel
happens in the canceller's transaction, not in a relay. ``runs.cancelled_by`` keeps who
cancelled it, for the span. The SQL is
``0037_cancelled_run_spans.sql`` beside this file, frozen. The downgrade makes
``cancel_run_v1`` again as 0021 made it, then drops the columns and the index.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0037_cancelled_run_spans.sql")

DOWNGRADE = """
DROP INDEX {s}.runs_agent_span_due;
ALTER TABLE {s}.runs DROP COLUMN cancelled_by, DROP COLUMN agent_span_due;
"""


def _cancel_run_v1_of_0021() -> str:
    text = frozen_sql(__file__, "0021_record_tool_results.sql")
    first = text.index('-- cancel_run_v1: "stop this run".')
    return text[first : text.index("-- decide_approval_v1:", first)]


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_cancel_run_v1_of_0021())  # before the column goes: the new one sets it
    run_sql(DOWNGRADE)
