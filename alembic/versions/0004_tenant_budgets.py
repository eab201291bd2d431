"""Per-tenant token budgets.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22

A tenant with a row here may spend at most ``max_tokens`` over all its runs. The writer
counts every recorded model turn against it, and the transaction that would enqueue a
tenant's next model turn (``start_run``, a batch delivery) refuses once it is spent.
Row-level security as for every tenant table (see 0002).
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE {s}.tenant_budgets (
    tenant_id   text PRIMARY KEY CHECK (tenant_id <> ''),
    max_tokens  bigint NOT NULL CHECK (max_tokens > 0),
    tokens_used bigint NOT NULL DEFAULT 0 CHECK (tokens_used >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE {s}.tenant_budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.tenant_budgets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.tenant_budgets TO PUBLIC
    USING (tenant_id = current_setting('outbox.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('outbox.tenant_id', true));
CREATE POLICY all_tenants ON {s}.tenant_budgets TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.tenant_budgets FOR SELECT TO outbox_auditor USING (true);
-- Backends and relays count tokens; only the owner sets budgets.
GRANT SELECT, UPDATE (tokens_used, updated_at) ON {s}.tenant_budgets
    TO outbox_writer, outbox_relay;
GRANT SELECT ON {s}.tenant_budgets TO outbox_auditor;
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql("DROP TABLE {s}.tenant_budgets"))
