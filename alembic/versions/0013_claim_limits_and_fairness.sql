-- 0013: limits per tool and per tenant, counted in PostgreSQL; a claim fair across tenants.
-- Frozen: what revision 0013 applies, forever.

-- A tool call's tool on its queue row, so the calls of a tool in flight are one index
-- lookup (outbox_leased_tool) rather than a join of every leased row to its call.
ALTER TABLE {s}.outbox ADD COLUMN tool_name text;
COMMENT ON COLUMN {s}.outbox.tool_name IS
    'the tool of a tool_call row (its lane for per-tool limits); NULL for other kinds';
UPDATE {s}.outbox o SET tool_name = tc.tool_name
FROM {s}.tool_calls tc
WHERE o.kind = 'tool_call' AND tc.id = o.tool_call_ref;

-- The fair claim walks the tenants with ready rows (one index probe each) and takes each
-- tenant's oldest due rows.
CREATE INDEX outbox_ready_tenant ON {s}.outbox (tenant_id, available_at, id)
    WHERE status = 'ready';
-- What a lane has in flight, counted at claim time.
CREATE INDEX outbox_leased_tenant ON {s}.outbox (tenant_id) WHERE status = 'leased';
CREATE INDEX outbox_leased_tool ON {s}.outbox (tool_name)
    WHERE status = 'leased' AND tool_name IS NOT NULL;

-- A lane is a tool (across all tenants) or a tenant with a limit. No row: no limit.
CREATE TABLE {s}.lanes (
    scope text NOT NULL CHECK (scope IN ('tool', 'tenant')),
    name text NOT NULL CHECK (name <> ''),
    max_concurrency int CHECK (max_concurrency > 0),
    rate float8 CHECK (rate > 0),
    tokens float8 NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name),
    CONSTRAINT lanes_rate_is_per_tool CHECK (scope = 'tool' OR rate IS NULL),
    CONSTRAINT lanes_limit_something CHECK (max_concurrency IS NOT NULL OR rate IS NOT NULL)
);
COMMENT ON TABLE {s}.lanes IS
    'limits per tool and per tenant: calls in flight (max_concurrency) and, for a tool, '
    'calls started per second (rate, a token bucket of burst max(1, rate)); every claim '
    'that takes work of a lane updates its row, which is how other claims see it';
GRANT SELECT, UPDATE ON {s}.lanes TO outbox_relay;
GRANT SELECT ON {s}.lanes TO outbox_auditor;
