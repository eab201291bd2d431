"""The responses of OpenAI's Responses protocol, for ``outbox serve``.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-24

A response is a stretch of a run (the run its request started, or carried on with the
outputs of its client function calls); its output is read from the run's messages from
``output_from_seq`` on. A conversation is a thread, so it needs no table. The SQL is
``0025_responses.sql`` beside this file, frozen. The downgrade drops the table.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0025_responses.sql")

DOWNGRADE = """
DROP TABLE {s}.responses;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
