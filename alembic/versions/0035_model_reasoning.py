"""The reasoning items of a model's own answer, kept with its turn.

Revision ID: 0035
Revises: 0031
Create Date: 2026-11-27

``record_model_turns_v1`` writes a turn's ``reasoning`` (the reasoning items of a Responses
API answer, verbatim) onto its assistant message, ``messages.reasoning``, which the relay
gives back to the model in place on the next turn. The SQL is ``0035_model_reasoning.sql``
beside this file, frozen. The downgrade makes the function again as 0028 made it, with
the rights 0030 left it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0035_model_reasoning.sql")

DOWNGRADE = """
REVOKE EXECUTE ON FUNCTION {s}.record_model_turns_v1(jsonb, jsonb),
                           {s}.record_model_turn_v1(jsonb, jsonb)
    FROM outbox_api;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(frozen_sql(__file__, "0028_record_model_turns.sql"))
    run_sql(DOWNGRADE)
