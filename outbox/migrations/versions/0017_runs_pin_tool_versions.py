"""Runs pin their tool versions when they start.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24

``runs.tool_pins`` records, for each tool of a run, the version (and its tenant scope)
``start_run_v1`` found when the run started; the model's tool list and the recording of
its calls use that version for the whole run, so a new registration never changes the
schema a running conversation was given. The SQL is ``0017_runs_pin_tool_versions.sql``
beside this file, frozen; the downgrade restores ``start_run_v1`` as 0010 made it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0017_runs_pin_tool_versions.sql")


def _start_run_of_0010() -> str:
    """``start_run_v1`` as 0010 created it, cut from 0010's frozen text."""
    text = frozen_sql(__file__, "0010_sql_api.sql")
    start = text.index('-- start_run_v1: "start a run on this thread with this user turn".')
    return text[start : text.index("-- same_run_request_v1:", start)]


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_start_run_of_0010())
    run_sql("ALTER TABLE {s}.runs DROP COLUMN tool_pins;")
