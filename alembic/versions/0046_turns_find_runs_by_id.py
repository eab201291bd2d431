"""``record_model_turns_v1`` reads only the batch's runs, whatever ``runs`` held at planning.

Revision ID: 0046
Revises: 0045
Create Date: 2026-11-28

The relay keeps one generic plan per statement of the function, made on the connection's
first calls: on a fresh deployment ``runs`` is then nearly empty, and the joins of the
batch's turns to ``runs`` on their run ids were planned as hash joins reading the whole
table, on every call for the life of the plan. The joins to ``runs`` now also say
``r.id = ANY(v_run_ids)``, so the runs are read by primary key, the batch's only, and the
repeat check's NOT EXISTS stays a per-turn probe of ``model_turns`` (OFFSET 0); the last
SELECT keeps its plain join (bounded, its plan read more). The SQL is
``0046_turns_find_runs_by_id.sql`` beside this file, frozen; the downgrade makes the
function again as 0045 left it (``0046_turns_find_runs_by_id_down.sql``).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0046_turns_find_runs_by_id.sql")
DOWN = frozen_sql(__file__, "0046_turns_find_runs_by_id_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
