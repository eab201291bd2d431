"""SQL functions for backends without Python: submit_tool_outputs_v1.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

The function's one definition is ``sql/functions.sql`` (the Python writer API calls it
too, so client outputs have a single implementation). ``{s}`` is the quoted schema.
"""

from __future__ import annotations

from pathlib import Path

from alembic import op
from outbox.migrate import schema_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FUNCTIONS_FILE = Path(__file__).resolve().parents[2] / "sql" / "functions.sql"


def upgrade() -> None:
    op.execute(schema_sql(FUNCTIONS_FILE.read_text()))


def downgrade() -> None:
    op.execute(schema_sql("DROP FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb)"))
