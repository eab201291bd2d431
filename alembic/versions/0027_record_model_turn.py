"""record_model_turn_v1: a model turn recorded in one round trip instead of about twenty.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-25

The writer plans each call (its tool, JSON Schema, risk policy) and passes the plans;
the function writes the message, the turn, the batch, the intents, their journal events
and outbox rows, and the run's new status. The SQL is ``0027_record_model_turn.sql``
beside this file, frozen. The downgrade drops the function.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0027_record_model_turn.sql")

DOWNGRADE = """
DROP FUNCTION {s}.record_model_turn_v1(jsonb, jsonb);
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
