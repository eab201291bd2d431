"""What a model can take, the prompt budgets of runs, and the summaries that keep them in it.

Revision ID: 0053
Revises: 0052
Create Date: 2026-12-07

``model_catalogue``: each model's context window and most output tokens. ``run_defaults``
and ``tenant_budgets`` gain ``max_prompt_tokens``, the platform's and a tenant's prompt
budget for runs that name none. ``compactions``: the summary of a thread's oldest messages
that the model sees in their place, one per (run, step), the stored messages unchanged.
The SQL is ``0053_context_compaction.sql`` beside this file, frozen;
``0053_context_compaction_down.sql`` drops all of it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0053_context_compaction.sql")
DOWN = frozen_sql(__file__, "0053_context_compaction_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
