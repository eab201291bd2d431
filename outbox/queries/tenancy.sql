-- name: scope
-- Bind this transaction to one tenant: row-level security shows and accepts only its rows.
SELECT set_config('outbox.tenant_id', %(tenant_id)s, true)
