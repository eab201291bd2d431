-- 0059: console people who sign in through an OpenID Connect provider.
-- Frozen: what revision 0059 applies, forever.

-- The subject (sub claim, at most 255 ASCII characters, compared exactly) of the person at
-- the console's OpenID Connect provider, set by an operator; one subject is one person. A
-- person with a subject needs no password.
ALTER TABLE {s}.console_users ADD COLUMN oidc_subject text
    CONSTRAINT console_users_oidc_subject_shape CHECK (oidc_subject ~ '^[\x21-\x7e]{1,255}$');
ALTER TABLE {s}.console_users ALTER COLUMN password_hash DROP NOT NULL;
ALTER TABLE {s}.console_users ADD CONSTRAINT console_users_signs_in
    CHECK (password_hash IS NOT NULL OR oidc_subject IS NOT NULL);
CREATE UNIQUE INDEX console_users_oidc_subject ON {s}.console_users (oidc_subject)
    WHERE oidc_subject IS NOT NULL;
COMMENT ON COLUMN {s}.console_users.oidc_subject IS
    'the person''s subject (sub) at the console''s OpenID Connect provider, set by an '
    'operator; NULL: signs in with a password only';
GRANT SELECT (oidc_subject) ON {s}.console_users TO outbox_auditor;

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
