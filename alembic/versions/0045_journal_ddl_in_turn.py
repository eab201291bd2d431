"""The journal's DDL runs one at a time: ``prune_journal`` and ``journal_partitions_v1``.

Revision ID: 0045
Revises: 0044
Create Date: 2026-11-27

``outbox prune`` dropping a partition waited for the journal, which the relay's maintenance
held attaching the next partition; the maintenance waited for the default partition, which
the prune had read: PostgreSQL ended the prune as a deadlock. Both now take one advisory
lock (``journal_ddl_lock_v1``, per schema) before touching the journal: the prune waits
for it (within its lock_timeout), the maintenance makes nothing that round when the lock
is taken. The SQL is ``0045_journal_ddl_in_turn.sql`` beside this file, frozen; the
downgrade makes both functions again as 0044 left them (``0045_journal_ddl_in_turn_down.sql``)
and drops the key's function.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0045_journal_ddl_in_turn.sql")
DOWN = frozen_sql(__file__, "0045_journal_ddl_in_turn_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN + "\nDROP FUNCTION {s}.journal_ddl_lock_v1();\n")
