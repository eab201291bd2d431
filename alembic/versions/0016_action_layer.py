"""The action layer: risk policies, approvals, kill switches that act, paused tenants.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24

``risk_policies`` says per tenant (default ``'*'``) and risk tier whether a call runs,
waits for approval or is denied; ``tools.requires_approval`` asks for approval whatever
the tier. ``approvals`` holds a waiting call, bound to the digest of its arguments and
decided once by ``decide_approval_v1`` (or denied at its deadline by the relay); the call's
outbox row waits with ``available_at = 'infinity'`` until then. ``tool_switches`` turns a
tool off for a tenant or for all; ``tenant_pauses`` holds a tenant's runs between steps.
``end_run_v1`` closes a call waiting for approval like a pending one.
The SQL is ``0016_action_layer.sql`` beside this file, frozen (docs/actions.md).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0016_action_layer.sql")


def _end_run_of_0010() -> str:
    """``end_run_v1`` as 0010 created it (0011-0015 left it alone), cut from 0010's frozen
    text rather than kept here a second time."""
    text = frozen_sql(__file__, "0010_sql_api.sql")
    start = text.index("-- end_run_v1: end a run")
    return text[start : text.index('-- cancel_run_v1: "stop this run".', start)]


DOWNGRADE = """
DROP FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text);
DROP TABLE {s}.approvals, {s}.tool_switches, {s}.tenant_pauses, {s}.risk_policies;
UPDATE {s}.tool_calls SET status = 'pending' WHERE status = 'awaiting_approval';
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_status_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_status_check CHECK (status IN
    ('pending', 'running', 'succeeded', 'failed', 'outcome_unknown', 'quarantined',
     'cancelled'));
ALTER TABLE {s}.tools DROP COLUMN requires_approval;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_end_run_of_0010())
    run_sql(DOWNGRADE)
