-- 0054: the accounts and sessions of the web console of `outbox serve`.
-- Frozen: what revision 0054 applies, forever.

-- A person who signs in to the console: a reviewer, operator or viewer of one tenant, or an
-- operator of every tenant ('*'). Only the argon2 hash of the password is kept. Failed
-- sign-ins are counted here; five in a row lock the account for 15 minutes.
CREATE TABLE {s}.console_users (
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.@-]{1,128}$'),
    tenant_id text NOT NULL,
    role text NOT NULL CHECK (role IN ('reviewer', 'operator', 'viewer')),
    password_hash text NOT NULL CHECK (password_hash LIKE '$argon2%'),
    failed_attempts integer NOT NULL DEFAULT 0 CHECK (failed_attempts >= 0),
    locked_until timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT console_users_every_tenant_operates CHECK (tenant_id <> '*' OR role = 'operator')
);
COMMENT ON TABLE {s}.console_users IS
    'people who sign in to the console of outbox serve: a role in one tenant, or operator of '
    'every tenant (*); only the argon2 hash of a password is kept; failed_attempts and '
    'locked_until count failed sign-ins and lock the account';

-- A signed-in browser: only the SHA-256 of its cookie's token is kept, with the token its
-- forms carry against cross-site requests.
CREATE TABLE {s}.console_sessions (
    token_hash text PRIMARY KEY CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    user_name text NOT NULL REFERENCES {s}.console_users (name) ON DELETE CASCADE,
    tenant_id text NOT NULL,
    csrf_token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_user ON {s}.console_sessions (user_name);
COMMENT ON TABLE {s}.console_sessions IS
    'signed-in sessions of the console: the SHA-256 of the cookie token, the CSRF token of '
    'its forms, when it expires';

ALTER TABLE {s}.console_users ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.console_users TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
CREATE POLICY all_tenants ON {s}.console_users TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.console_users FOR SELECT TO outbox_auditor USING (true);
ALTER TABLE {s}.console_sessions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.console_sessions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
CREATE POLICY all_tenants ON {s}.console_sessions TO CURRENT_USER
    USING (true) WITH CHECK (true);
GRANT SELECT (name, tenant_id, role, failed_attempts, locked_until, created_at)
    ON {s}.console_users TO outbox_auditor;

-- The console's runs list: a tenant's runs newest first, a page at a time by the keyset
-- (created_at, id), read from the index instead of sorting every run of the tenant.
CREATE INDEX runs_tenant_created ON {s}.runs (tenant_id, created_at, id)
    WHERE created_at > '-infinity';

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

-- approval_notify: every approval requested or decided (inserted, or its status changed)
-- sends a NOTIFY on the channel outbox_approvals from the transaction that made it
-- (delivered when it commits). The payload is ids and the status, never arguments:
--   {"schema": "outbox", "tenant_id": "...", "run_id": "...", "approval_id": 42,
--    "status": "pending"}
-- The console's inbox wakes on it (one LISTEN per server process). SET outbox.run_notify
-- = 'off' switches it off with run_notify.
CREATE OR REPLACE FUNCTION {s}.approval_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.run_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_approvals', json_build_object(
            'schema', TG_TABLE_SCHEMA,
            'tenant_id', NEW.tenant_id,
            'run_id', NEW.run_id,
            'approval_id', NEW.id,
            'status', NEW.status)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER approval_notify_insert AFTER INSERT ON {s}.approvals
    FOR EACH ROW EXECUTE FUNCTION {s}.approval_notify();
CREATE OR REPLACE TRIGGER approval_notify_update AFTER UPDATE OF status ON {s}.approvals
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.approval_notify();
