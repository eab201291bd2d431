-- 0020: API keys and the objects of the Assistants protocol for `outbox serve`.
-- Frozen: what revision 0020 applies, forever.

-- The role `outbox serve` acts as inside every request, after the API key named a tenant:
-- a backend (outbox_writer) that may also read its tenant's journal (the run event
-- stream), register its own client tools (function tools a caller declares) and keep its
-- assistants. Row-level security applies to it like to outbox_writer: with
-- outbox.tenant_id set it sees and writes that tenant's rows only. Created only when
-- missing (roles are cluster-wide; another database may have created it).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_api') THEN
        CREATE ROLE outbox_api NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;  -- created concurrently
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'role outbox_api does not exist and % may not create it', current_user
            USING HINT = 'create it once as a superuser: CREATE ROLE outbox_api NOLOGIN';
END $$;
-- outbox_writer's rights, granted directly rather than by membership: granting a role
-- needs its ADMIN option, which a schema owner that is not a superuser does not hold.
GRANT USAGE ON SCHEMA {s} TO outbox_api;
GRANT SELECT, INSERT, UPDATE ON {s}.threads, {s}.runs, {s}.messages, {s}.model_turns,
    {s}.tool_batches, {s}.tool_calls, {s}.tool_results, {s}.orphaned_results, {s}.submissions
    TO outbox_api;
GRANT SELECT, INSERT ON {s}.outbox TO outbox_api;
GRANT SELECT ON {s}.tenant_budgets TO outbox_api;
GRANT SELECT, INSERT ON {s}.approvals TO outbox_api;
GRANT SELECT ON {s}.risk_policies, {s}.tool_switches, {s}.tenant_pauses, {s}.model_prices,
    {s}.platform_limits TO outbox_api;
GRANT EXECUTE ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb),
                          {s}.enter_tenant_v1(text),
                          {s}.create_thread_v1(text, text, jsonb, jsonb),
                          {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric),
                          {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                          {s}.cancel_run_v1(text, uuid, text),
                          {s}.decide_approval_v1(text, bigint, text, text, text, text)
    TO outbox_api;
-- Beyond outbox_writer: its tenant's journal (the event stream) and its own client tools.
GRANT SELECT, INSERT ON {s}.tools TO outbox_api;
GRANT SELECT, INSERT ON {s}.journal TO outbox_api;

-- A key is shown once when it is created; only its SHA-256 is kept. Only the schema owner
-- (the server's login, the CLI) reads this table: a key is looked up before any tenant is
-- known, and no tenant role may list keys.
CREATE TABLE {s}.api_keys (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id text NOT NULL CHECK (tenant_id <> '*'),
    name text,
    key_hash text NOT NULL CONSTRAINT api_keys_hash_key UNIQUE
        CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    key_prefix text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
COMMENT ON TABLE {s}.api_keys IS
    'API keys of outbox serve: each names one tenant; only the SHA-256 of a key is kept; '
    'a revoked key (revoked_at) is refused';

-- An assistant: what a run of the Assistants protocol starts from (model, instructions,
-- tools as the caller declared them).
CREATE TABLE {s}.assistants (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id text NOT NULL,
    name text,
    description text,
    model text NOT NULL,
    instructions text,
    tools jsonb NOT NULL DEFAULT '[]',
    metadata jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT assistants_id_tenant_key UNIQUE (id, tenant_id)
);
COMMENT ON TABLE {s}.assistants IS
    'assistants of the Assistants protocol (outbox serve): model, instructions and tools '
    'a run starts from';

-- What the Assistants protocol knows of a run beyond the run itself: its assistant, the
-- tools as the caller declared them, its metadata. Written in the run's transaction.
CREATE TABLE {s}.assistant_runs (
    run_id uuid PRIMARY KEY,
    tenant_id text NOT NULL,
    assistant_id uuid,
    tools jsonb NOT NULL DEFAULT '[]',
    metadata jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT assistant_runs_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    CONSTRAINT assistant_runs_assistant_fk FOREIGN KEY (assistant_id, tenant_id)
        REFERENCES {s}.assistants (id, tenant_id)
);
COMMENT ON TABLE {s}.assistant_runs IS
    'the assistant, declared tools and metadata of a run started through outbox serve';

-- Tenant isolation as for every tenant table (migrations 0002 and 0018).
ALTER TABLE {s}.api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.api_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.api_keys TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.api_keys TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.api_keys FOR SELECT TO outbox_auditor USING (true);

ALTER TABLE {s}.assistants ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.assistants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.assistants TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.assistants TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.assistants FOR SELECT TO outbox_auditor USING (true);

ALTER TABLE {s}.assistant_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.assistant_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.assistant_runs TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.assistant_runs TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.assistant_runs FOR SELECT TO outbox_auditor USING (true);

GRANT SELECT, INSERT, UPDATE ON {s}.assistants, {s}.assistant_runs TO outbox_api;
GRANT SELECT ON {s}.assistants, {s}.assistant_runs, {s}.api_keys TO outbox_auditor;
