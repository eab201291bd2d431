-- name: insert_user
-- A new console account (the argon2 hash of its password only; its subject at the OpenID
-- Connect provider, if it signs in there).
INSERT INTO {s}.console_users (name, tenant_id, role, password_hash, oidc_subject)
VALUES (%(name)s, %(tenant_id)s, %(role)s, %(password_hash)s, %(oidc_subject)s)
RETURNING name, tenant_id, role, oidc_subject, created_at

-- name: list_users
-- Every console account (optionally of one tenant), by name; never the hash.
SELECT name, tenant_id, role, oidc_subject, failed_attempts, locked_until, created_at
FROM {s}.console_users
WHERE %(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s
ORDER BY name

-- name: delete_user
-- Remove a console account and its sessions.
DELETE FROM {s}.console_users WHERE name = %(name)s RETURNING name, tenant_id, role

-- name: account
-- A console account by name, through the function a login that may not read the table
-- (a member of outbox_api) may call.
SELECT name, tenant_id, role, password_hash, locked FROM {s}.console_account_v1(%(name)s)

-- name: signed_in
-- The outcome of a checked sign-in: a session opened (token hash given) or a failure counted.
SELECT {s}.console_signed_in_v1(%(name)s, %(token_hash)s, %(csrf_token)s,
                                make_interval(secs => %(ttl_s)s)) AS opened

-- name: oidc_signed_in
-- A session for the person with a verified subject at the OpenID Connect provider; their
-- name and tenant, or no row (no session) when no person has it.
SELECT name, tenant_id
FROM {s}.console_oidc_signed_in_v1(%(subject)s, %(token_hash)s, %(csrf_token)s,
                                   make_interval(secs => %(ttl_s)s))

-- name: session
-- The person holding an unexpired session, by the SHA-256 of its token.
SELECT name, tenant_id, role, csrf_token FROM {s}.console_session_v1(%(token_hash)s)

-- name: signed_out
-- End a session (and every expired one).
SELECT {s}.console_signed_out_v1(%(token_hash)s)

-- name: unlock_user
-- Lift an account's lockout and forget its failed sign-ins; the lock it had, if any.
UPDATE {s}.console_users u SET failed_attempts = 0, locked_until = NULL
FROM (SELECT name, locked_until FROM {s}.console_users WHERE name = %(name)s FOR UPDATE) old
WHERE u.name = old.name
RETURNING u.name, u.tenant_id, u.role, old.locked_until AS was_locked_until
