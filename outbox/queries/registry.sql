-- name: next_version
-- The next free version number of a tool for a tenant.
SELECT coalesce(max(version), 0) + 1 AS version
FROM {s}.tools WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: insert_tool
-- Register one tool version.
INSERT INTO {s}.tools (tenant_id, name, version, description, json_schema, executor, endpoint,
                       lookup_endpoint, callable, credential_ref, timeout_s, settle_s,
                       deadline_s, max_attempts, idempotency_mode, risk_tier, requires_approval, enabled,
                       mcp_server, mcp_tool, annotations, refuses_key_in_use, model_result_cap)
VALUES (%(tenant_id)s, %(name)s, %(version)s, %(description)s, %(json_schema)s, %(executor)s,
        %(endpoint)s, %(lookup_endpoint)s, %(callable)s, %(credential_ref)s, %(timeout_s)s,
        %(settle_s)s, %(deadline_s)s, %(max_attempts)s, %(idempotency_mode)s, %(risk_tier)s, %(requires_approval)s,
        %(enabled)s, %(mcp_server)s, %(mcp_tool)s, %(annotations)s, %(refuses_key_in_use)s,
        %(model_result_cap)s)
RETURNING *

-- name: list_tools
-- Every tool's newest version (per tenant scope).
SELECT DISTINCT ON (tenant_id, name) *
FROM {s}.tools ORDER BY tenant_id, name, version DESC

-- name: tool_versions
-- All versions of a tool, newest first.
SELECT * FROM {s}.tools WHERE name = %(name)s AND tenant_id = %(tenant_id)s
ORDER BY version DESC

-- name: tools_by_name
-- Each named tool as a run uses it: the version the run pinned (pins: runs.tool_pins), else
-- the newest visible to the tenant (its own before shared), with
-- what the action layer says of it (outbox/policy.py): the switch that turned it off for
-- this tenant or for all, and the risk policy of its tier (the tenant's rule before '*').
SELECT DISTINCT ON (t.name) t.*,
       w.tenant_id AS switch_tenant, w.switched_by, w.reason AS switch_reason,
       p.tenant_id AS policy_tenant, p.action AS policy_action,
       p.approvers AS policy_approvers,
       extract(epoch FROM p.approval_timeout)::float8 AS policy_timeout_s
FROM {s}.tools t
LEFT JOIN LATERAL (
    SELECT * FROM {s}.tool_switches w
    WHERE w.tool_name = t.name AND w.tenant_id IN (%(tenant_id)s, '*')
    ORDER BY w.tenant_id = '*' LIMIT 1
) w ON true
LEFT JOIN LATERAL (
    SELECT * FROM {s}.risk_policies p
    WHERE p.risk_tier = t.risk_tier AND p.tenant_id IN (%(tenant_id)s, '*')
    ORDER BY p.tenant_id = '*' LIMIT 1
) p ON true
WHERE t.name = ANY(%(names)s) AND t.tenant_id IN (%(tenant_id)s, '*')
  AND (NOT %(pins)s::jsonb ? t.name
       OR (t.tenant_id = %(pins)s::jsonb -> t.name ->> 'tenant_id'
           AND t.version = (%(pins)s::jsonb -> t.name ->> 'version')::int))
ORDER BY t.name, (t.tenant_id = '*'), t.version DESC
