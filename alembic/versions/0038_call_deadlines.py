"""A deadline by which a call must have been sent; unsent attempts before it uncharged.

Revision ID: 0038
Revises: 0037
Create Date: 2026-11-27

``tools.deadline_s`` (and ``mcp_servers.deadline_s``, which the server's tools take): how
long after the model asked for a call an attempt of it may still be sent. With one, an
attempt that certainly never reached the tool is not charged against ``max_attempts``; the
deadline bounds those retries (docs/relay.md, "Deadlines"). The SQL is
``0038_call_deadlines.sql`` beside this file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0038_call_deadlines.sql")

DOWNGRADE = """
ALTER TABLE {s}.mcp_servers DROP COLUMN deadline_s;
ALTER TABLE {s}.tools DROP COLUMN deadline_s;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
