"""Threads, conversations, responses and plain messages deleted through ``outbox serve``,
kept for audit.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-25

OpenAI's protocols delete threads, conversations, responses, messages and conversation
items; here a delete sets ``deleted_at`` (the API answers 404 from then on) and keeps the
rows, which are the audit record. ``start_run_v1`` refuses a run on a deleted thread; a
trigger refuses deleting a thread with an active run; a deleted message leaves every later
replay, and only a user or assistant message that carries no tool calls and is no tool
result can be deleted (a CHECK and a trigger: docs/guarantees.md, invariant 7). The SQL is
``0026_deletes.sql`` beside this file, frozen. The downgrade puts back 0021's
``start_run_v1`` and drops the columns.
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
DROP TRIGGER message_delete_guard ON {s}.messages;
DROP FUNCTION {s}.message_delete_guard();
ALTER TABLE {s}.messages DROP CONSTRAINT messages_deleted_only_plain;
ALTER TABLE {s}.messages DROP COLUMN deleted_at;
DROP TRIGGER thread_delete_guard ON {s}.threads;
DROP FUNCTION {s}.thread_delete_guard();
REVOKE UPDATE (deleted_at) ON {s}.responses FROM outbox_api;
ALTER TABLE {s}.responses DROP COLUMN deleted_at;
ALTER TABLE {s}.threads DROP COLUMN deleted_at;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_start_run_of_0021())
    run_sql(DOWNGRADE)
