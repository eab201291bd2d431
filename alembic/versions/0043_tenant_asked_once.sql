-- 0043: the tenant asked once a statement.
--
-- current_tenant_v1 is never inlined (its body holds a sub-SELECT): row-level security
-- called it for every row and every rescan of an index scan in a nested loop. The
-- policies ask it as an init plan, (SELECT current_tenant_v1()), once a statement; and
-- enter_tenant_v1, the first statement of every function of the SQL API, asks it once
-- where it asked twice (itself, then through require_tenant_scope_v1, now called only to
-- refuse a session scoped to another tenant).

CREATE OR REPLACE FUNCTION {s}.enter_tenant_v1(p_tenant_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope text;
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id !~ '^[A-Za-z0-9_.:@-]{1,128}$' THEN
        RAISE EXCEPTION 'tenant id % is not valid', quote_nullable(p_tenant_id)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'use 1-128 letters, digits or _.:@-';
    END IF;
    -- current_tenant_v1 asked once (it is no cheap call); only a session scoped to another
    -- tenant goes to the guard, which refuses it
    v_scope := {s}.current_tenant_v1();
    IF v_scope IS NOT NULL AND v_scope <> p_tenant_id THEN
        PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'enter_tenant_v1');
    END IF;
    PERFORM set_config('outbox.tenant_id', p_tenant_id, true);
END $$;

ALTER POLICY tenant_isolation ON {s}.threads
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.runs
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.messages
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.model_turns
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tool_batches
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tool_calls
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tool_results
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.orphaned_results
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.submissions
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.outbox
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tools
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.mcp_servers
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.journal
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tenant_budgets
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.approvals
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.risk_policies
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tool_switches
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.tenant_pauses
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.credentials
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.api_keys
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.assistants
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.assistant_runs
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.webhook_endpoints
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.webhook_deliveries
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.responses
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.retention_policies
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.archived_runs
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
ALTER POLICY tenant_isolation ON {s}.payloads
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
