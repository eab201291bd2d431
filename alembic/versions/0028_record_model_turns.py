"""record_model_turns_v1: many model turns recorded by a fixed few statements.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-26

The relay's completers record every model turn of a transaction together; the function
they called did it one turn at a time, about a dozen statements a turn, and each statement's
fixed costs (executor start, CHECK constraints parsed again, triggers) were most of what
PostgreSQL spent on runs in flight. ``record_model_turns_v1`` writes each table once for all
the turns; ``record_model_turn_v1`` becomes that function for one turn. The SQL is
``0028_record_model_turns.sql`` beside this file, frozen. The downgrade makes
``record_model_turn_v1`` again as 0027 made it, then drops the new function.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0028_record_model_turns.sql")

DOWNGRADE = """
DROP FUNCTION {s}.record_model_turns_v1(jsonb, jsonb);
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(frozen_sql(__file__, "0027_record_model_turn.sql"))
    run_sql(DOWNGRADE)
