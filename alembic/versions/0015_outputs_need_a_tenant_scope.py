"""submit_tool_outputs_v1 refuses an unscoped session.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24

The function runs as the schema owner, so row-level security does not apply inside; it
checked the caller's tenant scope only when one was set, and an ``outbox_writer`` session
with none submitted outputs into another tenant's run. It now acts only for the tenant the
transaction is scoped to (``enter_tenant_v1``, or the Python writer API, which scopes
first). The SQL is ``0015_outputs_need_a_tenant_scope.sql`` beside this file, frozen; the
downgrade runs 0009's frozen SQL again, which created the definition it replaces.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0015_outputs_need_a_tenant_scope.sql")

# What 0015 replaces is what 0009 created (0010-0014 left the function alone): the
# downgrade runs 0009's frozen text again rather than keep a second copy of it.
SUBMIT_BEFORE_0015 = frozen_sql(__file__, "0009_outputs_deadline_at_submission.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(SUBMIT_BEFORE_0015)
