-- name: insert_key
-- Store a new API key (its SHA-256 only) for a tenant.
INSERT INTO {s}.api_keys (tenant_id, name, key_hash, key_prefix)
VALUES (%(tenant_id)s, %(name)s, %(key_hash)s, %(key_prefix)s)
RETURNING id, tenant_id, name, key_prefix, created_at, revoked_at

-- name: list_keys
-- Every key (optionally of one tenant), newest first; never the hash.
SELECT id, tenant_id, name, key_prefix, created_at, revoked_at
FROM {s}.api_keys
WHERE %(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s
ORDER BY created_at DESC, id

-- name: revoke_key
-- Revoke a key (a second revoke keeps the first time).
UPDATE {s}.api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE id = %(id)s
RETURNING id, tenant_id, name, key_prefix, created_at, revoked_at

-- name: tenant_of_key
-- The tenant a key (by its SHA-256) acts for, NULL when unknown or revoked; through the
-- function, so a login that may not read api_keys (a member of outbox_api) can ask.
SELECT {s}.api_key_tenant_v1(%(key_hash)s) AS tenant_id
