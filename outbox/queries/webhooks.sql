-- name: insert_endpoint
-- A new webhook endpoint (its secret encrypted; never returned).
INSERT INTO {s}.webhook_endpoints (tenant_id, url, events, ciphertext)
VALUES (%(tenant_id)s, %(url)s, %(events)s, %(ciphertext)s)
RETURNING id, tenant_id, url, events, created_by, created_at, rotated_at, removed_at

-- name: list_endpoints
-- Endpoints (optionally of one tenant), newest first, with their deliveries so far.
SELECT e.id, e.tenant_id, e.url, e.events, e.created_by, e.created_at, e.rotated_at,
       e.removed_at,
       (SELECT count(*) FROM {s}.webhook_deliveries d
        WHERE d.endpoint_id = e.id AND d.delivered_at IS NOT NULL) AS delivered,
       (SELECT count(*) FROM {s}.webhook_deliveries d
        WHERE d.endpoint_id = e.id AND d.delivered_at IS NULL) AS pending
FROM {s}.webhook_endpoints e
WHERE %(tenant_id)s::text IS NULL OR e.tenant_id = %(tenant_id)s
ORDER BY e.created_at DESC, e.id

-- name: remove_endpoint
-- Stop sending to an endpoint (a second removal keeps the first time).
UPDATE {s}.webhook_endpoints SET removed_at = coalesce(removed_at, now())
WHERE id = %(id)s
RETURNING id, tenant_id, url, events, created_by, created_at, rotated_at, removed_at

-- name: rotate_secret
-- A new signing secret for an endpoint that was not removed.
UPDATE {s}.webhook_endpoints SET ciphertext = %(ciphertext)s, rotated_at = now()
WHERE id = %(id)s AND removed_at IS NULL
RETURNING id, tenant_id, url, events, created_by, created_at, rotated_at, removed_at
