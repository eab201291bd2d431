-- name: insert_server
-- Register an MCP server (outbox.mcpservers.add).
INSERT INTO {s}.mcp_servers (tenant_id, name, transport, url, headers, command, env,
                             credential_ref, trusted, prefix, timeout_s, settle_s,
                             deadline_s, max_attempts, max_concurrency, overrides)
VALUES (%(tenant_id)s, %(name)s, %(transport)s, %(url)s, %(headers)s, %(command)s, %(env)s,
        %(credential_ref)s, %(trusted)s, %(prefix)s, %(timeout_s)s, %(settle_s)s,
        %(deadline_s)s, %(max_attempts)s, %(max_concurrency)s, %(overrides)s)
RETURNING *

-- name: synced
-- When the server's tools were last listed.
UPDATE {s}.mcp_servers SET synced_at = now()
WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: server_tools
-- The newest version of each tool of a server.
SELECT DISTINCT ON (name) *
FROM {s}.tools WHERE mcp_server = %(server)s AND tenant_id = %(tenant_id)s
ORDER BY name, version DESC

-- name: get_server
-- One server, by tenant scope and name.
SELECT * FROM {s}.mcp_servers WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: list_servers
-- Every server, with how many of its tools are enabled (newest versions).
SELECT m.*, (SELECT count(*) FROM (
                 SELECT DISTINCT ON (t.name) t.enabled FROM {s}.tools t
                 WHERE t.mcp_server = m.name AND t.tenant_id = m.tenant_id
                 ORDER BY t.name, t.version DESC) n WHERE n.enabled) AS tools
FROM {s}.mcp_servers m ORDER BY m.tenant_id, m.name

-- name: remove_server
-- Remove a server and disable every version of its tools; the names of the tools disabled.
WITH gone AS (
    DELETE FROM {s}.mcp_servers WHERE tenant_id = %(tenant_id)s AND name = %(name)s
)
UPDATE {s}.tools SET enabled = false
WHERE mcp_server = %(name)s AND tenant_id = %(tenant_id)s AND enabled
RETURNING name

-- name: credential_row
-- A credential as the relay's claim returns it (relay/queries/relay.sql): the tenant's,
-- else the default ('*').
SELECT cr.tenant_id, cr.source, cr.reference, cr.ciphertext, cr.header, cr.scheme, cr.version,
       cr.revoked_at
FROM {s}.credentials cr
WHERE cr.name = %(name)s AND cr.tenant_id IN (%(tenant_id)s, '*')
ORDER BY cr.tenant_id = '*' LIMIT 1

-- name: configure_server
-- Change whether a server is trusted, the operator's overrides of its tools and, when
-- set_deadline, their deadline (NULL: none).
UPDATE {s}.mcp_servers
SET trusted = coalesce(%(trusted)s, trusted), overrides = %(overrides)s,
    deadline_s = CASE WHEN %(set_deadline)s THEN %(deadline_s)s::float8 ELSE deadline_s END
WHERE tenant_id = %(tenant_id)s AND name = %(name)s
RETURNING *
