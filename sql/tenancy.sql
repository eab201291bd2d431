-- Tenancy: which tenant a session acts for, and the guard of every function that acts
-- beyond row-level security; the tenant an API key acts for. `{s}` is the schema.
-- The policies (policies.sql) ask current_tenant_v1; the SQL API's functions call
-- enter_tenant_v1 or require_tenant_scope_v1 first.


-- current_tenant_v1: the tenant this session acts for. A login role mapped to a tenant
-- (outbox.tenant_roles, `outbox tenants grant`) acts for that tenant whatever it sets; any
-- other session for the tenant its transaction is scoped to (outbox.tenant_id), or none.
-- Row-level security and the functions below ask it. Its sub-SELECT keeps the planner from
-- inlining it: each call runs its query, executor set up anew. So the policies ask it as
-- (SELECT current_tenant_v1()), an init plan run once a statement, not once a row or a
-- rescan, and enter_tenant_v1 asks it once. It runs as the owner (SECURITY DEFINER, a
-- fixed search_path): tenant_roles is under row-level security, so a plan of its query
-- holds for one user, and as the invoker it would be planned again at every call under
-- another user than the last (SET ROLE outbox_api, the SECURITY DEFINER functions).
-- The owner reads every mapping; the query asks for session_user's only.
CREATE OR REPLACE FUNCTION {s}.current_tenant_v1() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT m.tenant_id FROM {s}.tenant_roles m
         WHERE m.role_name OPERATOR(pg_catalog.=) session_user),
        nullif(pg_catalog.current_setting('outbox.tenant_id', true), ''))
$$;
GRANT EXECUTE ON FUNCTION {s}.current_tenant_v1() TO PUBLIC;


-- require_tenant_scope_v1: refuse (42501) unless this session acts for p_tenant_id (the
-- tenant its login role is bound to, else the one its transaction is scoped to:
-- current_tenant_v1). The guard of the functions that act beyond row-level security
-- (submit_tool_outputs_v1, decide_approval_v1) and of enter_tenant_v1; p_caller names the
-- function refused.
CREATE OR REPLACE FUNCTION {s}.require_tenant_scope_v1(p_tenant_id text, p_caller text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope text := {s}.current_tenant_v1();
BEGIN
    IF v_scope IS NULL THEN
        RAISE EXCEPTION '% acts for the tenant this transaction is scoped to, and it has none',
                        p_caller
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('call outbox.enter_tenant_v1(%L) first in this transaction',
                                p_tenant_id);
    ELSIF v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION {s}.require_tenant_scope_v1(text, text) TO PUBLIC;


-- enter_tenant_v1: bind this transaction to a tenant, or refuse another one.
--
-- The first statement of every function below. A session already scoped to a tenant
-- (the transaction-local setting outbox.tenant_id, which the Python writer API and your
-- own middleware may set) may act for that tenant only; an unscoped one is scoped here, so
-- that row-level security shows and accepts only that tenant's rows until the
-- transaction ends. Raises 22023 for an ill-formed tenant id, 42501 for another tenant.
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
REVOKE ALL ON FUNCTION {s}.enter_tenant_v1(text) FROM PUBLIC;
-- The relay enters a tenant too: record_model_turns_v1 calls enter_tenant_v1 as its invoker.
GRANT EXECUTE ON FUNCTION {s}.enter_tenant_v1(text) TO outbox_writer, outbox_relay, outbox_api;


-- api_key_tenant_v1: "which tenant does this key act for?" `outbox serve` looks a request's
-- key up before any tenant is known: given the SHA-256 of a key it answers the key's
-- tenant, or NULL for an unknown or revoked key, without its caller reading api_keys
-- (SECURITY DEFINER). Nothing else about keys is visible through it.
CREATE OR REPLACE FUNCTION {s}.api_key_tenant_v1(p_key_hash text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT tenant_id FROM {s}.api_keys WHERE key_hash = p_key_hash AND revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION {s}.api_key_tenant_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.api_key_tenant_v1(text) TO outbox_api;
