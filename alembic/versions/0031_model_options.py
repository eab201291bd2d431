"""What a run passes to its model beside the history; reasoning kept with the history.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-27

``runs.model_options`` (and ``responses.model_options``, as a request gave them) hold
``tool_choice``, ``parallel_tool_calls``, the answer's format and verbosity, which the relay
writes into each model request; ``messages.reasoning`` holds the reasoning items a client's
history gave before a message, replayed to a model of the Responses API. The SQL is
``0031_model_options.sql`` beside this file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0031_model_options.sql")

DOWNGRADE = """
ALTER TABLE {s}.messages DROP COLUMN reasoning;
ALTER TABLE {s}.responses DROP COLUMN model_options;
ALTER TABLE {s}.runs DROP COLUMN model_options;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
