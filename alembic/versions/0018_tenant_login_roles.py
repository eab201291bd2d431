"""A tenant bound by credential: login roles mapped to one tenant.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24

``tenant_roles`` maps a login role to a tenant (``outbox tenants grant T --role R``);
``current_tenant_v1()`` is the mapped tenant of ``session_user``, else the transaction's
``outbox.tenant_id``. Every ``tenant_isolation`` policy and the scope checks of
``enter_tenant_v1``, ``submit_tool_outputs_v1`` and ``decide_approval_v1`` ask it, so a
backend's database credential decides what it can see, whatever it sets. The SQL is
``0018_tenant_login_roles.sql`` beside this file, frozen; the downgrade restores the
functions from the frozen text of the revisions that made them (0010, 0015, 0016).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0018_tenant_login_roles.sql")

POLICIES_BACK = r"""
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT pol.tablename, pol.qual, pol.with_check
             FROM pg_policies pol
             JOIN pg_class c ON c.oid = '{s}.tenant_roles'::regclass
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = pol.schemaname
             WHERE pol.policyname = 'tenant_isolation'
             ORDER BY pol.tablename LOOP
        EXECUTE format('ALTER POLICY tenant_isolation ON {s}.%I USING (%s)', p.tablename,
                       regexp_replace(p.qual, '("[^"]+"\.|[A-Za-z0-9_]+\.)?current_tenant_v1\(\)',
                                      'current_setting(''outbox.tenant_id''::text, true)', 'g'));
        IF p.with_check IS NOT NULL THEN
            EXECUTE format('ALTER POLICY tenant_isolation ON {s}.%I WITH CHECK (%s)',
                           p.tablename,
                           regexp_replace(p.with_check,
                                          '("[^"]+"\.|[A-Za-z0-9_]+\.)?current_tenant_v1\(\)',
                                          'current_setting(''outbox.tenant_id''::text, true)',
                                          'g'));
        END IF;
    END LOOP;
END $$;
DROP FUNCTION {s}.current_tenant_v1();
DROP TABLE {s}.tenant_roles;
"""


def _cut(name: str, start: str, end: str | None) -> str:
    text = frozen_sql(__file__, name)
    first = text.index(start)
    return text[first:] if end is None else text[first : text.index(end, first)]


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(frozen_sql(__file__, "0015_outputs_need_a_tenant_scope.sql"))
    run_sql(_cut("0010_sql_api.sql", "-- enter_tenant_v1:", "-- create_thread_v1:"))
    run_sql(_cut("0016_action_layer.sql", "-- decide_approval_v1:", "-- A call waiting"))
    run_sql(POLICIES_BACK)
