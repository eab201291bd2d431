"""A lease holder is always a lease: the relay's fences may test the holder alone.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

The fences (``finish``, ``finish_many``, ``retry_later``, ``quarantine``) test
``lease_owner = me AND attempts = my attempt``, not ``status = 'leased'``: a status test
lets the planner walk the lease index, whose statistics see it nearly empty, instead of
the primary key (docs/relay.md, Plans). ``outbox_lease_consistent`` says a leased row has
an owner and an expiry; this constraint adds that one never comes without the other, so
together an owner means ``status = 'leased'``, by the database rather than by the code
that writes the columns (every writer already clears both at once).
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_lease_holder_is_leased
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL));
"""

DOWNGRADE = """
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_lease_holder_is_leased;
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
