"""NOTIFY on every change of a run's status (channel ``outbox_runs``).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-24

A backend in any language can ``LISTEN outbox_runs`` and learn that a run was queued,
needs its tools (``requires_action``) or ended, without polling. Row triggers on ``runs``
send a small JSON payload (schema, tenant, thread, run, status, previous status) from the
transaction that changed the status, so it arrives only when that transaction commits. The
SQL is ``0023_run_notify.sql`` beside this file, frozen. The downgrade drops the triggers
and the function.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0023_run_notify.sql")

DOWNGRADE = """
DROP TRIGGER run_notify_update ON {s}.runs;
DROP TRIGGER run_notify_insert ON {s}.runs;
DROP FUNCTION {s}.run_notify();
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
