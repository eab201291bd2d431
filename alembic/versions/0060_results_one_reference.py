"""A tool result references its call, batch and run through one foreign key.

Revision ID: 0060
Revises: 0059
Create Date: 2026-12-07

Storing a result checked two foreign keys (its call; its batch and run), each a lookup
that locks the row it finds, and wrote an index entry for ``tool_results_batch``, kept only
for the batch key's checks. One foreign key now names the call with its batch and run,
``(batch_id, tool_call_ref, run_id, tenant_id)`` to ``tool_calls (batch_id, id, run_id,
tenant_id)``: a result can only name its own call's batch and run, the batch exists by the
call's own key, and the index on ``tool_results (batch_id)`` goes. ``tool_calls``' plain
index on ``batch_id`` becomes the new key's unique index (it starts with ``batch_id``). The
SQL is ``0060_results_one_reference.sql`` beside this file, frozen;
``0060_results_one_reference_down.sql`` puts the two keys and the indexes back.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0060"
down_revision = "0059"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0060_results_one_reference.sql")
DOWN = frozen_sql(__file__, "0060_results_one_reference_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
