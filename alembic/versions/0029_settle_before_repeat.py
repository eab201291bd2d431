"""No lookup and no resend while an abandoned request may still take effect at the tool.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-27

``tool_calls.dispatched_at`` keeps when an attempt may have reached the tool and
``tools.settle_s`` how long after its timeout a request may still act there; the relay waits
until ``dispatched_at + timeout_s + settle_s`` before a lookup or a resend (docs/relay.md).
``tools_lookup_has_endpoint`` now holds for every executor, not only http. The SQL is
``0029_settle_before_repeat.sql`` beside this file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0029_settle_before_repeat.sql")

DOWNGRADE = """
ALTER TABLE {s}.tools DROP CONSTRAINT tools_lookup_has_endpoint;
ALTER TABLE {s}.tools ADD CONSTRAINT tools_lookup_has_endpoint
    CHECK (executor <> 'http' OR idempotency_mode <> 'lookup' OR lookup_endpoint IS NOT NULL);
ALTER TABLE {s}.tool_calls DROP COLUMN dispatched_at;
ALTER TABLE {s}.tools DROP COLUMN settle_s;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
