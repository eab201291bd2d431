-- The credential broker (outbox/credentials.py). Values never pass through here: only
-- references and ciphertexts.

-- name: set
-- Create a credential, or rotate it: a new source, a version up, a revocation lifted.
INSERT INTO {s}.credentials AS c (tenant_id, name, source, reference, ciphertext, header,
                                  scheme, updated_by)
VALUES (%(tenant_id)s, %(name)s, %(source)s, %(reference)s, %(ciphertext)s, %(header)s,
        %(scheme)s, %(actor)s)
ON CONFLICT (tenant_id, name) DO UPDATE
SET source = excluded.source, reference = excluded.reference,
    ciphertext = excluded.ciphertext, header = excluded.header, scheme = excluded.scheme,
    version = c.version + 1, updated_by = excluded.updated_by, updated_at = now(),
    revoked_at = NULL
RETURNING tenant_id, name, source, reference, header, scheme, version, updated_by, updated_at

-- name: revoke
UPDATE {s}.credentials SET revoked_at = now(), updated_at = now()
WHERE tenant_id = %(tenant_id)s AND name = %(name)s
RETURNING tenant_id, name, version

-- name: list
SELECT tenant_id, name, source, reference, header, scheme, version, updated_by, updated_at,
       revoked_at
FROM {s}.credentials ORDER BY name, tenant_id
