-- 0019: the credential broker (issue 17 item 5). Frozen: what revision 0019 applies.

-- Per-tenant secrets a tool call carries, kept by reference: the name of an environment
-- variable or a file the relay reads at call time, or the value encrypted with a key only
-- the relay holds (the database keeps the ciphertext, never the value).
CREATE TABLE {s}.credentials (
    tenant_id  text NOT NULL CHECK (tenant_id <> ''),
    name       text NOT NULL CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    source     text NOT NULL CHECK (source IN ('env', 'file', 'db')),
    reference  text,
    ciphertext text,
    header     text NOT NULL DEFAULT 'Authorization' CHECK (header ~ '^[A-Za-z0-9-]{1,64}$'),
    scheme     text NOT NULL DEFAULT 'Bearer' CHECK (scheme ~ '^[A-Za-z0-9_-]{0,32}$'),
    version    integer NOT NULL DEFAULT 1 CHECK (version > 0),
    updated_by text NOT NULL DEFAULT session_user,
    updated_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    PRIMARY KEY (tenant_id, name),
    CONSTRAINT credentials_db_has_ciphertext CHECK ((source = 'db') = (ciphertext IS NOT NULL)),
    CONSTRAINT credentials_reference_or_ciphertext
        CHECK ((source = 'db') = (reference IS NULL))
);
COMMENT ON TABLE {s}.credentials IS
    'secrets tool calls carry, per tenant (''*'': every tenant''s default), by reference: '
    'an environment variable or a file the relay reads, or a value encrypted with a key '
    'only the relay holds; never the value itself';
ALTER TABLE {s}.credentials ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.credentials FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.credentials TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.credentials TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.credentials FOR SELECT TO outbox_auditor USING (true);
-- The relay reads them at call time; auditors see everything but the ciphertext; backends
-- nothing.
GRANT SELECT ON {s}.credentials TO outbox_relay;
GRANT SELECT (tenant_id, name, source, reference, header, scheme, version, updated_by,
              updated_at, revoked_at) ON {s}.credentials TO outbox_auditor;
