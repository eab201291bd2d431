-- 0044: current_tenant_v1 reads the session's binding as the schema owner.
--
-- Its query reads tenant_roles, a table under row-level security, so the plan PostgreSQL
-- keeps for it is valid for one user only: every call under another current user than the
-- last (SET ROLE outbox_api in each of outbox serve's transactions, the SECURITY DEFINER
-- functions and triggers, which run as the owner) planned it again, about 25 us a call,
-- and a waiting responses.create asks it about 26 times. As SECURITY DEFINER it always
-- runs as the owner, and its plan is planned once. What it answers is the same: the
-- tenant session_user is bound to (the owner reads every mapping, the query asks for
-- session_user's only), else the transaction's outbox.tenant_id.

CREATE OR REPLACE FUNCTION {s}.current_tenant_v1() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT m.tenant_id FROM {s}.tenant_roles m
         WHERE m.role_name OPERATOR(pg_catalog.=) session_user),
        nullif(pg_catalog.current_setting('outbox.tenant_id', true), ''))
$$;
