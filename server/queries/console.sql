-- name: run_tenant
-- The tenant of a run, for a platform operator (the pool's own login: every tenant's runs).
SELECT tenant_id FROM {s}.runs WHERE id = %(run_id)s
