"""SQL functions for backends without Python: submit_tool_outputs_v1.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

The function is ``0003_functions.sql`` beside this file, frozen (with the lock-order fix
and the status returned on a repeat that were folded into this revision before any
release: every database at 0003 has this text). ``outbox/sql/functions.sql`` holds the
functions as they are now; the Python writer API calls the same function, so client
outputs have a single implementation. ``{s}`` is the quoted schema.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import frozen_sql, schema_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FUNCTIONS = frozen_sql(__file__, "0003_functions.sql")


def upgrade() -> None:
    op.execute(schema_sql(FUNCTIONS))


def downgrade() -> None:
    op.execute(schema_sql("DROP FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb)"))
