"""Threads, conversations and responses deleted through ``outbox serve``, kept for audit.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-25

OpenAI's protocols delete threads, conversations and responses; here a delete sets
``deleted_at`` (the API answers 404 from then on) and keeps the rows, which are the audit
record. ``start_run_v1`` refuses a run on a deleted thread. The SQL is ``0026_deletes.sql``
beside this file, frozen. The downgrade puts back 0021's ``start_run_v1`` and drops the
columns.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0026_deletes.sql")


def _start_run_of_0021() -> str:
    text = frozen_sql(__file__, "0021_record_tool_results.sql")
    first = text.index('-- start_run_v1: "start a run')
    return text[first : text.index("END $$;", first) + len("END $$;")]


DOWNGRADE = """
REVOKE UPDATE (deleted_at) ON {s}.responses FROM outbox_api;
ALTER TABLE {s}.responses DROP COLUMN deleted_at;
ALTER TABLE {s}.threads DROP COLUMN deleted_at;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_start_run_of_0021())
    run_sql(DOWNGRADE)
