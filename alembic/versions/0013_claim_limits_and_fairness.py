"""Limits per tool and per tenant, counted in PostgreSQL; a claim fair across tenants.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24

``lanes`` holds the limits: per tool (calls in flight across every relay, calls started per
second) and per tenant (calls in flight). ``outbox.tool_name`` names a tool call's tool on
its queue row, and three partial indexes let a claim walk the tenants with ready work and
count what a lane has in flight with an index lookup each (docs/relay.md, "Limits and fair
claims"). The SQL is ``0013_claim_limits_and_fairness.sql`` beside this file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0013_claim_limits_and_fairness.sql")

DOWNGRADE = """
DROP TABLE {s}.lanes;
DROP INDEX {s}.outbox_ready_tenant;
DROP INDEX {s}.outbox_leased_tenant;
DROP INDEX {s}.outbox_leased_tool;
ALTER TABLE {s}.outbox DROP COLUMN tool_name;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
