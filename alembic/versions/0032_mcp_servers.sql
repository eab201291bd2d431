-- 0032: MCP tool servers in the registry.
-- Frozen: what revision 0032 applies, forever.
--
-- A server is registered once (mcp_servers: how to reach it, whether its annotations are
-- trusted, the operator's overrides per tool); each tool it lists is a tool version with
-- executor 'mcp', naming its server and its name there (mcp_server, mcp_tool) and keeping
-- the annotations it was listed with. Its calls are 'mcp' calls. `trusted`: whether the
-- annotations give modes and tiers (readOnlyHint, idempotentHint); untrusted, every tool is
-- none and high.

CREATE TABLE {s}.mcp_servers (
    tenant_id       text NOT NULL DEFAULT '*',
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]{1,40}$'),
    transport       text NOT NULL CHECK (transport IN ('http', 'stdio')),
    url             text,
    headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
    command         jsonb,
    env             jsonb NOT NULL DEFAULT '{}'::jsonb,
    credential_ref  text,
    trusted         boolean NOT NULL DEFAULT false,
    prefix          text NOT NULL CHECK (prefix ~ '^[A-Za-z0-9_-]{1,40}$'),
    timeout_s       double precision NOT NULL DEFAULT 30 CHECK (timeout_s > 0),
    settle_s        double precision NOT NULL DEFAULT 5 CHECK (settle_s >= 0),
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    max_concurrency integer NOT NULL DEFAULT 16 CHECK (max_concurrency > 0),
    overrides       jsonb NOT NULL DEFAULT '{}'::jsonb,
    synced_at       timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name),
    CONSTRAINT mcp_servers_http_has_url CHECK (transport <> 'http' OR url IS NOT NULL),
    CONSTRAINT mcp_servers_stdio_has_command
        CHECK (transport <> 'stdio' OR jsonb_typeof(command) = 'array')
);
ALTER TABLE {s}.tools ADD COLUMN mcp_server text, ADD COLUMN mcp_tool text,
    ADD COLUMN annotations jsonb;
ALTER TABLE {s}.tools DROP CONSTRAINT tools_executor_check;
ALTER TABLE {s}.tools ADD CONSTRAINT tools_executor_check
    CHECK (executor IN ('http', 'client', 'python', 'mcp'));
ALTER TABLE {s}.tools ADD CONSTRAINT tools_mcp_has_server
    CHECK (executor <> 'mcp' OR (mcp_server IS NOT NULL AND mcp_tool IS NOT NULL));
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_executor_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_executor_check
    CHECK (executor IN ('http', 'client', 'python', 'mcp', 'none'));

-- The relay reads how to reach a server when it claims a call; the auditor reads what is
-- registered but header and environment values, which may hold secrets.
GRANT SELECT ON {s}.mcp_servers TO outbox_relay;
GRANT SELECT (tenant_id, name, transport, url, command, credential_ref, trusted, prefix,
              timeout_s, settle_s, max_attempts, max_concurrency, overrides, synced_at,
              created_at) ON {s}.mcp_servers TO outbox_auditor;
ALTER TABLE {s}.mcp_servers ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.mcp_servers TO PUBLIC
    USING (tenant_id IN ({s}.current_tenant_v1(), '*'))
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.mcp_servers TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.mcp_servers FOR SELECT TO outbox_auditor USING (true);
