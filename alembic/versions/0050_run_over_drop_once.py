"""A leased row whose run is over is dropped by one function, drop_if_run_over_v1.

Revision ID: 0050
Revises: 0049
Create Date: 2026-12-07

The relay's ``retry_later`` and ``quarantine`` each carried the same statements: a row
whose run is over (``run_over_v1``) leaves the queue instead of going back or being
parked, its call keeps the attempt and says why, and the drop is journaled.
``drop_if_run_over_v1`` holds them once and both call it; ``outbox_relay`` may execute
it. The SQL is ``0050_run_over_drop_once.sql`` beside this file, frozen. The downgrade
drops the function (the relay's statements of 0049 do not call it).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0050_run_over_drop_once.sql")
DOWNGRADE = "DROP FUNCTION {s}.drop_if_run_over_v1(bigint, text, integer, text, text, text);"


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
