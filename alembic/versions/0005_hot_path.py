"""The relay's hot path: HOT updates of tool calls.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22

Every tool result updates its call's ``status``. A column that any index mentions, even in
a partial index's predicate, makes that update non-HOT: a new entry in each of the table's
seven indexes per result. ``tool_calls_status`` (parked calls) served no query: parked
calls are found through their quarantined outbox rows, and ``tool_stats`` scans by time.
Without it, the status update can stay on the row's page and write no index entry, if the
page has room for the new version. The calls of a batch share pages and are completed in
one transaction, so each page keeps half its space free (fillfactor 50): the table takes
about twice the space of a packed one; in exchange a result costs about 20 us less
(store_results: 65 -> 45 us a row). Measured in docs/benchmarks.md.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = """
DROP INDEX {s}.tool_calls_status;
ALTER TABLE {s}.tool_calls SET (fillfactor = 50);
"""

DOWNGRADE = """
ALTER TABLE {s}.tool_calls RESET (fillfactor);
CREATE INDEX tool_calls_status ON {s}.tool_calls (status)
    WHERE status IN ('outcome_unknown', 'quarantined');
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
