-- name: next_version
-- The next free version number of a tool for a tenant.
SELECT coalesce(max(version), 0) + 1 AS version
FROM {s}.tools WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: insert_tool
-- Register one tool version.
INSERT INTO {s}.tools (tenant_id, name, version, description, json_schema, executor, endpoint,
                       lookup_endpoint, callable, credential_ref, timeout_s, settle_s,
                       max_attempts, idempotency_mode, risk_tier, requires_approval, enabled)
VALUES (%(tenant_id)s, %(name)s, %(version)s, %(description)s, %(json_schema)s, %(executor)s,
        %(endpoint)s, %(lookup_endpoint)s, %(callable)s, %(credential_ref)s, %(timeout_s)s,
        %(settle_s)s, %(max_attempts)s, %(idempotency_mode)s, %(risk_tier)s, %(requires_approval)s,
        %(enabled)s)
RETURNING *

-- name: list_tools
-- Every tool's newest version (per tenant scope).
SELECT DISTINCT ON (tenant_id, name) *
FROM {s}.tools ORDER BY tenant_id, name, version DESC

-- name: tool_versions
-- All versions of a tool, newest first.
SELECT * FROM {s}.tools WHERE name = %(name)s AND tenant_id = %(tenant_id)s
ORDER BY version DESC
