"""The tenant asked once a statement: row-level security and ``enter_tenant_v1``.

Revision ID: 0043
Revises: 0042
Create Date: 2026-11-27

``current_tenant_v1`` is never inlined (its body holds a sub-``SELECT``), so every call
runs its query with an executor and a plan set up anew: about a sixth of the PostgreSQL
CPU of a waiting ``responses.create`` of ``outbox serve``. The tenant-isolation policies
ask it as an init plan, ``(SELECT current_tenant_v1())``, once a statement instead of once
a row or a rescan; ``enter_tenant_v1`` asks it once where it asked twice (it calls
``require_tenant_scope_v1`` only to refuse a session scoped to another tenant). The SQL
is ``0043_tenant_asked_once.sql`` beside this file, frozen. The downgrade makes the
function and the policies again as 0042 left them.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0043_tenant_asked_once.sql")

DOWN = """
CREATE OR REPLACE FUNCTION {s}.enter_tenant_v1(p_tenant_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id !~ '^[A-Za-z0-9_.:@-]{1,128}$' THEN
        RAISE EXCEPTION 'tenant id % is not valid', quote_nullable(p_tenant_id)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'use 1-128 letters, digits or _.:@-';
    END IF;
    IF {s}.current_tenant_v1() IS NOT NULL THEN
        PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'enter_tenant_v1');
    END IF;
    PERFORM set_config('outbox.tenant_id', p_tenant_id, true);
END $$;

ALTER POLICY tenant_isolation ON {s}.threads
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.runs
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.messages
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.model_turns
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tool_batches
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tool_calls
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tool_results
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.orphaned_results
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.submissions
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.outbox
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tools
    USING (tenant_id IN ({s}.current_tenant_v1(), '*'))
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.mcp_servers
    USING (tenant_id IN ({s}.current_tenant_v1(), '*'))
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.journal
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tenant_budgets
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.approvals
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.risk_policies
    USING (tenant_id IN ({s}.current_tenant_v1(), '*'))
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tool_switches
    USING (tenant_id IN ({s}.current_tenant_v1(), '*'))
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.tenant_pauses
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.credentials
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.api_keys
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.assistants
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.assistant_runs
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.webhook_endpoints
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.webhook_deliveries
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.responses
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.retention_policies
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.archived_runs
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
ALTER POLICY tenant_isolation ON {s}.payloads
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
