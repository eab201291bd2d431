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



-- console_account_v1: "who is this name, and may they try a password now?" The console
-- looks a person up before any tenant is known (SECURITY DEFINER, as api_key_tenant_v1):
-- the account's tenant, role and password hash, and whether it is locked now.
CREATE OR REPLACE FUNCTION {s}.console_account_v1(p_name text)
RETURNS TABLE (name text, tenant_id text, role text, password_hash text, locked boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.name, u.tenant_id, u.role, u.password_hash,
           coalesce(u.locked_until > now(), false)
    FROM {s}.console_users u WHERE u.name = p_name
$$;
REVOKE ALL ON FUNCTION {s}.console_account_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_account_v1(text) TO outbox_api;

-- console_signed_in_v1: the outcome of a sign-in the console checked. A right password
-- (p_token_hash given) clears the count of failures and opens a session until p_ttl from
-- now; a wrong one (p_token_hash NULL) counts a failure, and the p_max_failures-th in a row
-- locks the account for p_lockout and starts the count again. A locked account opens no
-- session whatever it is given. Returns whether a session was opened.
CREATE OR REPLACE FUNCTION {s}.console_signed_in_v1(
    p_name text, p_token_hash text, p_csrf_token text, p_ttl interval,
    p_max_failures integer DEFAULT 5, p_lockout interval DEFAULT '15 minutes'
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_user {s}.console_users;
BEGIN
    SELECT * INTO v_user FROM {s}.console_users u WHERE u.name = p_name FOR UPDATE;
    IF NOT FOUND OR coalesce(v_user.locked_until > now(), false) THEN
        RETURN false;
    END IF;
    IF p_token_hash IS NULL THEN
        UPDATE {s}.console_users u
        SET failed_attempts = CASE WHEN v_user.failed_attempts + 1 >= p_max_failures THEN 0
                                   ELSE v_user.failed_attempts + 1 END,
            locked_until = CASE WHEN v_user.failed_attempts + 1 >= p_max_failures
                                THEN now() + p_lockout ELSE u.locked_until END
        WHERE u.name = p_name;
        RETURN false;
    END IF;
    UPDATE {s}.console_users u SET failed_attempts = 0, locked_until = NULL
    WHERE u.name = p_name;
    INSERT INTO {s}.console_sessions (token_hash, user_name, tenant_id, csrf_token, expires_at)
    VALUES (p_token_hash, p_name, v_user.tenant_id, p_csrf_token, now() + p_ttl);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION {s}.console_signed_in_v1(text, text, text, interval, integer, interval)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_signed_in_v1(text, text, text, interval, integer, interval)
    TO outbox_api;

-- console_oidc_signed_in_v1: open a session for the person whose subject at the provider
-- the console verified (an ID token whose signature, issuer, audience, expiry and nonce it
-- checked). Returns the person's name and tenant, or no row (no session) when no person
-- has that subject: who a person is in the console is the operator's decision, never the provider's.
CREATE OR REPLACE FUNCTION {s}.console_oidc_signed_in_v1(
    p_subject text, p_token_hash text, p_csrf_token text, p_ttl interval
) RETURNS TABLE (name text, tenant_id text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {s}.console_sessions AS s
        (token_hash, user_name, tenant_id, csrf_token, expires_at)
    SELECT p_token_hash, u.name, u.tenant_id, p_csrf_token, now() + p_ttl
    FROM {s}.console_users u WHERE u.oidc_subject = p_subject
    RETURNING s.user_name, s.tenant_id
$$;
REVOKE ALL ON FUNCTION {s}.console_oidc_signed_in_v1(text, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_oidc_signed_in_v1(text, text, text, interval)
    TO outbox_api;

-- console_session_v1: "who holds this cookie?" The person of an unexpired session (by the
-- SHA-256 of its token), with the session's CSRF token; no row otherwise.
CREATE OR REPLACE FUNCTION {s}.console_session_v1(p_token_hash text)
RETURNS TABLE (name text, tenant_id text, role text, csrf_token text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.name, u.tenant_id, u.role, s.csrf_token
    FROM {s}.console_sessions s JOIN {s}.console_users u ON u.name = s.user_name
    WHERE s.token_hash = p_token_hash AND s.expires_at > now()
$$;
REVOKE ALL ON FUNCTION {s}.console_session_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_session_v1(text) TO outbox_api;

-- console_signed_out_v1: end a session (by the SHA-256 of its token), and any expired one.
CREATE OR REPLACE FUNCTION {s}.console_signed_out_v1(p_token_hash text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM {s}.console_sessions s
    WHERE s.token_hash = p_token_hash OR s.expires_at <= now()
$$;
REVOKE ALL ON FUNCTION {s}.console_signed_out_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_signed_out_v1(text) TO outbox_api;