"""Runs pin their tool versions when they start; budgets in money; a platform step ceiling.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24

``runs.tool_pins`` records, for each tool of a run, the version (and its tenant scope)
``start_run_v1`` found when the run started; the model's tool list and the recording of
its calls use that version for the whole run, so a new registration never changes the
schema a running conversation was given. ``model_prices`` prices each model's tokens;
turns record their cost, runs (``max_cost``) and tenants (``tenant_budgets.max_cost``)
have budgets in money beside tokens, and ``platform_limits.max_steps`` caps every run.
``start_run_v1`` gains ``p_max_cost``. The SQL is ``0017_run_pins_and_money_budgets.sql``
beside this file, frozen; the downgrade restores ``start_run_v1`` as 0010 made it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0017_run_pins_and_money_budgets.sql")

DOWNGRADE = """
DROP FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                               integer, bigint, integer, double precision, text, numeric);
DROP TABLE {s}.platform_limits, {s}.model_prices;
DELETE FROM {s}.tenant_budgets WHERE max_tokens IS NULL;
ALTER TABLE {s}.tenant_budgets
    DROP CONSTRAINT tenant_budgets_limit_something,
    DROP COLUMN max_cost, DROP COLUMN cost_used,
    ALTER COLUMN max_tokens SET NOT NULL;
ALTER TABLE {s}.runs DROP COLUMN max_cost, DROP COLUMN cost, DROP COLUMN tool_pins;
ALTER TABLE {s}.model_turns DROP COLUMN cached_tokens, DROP COLUMN cost;
"""


def _start_run_of_0010() -> str:
    """``start_run_v1`` as 0010 created it and its grants, cut from 0010's frozen text."""
    text = frozen_sql(__file__, "0010_sql_api.sql")
    start = text.index('-- start_run_v1: "start a run on this thread with this user turn".')
    function = text[start : text.index("-- same_run_request_v1:", start)]
    return (
        function
        + """
REVOKE ALL ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text)
    TO outbox_writer, outbox_relay;
"""
    )


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
    run_sql(_start_run_of_0010())
