"""``current_tenant_v1`` reads the session's binding as the schema owner.

Revision ID: 0044
Revises: 0043
Create Date: 2026-11-27

Its query reads ``tenant_roles``, under row-level security, so its cached plan holds for
one user only: each call under another current user than the last (``outbox serve``'s
``SET ROLE outbox_api``, the SECURITY DEFINER functions and triggers) planned it again.
As SECURITY DEFINER (with a fixed ``search_path``) it runs as the owner every time and
answers the same: the tenant ``session_user`` is bound to, else the transaction's
``outbox.tenant_id``. The SQL is ``0044_tenant_lookup_as_owner.sql`` beside this file,
frozen. The downgrade makes the function again as 0043 left it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0044_tenant_lookup_as_owner.sql")

DOWN = """
CREATE OR REPLACE FUNCTION {s}.current_tenant_v1() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT m.tenant_id FROM {s}.tenant_roles m
         WHERE m.role_name OPERATOR(pg_catalog.=) session_user),
        nullif(pg_catalog.current_setting('outbox.tenant_id', true), ''))
$$;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
