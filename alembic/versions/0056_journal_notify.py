"""Every journal event of a run tells the servers that listen (``NOTIFY outbox_journal``).

Revision ID: 0056
Revises: 0055
Create Date: 2026-12-07

``journal_notify``: a statement trigger on the journal that sends the run's id (and tenant) on
the channel ``outbox_journal`` when the event's transaction commits, so a run's timeline
follows the run on the server's one ``LISTEN`` connection instead of reading the journal
on a timer. The SQL is ``0056_journal_notify.sql`` beside this file, frozen;
``0056_journal_notify_down.sql`` drops it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0056"
down_revision = "0055"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0056_journal_notify.sql")
DOWN = frozen_sql(__file__, "0056_journal_notify_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
