"""The trace context a run continues, stored with the run; ``start_run_v2`` takes it.

Revision ID: 0033
Revises: 0030
Create Date: 2026-11-27

``runs.traceparent`` and ``runs.tracestate`` hold the W3C trace context current when a
backend started the run, so every span of the run, whichever relay records it, joins that
trace (``outbox.tracing``). ``start_run_v2`` is ``start_run_v1`` with ``p_traceparent`` and
``p_tracestate``; ``start_run_v1`` now calls it without them. The SQL is
``0033_run_trace_context.sql`` beside this file, frozen. The downgrade makes
``start_run_v1`` again as 0030 made it, then drops what 0033 added.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0033_run_trace_context.sql")


def _start_run_v1_of_0030() -> str:
    text = frozen_sql(__file__, "0030_run_defaults_and_one_rule_each.sql")
    first = text.index('-- start_run_v1: "start a run')
    return text[first : text.index("-- decide_approval_v1:", first)]


DOWNGRADE = """
DROP FUNCTION {s}.start_run_v2(text, uuid, text, text, text[], text, text, text, text, integer,
                               bigint, integer, double precision, text, numeric, text, text);
ALTER TABLE {s}.runs DROP COLUMN tracestate, DROP COLUMN traceparent;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_start_run_v1_of_0030())  # before start_run_v2 goes: it calls it until then
    run_sql(DOWNGRADE)
