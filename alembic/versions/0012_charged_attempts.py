"""Charged attempts apart from the fencing token: infrastructure failures cost no attempt.

Revision ID: 0012
Revises: 0010
Create Date: 2026-11-23

``outbox.attempts`` stays what it was: bumped by every claim, the fencing token every
completion write checks, never handed out twice. What counts against ``max_attempts`` is now
``failures``: attempts whose effect ran and failed by the tool's or the model's own doing (an
HTTP 5xx, a timeout, a refused request). A claim whose holder died, a lease that expired, a
row released at shutdown or put back because the database went away cost nothing there; they
count in ``lost_leases`` instead, whose own cap (the relay's ``max_lost_leases``) stops a row
that kills every relay that runs it from looping forever. Both columns get constant
defaults: no table rewrite, a brief ACCESS EXCLUSIVE lock only.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0012"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE {s}.outbox
    ADD COLUMN failures int NOT NULL DEFAULT 0 CHECK (failures >= 0),
    ADD COLUMN lost_leases int NOT NULL DEFAULT 0 CHECK (lost_leases >= 0);
COMMENT ON COLUMN {s}.outbox.attempts IS
    'claims so far: the fencing token, bumped by every claim, never reused';
COMMENT ON COLUMN {s}.outbox.failures IS
    'attempts whose effect failed by the tool or model; quarantined at max_attempts';
COMMENT ON COLUMN {s}.outbox.lost_leases IS
    'claims that ended with no outcome (holder died, lease expired); no attempt charged';
"""

DOWNGRADE = """
ALTER TABLE {s}.outbox DROP COLUMN failures, DROP COLUMN lost_leases;
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
