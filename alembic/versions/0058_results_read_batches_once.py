"""record_tool_results_v1 reads each batch's status and its run's correlation id once.

Revision ID: 0058
Revises: 0057
Create Date: 2026-12-07

``record_tool_results_v1`` read, for every result, its batch's status and its run's
correlation id (two lookups by primary key a result, tens of results a batch); it now reads
them once a batch, in the statement that locks the batches, and asks whether a call has its
result already only where its batch is not open (in an open batch the insert's ``ON
CONFLICT`` tells a repeat). What it writes and returns is unchanged. The SQL is
``0058_results_read_batches_once.sql`` beside this file, frozen;
``0058_results_read_batches_once_down.sql`` makes the function again as it was.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0058"
down_revision = "0057"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0058_results_read_batches_once.sql")
DOWN = frozen_sql(__file__, "0058_results_read_batches_once_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
