"""The comments inside three function bodies say what holds, without migration numbers.

Revision ID: 0051
Revises: 0050
Create Date: 2026-12-07

A function's body is stored with its comments, so ``sql/`` can only say what its bodies
say. ``submit_tool_outputs_v1``, ``retain_v1`` and ``erase_thread_v1`` are created again
with the same code and comments that name no migration. The SQL is
``0051_function_comments.sql`` beside this file, frozen; the downgrade creates them again
as 0050 left them (``0051_function_comments_down.sql``).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0051_function_comments.sql")
DOWN = frozen_sql(__file__, "0051_function_comments_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
