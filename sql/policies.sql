-- Who may do what: the grants of the outbox roles on the schema's tables and views, and
-- the row-level security that keeps each tenant to its own rows. `{s}` is the schema.
--
-- This file is every grant on a table or view and every policy as the newest migration
-- leaves them (tests/migration/test_history.py checks it, and that nothing the migrations
-- grant or create is missing here). The grants of functions are beside each function, in
-- the function files; the roles in roles.sql. Each migration carries a frozen copy of what
-- it grants or creates: to change one, edit it here and add a migration that carries the
-- change.
--
-- Applied after roles.sql, the function files and views.sql (the policies ask
-- current_tenant_v1(), the grants name the views), as the schema owner: CURRENT_USER below
-- is the role that owns the tables and runs the migrations. Re-applying changes nothing:
-- GRANT and ENABLE are idempotent, each policy is dropped if present and created again. A
-- right granted by hand beyond these is left as it is.


-- Grants ----------------------------------------------------------------------------------

-- Every outbox role may name the schema's objects; what it may do with each is below.
GRANT USAGE ON SCHEMA {s} TO outbox_writer, outbox_relay, outbox_auditor, outbox_api;

-- outbox_writer (backends): its tenant's conversations and the intents of its runs, as the
-- writer API and the SQL API write them (UPDATE: statuses and counters).
GRANT SELECT, INSERT, UPDATE ON {s}.threads, {s}.runs, {s}.messages, {s}.model_turns,
    {s}.tool_batches, {s}.tool_calls, {s}.tool_results, {s}.orphaned_results, {s}.submissions
    TO outbox_writer;
-- outbox_writer enqueues work and asks for approvals (INSERT; SELECT for ON CONFLICT ...
-- RETURNING) but holds no UPDATE or DELETE on the outbox, so it cannot claim (FOR UPDATE
-- needs UPDATE), lease or finish a row, nor decide an approval but through
-- decide_approval_v1.
GRANT SELECT, INSERT ON {s}.outbox, {s}.approvals TO outbox_writer;
-- outbox_writer appends its events to the journal and reads none of them.
GRANT INSERT ON {s}.journal TO outbox_writer;
-- outbox_writer reads what starting a run and recording a turn check: the registry, its
-- budget, the risk rules, kill switches and pauses, prices, limits and run defaults.
GRANT SELECT ON {s}.tools, {s}.tenant_budgets, {s}.risk_policies, {s}.tool_switches,
    {s}.tenant_pauses, {s}.model_prices, {s}.platform_limits, {s}.run_defaults
    TO outbox_writer;
-- outbox_writer counts what its turns used against its budget; only the owner sets one.
GRANT UPDATE (tokens_used, cost_used, updated_at) ON {s}.tenant_budgets TO outbox_writer;

-- outbox_relay (workers): the same conversation tables, and approvals it expires, for
-- every tenant (the all_tenants policies below).
GRANT SELECT, INSERT, UPDATE ON {s}.threads, {s}.runs, {s}.messages, {s}.model_turns,
    {s}.tool_batches, {s}.tool_calls, {s}.tool_results, {s}.orphaned_results, {s}.submissions,
    {s}.approvals
    TO outbox_relay;
-- outbox_relay claims, leases and completes outbox rows; a done row is deleted.
GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.outbox TO outbox_relay;
-- outbox_relay appends its events to the journal and reads none of them.
GRANT INSERT ON {s}.journal TO outbox_relay;
-- outbox_relay reads what a claim and a call need: the registry, budgets, rules, switches,
-- pauses, prices, limits, run defaults, the credentials it attaches to calls and the
-- endpoints it delivers webhooks to.
GRANT SELECT ON {s}.tools, {s}.tenant_budgets, {s}.risk_policies, {s}.tool_switches,
    {s}.tenant_pauses, {s}.model_prices, {s}.platform_limits, {s}.run_defaults,
    {s}.credentials, {s}.webhook_endpoints
    TO outbox_relay;
-- outbox_relay reads how to reach the MCP servers whose tools it calls.
GRANT SELECT ON {s}.mcp_servers TO outbox_relay;
-- outbox_relay updates a lane's row with every claim that takes its work, and records each
-- webhook delivery's attempts.
GRANT SELECT, UPDATE ON {s}.lanes, {s}.webhook_deliveries TO outbox_relay;
-- outbox_relay counts what the turns it records used against their tenant's budget.
GRANT UPDATE (tokens_used, cost_used, updated_at) ON {s}.tenant_budgets TO outbox_relay;

-- outbox_auditor (DBAs, auditors): the journal and the views of views.sql, every tenant.
-- The views run with their owner's rights, so it needs no right on the tables underneath.
GRANT SELECT ON {s}.journal, {s}.run_timeline, {s}.stuck_runs, {s}.duplicate_executions,
    {s}.orphaned_results_report, {s}.tool_stats, {s}.queue_lag
    TO outbox_auditor;
-- outbox_auditor reads the configuration and what operators and the server decided: budgets,
-- lanes, approvals, rules, switches, pauses, prices, limits, defaults, API keys (hashes),
-- assistants, webhooks and responses.
GRANT SELECT ON {s}.tenant_budgets, {s}.lanes, {s}.approvals, {s}.risk_policies,
    {s}.tool_switches, {s}.tenant_pauses, {s}.model_prices, {s}.platform_limits,
    {s}.run_defaults, {s}.api_keys, {s}.assistants, {s}.assistant_runs, {s}.webhook_endpoints,
    {s}.webhook_deliveries, {s}.responses
    TO outbox_auditor;
-- outbox_auditor reads the MCP servers registered but their header and environment values
-- (they may hold secrets).
GRANT SELECT (tenant_id, name, transport, url, command, credential_ref, trusted, prefix,
              timeout_s, settle_s, max_attempts, max_concurrency, overrides, synced_at,
              created_at, deadline_s) ON {s}.mcp_servers TO outbox_auditor;
-- outbox_auditor reads the retention policies and the archive of retained runs (the
-- functions of retention.sql write them; no role is granted more).
GRANT SELECT ON {s}.retention_policies, {s}.archived_runs TO outbox_auditor;
-- The bodies stored by reference: the writer, relay and server roles read them
-- through resolved_text_v1 and resolved_json_v1, each its tenant's; only the trigger
-- functions and the sweep (as the owner) write or delete them. outbox_auditor reads no
-- body, as it reads no result: the owner resolves the journal's references
-- (journal_payloads).
GRANT SELECT ON {s}.payloads TO outbox_writer, outbox_relay, outbox_api;
-- outbox_auditor reads every column of a credential but its ciphertext.
GRANT SELECT (tenant_id, name, source, reference, header, scheme, version, updated_by,
              updated_at, revoked_at) ON {s}.credentials TO outbox_auditor;

-- outbox_api (`outbox serve`, inside a request, scoped to the key's tenant): what
-- outbox_writer may, granted directly rather than by membership (granting a role needs
-- its ADMIN option, which a schema owner that is not a superuser does not hold) ...
GRANT SELECT, INSERT, UPDATE ON {s}.threads, {s}.runs, {s}.messages, {s}.model_turns,
    {s}.tool_batches, {s}.tool_calls, {s}.tool_results, {s}.orphaned_results, {s}.submissions
    TO outbox_api;
GRANT SELECT, INSERT ON {s}.outbox, {s}.approvals TO outbox_api;
GRANT SELECT ON {s}.tenant_budgets, {s}.risk_policies, {s}.tool_switches, {s}.tenant_pauses,
    {s}.model_prices, {s}.platform_limits, {s}.run_defaults
    TO outbox_api;
-- ... plus reading its tenant's journal (the run event stream) and registering its
-- tenant's client tools (function tools a caller declares) ...
GRANT SELECT, INSERT ON {s}.journal, {s}.tools TO outbox_api;
-- ... and the objects of the Assistants and Responses protocols: assistants (deletable),
-- their runs, responses (deleted only by marking deleted_at), webhook deliveries (read).
GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.assistants TO outbox_api;
GRANT SELECT, INSERT, UPDATE ON {s}.assistant_runs TO outbox_api;
GRANT SELECT, INSERT ON {s}.responses TO outbox_api;
GRANT UPDATE (deleted_at) ON {s}.responses TO outbox_api;
GRANT SELECT ON {s}.webhook_deliveries TO outbox_api;

-- Model fallbacks, circuits and routing rules (outbox/routing.py): the relay reads the
-- fallbacks and the rules it routes turns by, and reads and writes the circuit of each base
-- URL (report_model_calls_v1, claim_model_probe_v1); operators set the rest as the owner.
GRANT SELECT ON {s}.model_fallbacks, {s}.model_routes TO outbox_relay, outbox_auditor;
GRANT SELECT, INSERT, UPDATE ON {s}.model_circuits TO outbox_relay;
GRANT SELECT ON {s}.model_circuits TO outbox_auditor;
-- The model catalogue (windows and output limits) is read by every role that starts runs
-- or prepares turns; the summaries of compacted threads are written by the relay, which
-- records them with the turn that compacted, and read by the tenant's own roles.
GRANT SELECT ON {s}.model_catalogue TO outbox_writer, outbox_relay, outbox_auditor, outbox_api;
GRANT SELECT, INSERT ON {s}.compactions TO outbox_relay;
GRANT SELECT ON {s}.compactions TO outbox_writer, outbox_api;

-- Every session reads its own row of tenant_roles (the own_mapping policy below).
-- current_tenant_v1(), which row-level security asks, reads it as the owner.
GRANT SELECT ON {s}.tenant_roles TO PUBLIC;
-- The journal is append-only: nobody is granted UPDATE, DELETE or TRUNCATE on it, and the
-- triggers of triggers.sql refuse them even to its owner.
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.journal FROM PUBLIC;


-- Row-level security ----------------------------------------------------------------------
--
-- Every table with tenant_id has ENABLE and FORCE ROW LEVEL SECURITY (FORCE: the owner is
-- held to the policies too) and three permissive policies, ORed per role:
--   tenant_isolation (every role): the rows of the tenant this session acts for,
--     current_tenant_v1() (the tenant its login role is bound to, else the transaction's
--     outbox.tenant_id); a written row must be of that tenant. A session that acts for no
--     tenant sees no rows.
--   all_tenants (outbox_relay, and CURRENT_USER: the owner, whom FORCE would otherwise lock
--     out of its own tables): every row.
--   audit_read (outbox_auditor, SELECT only): every row.
-- lanes, model_prices, model_catalogue, platform_limits, run_defaults, model_fallbacks and
-- model_circuits hold no tenant's rows (limits, prices, windows, fallbacks and circuits
-- over every tenant) and have no row-level security: their grants are the whole rule.

-- threads: a tenant's threads (conversations).
ALTER TABLE {s}.threads ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.threads;
CREATE POLICY tenant_isolation ON {s}.threads TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.threads;
CREATE POLICY all_tenants ON {s}.threads TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.threads;
CREATE POLICY audit_read ON {s}.threads FOR SELECT TO outbox_auditor USING (true);

-- runs: a tenant's runs.
ALTER TABLE {s}.runs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.runs;
CREATE POLICY tenant_isolation ON {s}.runs TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.runs;
CREATE POLICY all_tenants ON {s}.runs TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.runs;
CREATE POLICY audit_read ON {s}.runs FOR SELECT TO outbox_auditor USING (true);

-- messages: a tenant's messages, the history replayed to models.
ALTER TABLE {s}.messages ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.messages;
CREATE POLICY tenant_isolation ON {s}.messages TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.messages;
CREATE POLICY all_tenants ON {s}.messages TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.messages;
CREATE POLICY audit_read ON {s}.messages FOR SELECT TO outbox_auditor USING (true);

-- model_turns: a tenant's model turns (responses, tokens, cost).
ALTER TABLE {s}.model_turns ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.model_turns;
CREATE POLICY tenant_isolation ON {s}.model_turns TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.model_turns;
CREATE POLICY all_tenants ON {s}.model_turns TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.model_turns;
CREATE POLICY audit_read ON {s}.model_turns FOR SELECT TO outbox_auditor USING (true);

-- tool_batches: a tenant's batches of tool calls, one per model turn that asked for tools.
ALTER TABLE {s}.tool_batches ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tool_batches;
CREATE POLICY tenant_isolation ON {s}.tool_batches TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tool_batches;
CREATE POLICY all_tenants ON {s}.tool_batches TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tool_batches;
CREATE POLICY audit_read ON {s}.tool_batches FOR SELECT TO outbox_auditor USING (true);

-- tool_calls: a tenant's tool-call intents.
ALTER TABLE {s}.tool_calls ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tool_calls;
CREATE POLICY tenant_isolation ON {s}.tool_calls TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tool_calls;
CREATE POLICY all_tenants ON {s}.tool_calls TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tool_calls;
CREATE POLICY audit_read ON {s}.tool_calls FOR SELECT TO outbox_auditor USING (true);

-- tool_results: a tenant's tool results.
ALTER TABLE {s}.tool_results ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tool_results;
CREATE POLICY tenant_isolation ON {s}.tool_results TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tool_results;
CREATE POLICY all_tenants ON {s}.tool_results TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tool_results;
CREATE POLICY audit_read ON {s}.tool_results FOR SELECT TO outbox_auditor USING (true);

-- orphaned_results: a tenant's results that arrived for a closed batch or an ended run.
ALTER TABLE {s}.orphaned_results ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.orphaned_results;
CREATE POLICY tenant_isolation ON {s}.orphaned_results TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.orphaned_results;
CREATE POLICY all_tenants ON {s}.orphaned_results TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.orphaned_results;
CREATE POLICY audit_read ON {s}.orphaned_results FOR SELECT TO outbox_auditor USING (true);

-- submissions: a tenant's submissions of a batch's outputs.
ALTER TABLE {s}.submissions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.submissions;
CREATE POLICY tenant_isolation ON {s}.submissions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.submissions;
CREATE POLICY all_tenants ON {s}.submissions TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.submissions;
CREATE POLICY audit_read ON {s}.submissions FOR SELECT TO outbox_auditor USING (true);

-- outbox: a tenant's queued work (the relay claims every tenant's).
ALTER TABLE {s}.outbox ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.outbox;
CREATE POLICY tenant_isolation ON {s}.outbox TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.outbox;
CREATE POLICY all_tenants ON {s}.outbox TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.outbox;
CREATE POLICY audit_read ON {s}.outbox FOR SELECT TO outbox_auditor USING (true);

-- tools: a tenant's tools, and the shared ('*') ones.
ALTER TABLE {s}.tools ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tools;
CREATE POLICY tenant_isolation ON {s}.tools TO PUBLIC
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tools;
CREATE POLICY all_tenants ON {s}.tools TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tools;
CREATE POLICY audit_read ON {s}.tools FOR SELECT TO outbox_auditor USING (true);

-- mcp_servers: a tenant's MCP tool servers, and the shared ('*') ones.
ALTER TABLE {s}.mcp_servers ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.mcp_servers;
CREATE POLICY tenant_isolation ON {s}.mcp_servers TO PUBLIC
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.mcp_servers;
CREATE POLICY all_tenants ON {s}.mcp_servers TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.mcp_servers;
CREATE POLICY audit_read ON {s}.mcp_servers FOR SELECT TO outbox_auditor USING (true);

-- journal: a tenant's journal events (its triggers in triggers.sql keep it append-only).
ALTER TABLE {s}.journal ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.journal;
CREATE POLICY tenant_isolation ON {s}.journal TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.journal;
CREATE POLICY all_tenants ON {s}.journal TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.journal;
CREATE POLICY audit_read ON {s}.journal FOR SELECT TO outbox_auditor USING (true);

-- compactions: the summaries of a tenant's compacted threads.
ALTER TABLE {s}.compactions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.compactions;
CREATE POLICY tenant_isolation ON {s}.compactions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.compactions;
CREATE POLICY all_tenants ON {s}.compactions TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.compactions;
CREATE POLICY audit_read ON {s}.compactions FOR SELECT TO outbox_auditor USING (true);

-- tenant_budgets: a tenant's budget (tokens and money) and what it used.
ALTER TABLE {s}.tenant_budgets ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tenant_budgets;
CREATE POLICY tenant_isolation ON {s}.tenant_budgets TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tenant_budgets;
CREATE POLICY all_tenants ON {s}.tenant_budgets TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tenant_budgets;
CREATE POLICY audit_read ON {s}.tenant_budgets FOR SELECT TO outbox_auditor USING (true);

-- approvals: a tenant's tool calls waiting for, or given, a decision.
ALTER TABLE {s}.approvals ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.approvals;
CREATE POLICY tenant_isolation ON {s}.approvals TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.approvals;
CREATE POLICY all_tenants ON {s}.approvals TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.approvals;
CREATE POLICY audit_read ON {s}.approvals FOR SELECT TO outbox_auditor USING (true);

-- risk_policies: a tenant's risk rules, and the shared ('*') ones.
ALTER TABLE {s}.risk_policies ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.risk_policies;
CREATE POLICY tenant_isolation ON {s}.risk_policies TO PUBLIC
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.risk_policies;
CREATE POLICY all_tenants ON {s}.risk_policies TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.risk_policies;
CREATE POLICY audit_read ON {s}.risk_policies FOR SELECT TO outbox_auditor USING (true);

-- tool_switches: tools switched off for a tenant, or for every tenant ('*').
ALTER TABLE {s}.tool_switches ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tool_switches;
CREATE POLICY tenant_isolation ON {s}.tool_switches TO PUBLIC
    USING (tenant_id IN ((SELECT {s}.current_tenant_v1()), '*'))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tool_switches;
CREATE POLICY all_tenants ON {s}.tool_switches TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tool_switches;
CREATE POLICY audit_read ON {s}.tool_switches FOR SELECT TO outbox_auditor USING (true);

-- tenant_pauses: a tenant's pause (the relay claims none of its rows).
ALTER TABLE {s}.tenant_pauses ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.tenant_pauses;
CREATE POLICY tenant_isolation ON {s}.tenant_pauses TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.tenant_pauses;
CREATE POLICY all_tenants ON {s}.tenant_pauses TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tenant_pauses;
CREATE POLICY audit_read ON {s}.tenant_pauses FOR SELECT TO outbox_auditor USING (true);

-- credentials: a tenant's credentials (references, or ciphertext the relay decrypts).
ALTER TABLE {s}.credentials ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.credentials;
CREATE POLICY tenant_isolation ON {s}.credentials TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.credentials;
CREATE POLICY all_tenants ON {s}.credentials TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.credentials;
CREATE POLICY audit_read ON {s}.credentials FOR SELECT TO outbox_auditor USING (true);

-- api_keys: a tenant's API keys (hashes); every key for the owner only, not the relay.
ALTER TABLE {s}.api_keys ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.api_keys;
CREATE POLICY tenant_isolation ON {s}.api_keys TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.api_keys;
CREATE POLICY all_tenants ON {s}.api_keys TO CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.api_keys;
CREATE POLICY audit_read ON {s}.api_keys FOR SELECT TO outbox_auditor USING (true);

-- console_users, console_sessions: the console's accounts and sessions; the owner only (the
-- server reads them through the console_*_v1 functions); outbox_auditor reads who may sign
-- in (and their subject at the OpenID Connect provider), not their password hashes or
-- sessions.
ALTER TABLE {s}.console_users ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.console_users;
CREATE POLICY tenant_isolation ON {s}.console_users TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.console_users;
CREATE POLICY all_tenants ON {s}.console_users TO CURRENT_USER USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.console_users;
CREATE POLICY audit_read ON {s}.console_users FOR SELECT TO outbox_auditor USING (true);
ALTER TABLE {s}.console_sessions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.console_sessions;
CREATE POLICY tenant_isolation ON {s}.console_sessions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.console_sessions;
CREATE POLICY all_tenants ON {s}.console_sessions TO CURRENT_USER
    USING (true) WITH CHECK (true);
GRANT SELECT (name, tenant_id, role, failed_attempts, locked_until, created_at, oidc_subject)
    ON {s}.console_users TO outbox_auditor;

-- assistants: a tenant's assistants (Assistants protocol).
ALTER TABLE {s}.assistants ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.assistants;
CREATE POLICY tenant_isolation ON {s}.assistants TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.assistants;
CREATE POLICY all_tenants ON {s}.assistants TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.assistants;
CREATE POLICY audit_read ON {s}.assistants FOR SELECT TO outbox_auditor USING (true);

-- assistant_runs: the Assistants-protocol side of a tenant's runs.
ALTER TABLE {s}.assistant_runs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.assistant_runs;
CREATE POLICY tenant_isolation ON {s}.assistant_runs TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.assistant_runs;
CREATE POLICY all_tenants ON {s}.assistant_runs TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.assistant_runs;
CREATE POLICY audit_read ON {s}.assistant_runs FOR SELECT TO outbox_auditor USING (true);

-- webhook_endpoints: a tenant's webhook endpoints (the relay delivers to them).
ALTER TABLE {s}.webhook_endpoints ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.webhook_endpoints;
CREATE POLICY tenant_isolation ON {s}.webhook_endpoints TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.webhook_endpoints;
CREATE POLICY all_tenants ON {s}.webhook_endpoints TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.webhook_endpoints;
CREATE POLICY audit_read ON {s}.webhook_endpoints FOR SELECT TO outbox_auditor USING (true);

-- webhook_deliveries: a tenant's webhook deliveries (the relay records attempts).
ALTER TABLE {s}.webhook_deliveries ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.webhook_deliveries;
CREATE POLICY tenant_isolation ON {s}.webhook_deliveries TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.webhook_deliveries;
CREATE POLICY all_tenants ON {s}.webhook_deliveries TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.webhook_deliveries;
CREATE POLICY audit_read ON {s}.webhook_deliveries FOR SELECT TO outbox_auditor USING (true);

-- responses: a tenant's responses (Responses protocol).
ALTER TABLE {s}.responses ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.responses;
CREATE POLICY tenant_isolation ON {s}.responses TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.responses;
CREATE POLICY all_tenants ON {s}.responses TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.responses;
CREATE POLICY audit_read ON {s}.responses FOR SELECT TO outbox_auditor USING (true);

-- retention_policies: a tenant's retention policy ('*': the default, seen by the owner).
ALTER TABLE {s}.retention_policies ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.retention_policies;
CREATE POLICY tenant_isolation ON {s}.retention_policies TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.retention_policies;
CREATE POLICY all_tenants ON {s}.retention_policies TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.retention_policies;
CREATE POLICY audit_read ON {s}.retention_policies FOR SELECT TO outbox_auditor USING (true);

-- archived_runs: a tenant's retained runs (its partitions have row-level security and no
-- policy: they are read through archived_runs).
ALTER TABLE {s}.archived_runs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.archived_runs;
CREATE POLICY tenant_isolation ON {s}.archived_runs TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.archived_runs;
CREATE POLICY all_tenants ON {s}.archived_runs TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.archived_runs;
CREATE POLICY audit_read ON {s}.archived_runs FOR SELECT TO outbox_auditor USING (true);

-- payloads: a tenant's bodies stored by reference.
ALTER TABLE {s}.payloads ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.payloads;
CREATE POLICY tenant_isolation ON {s}.payloads TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.payloads;
CREATE POLICY all_tenants ON {s}.payloads TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);

-- model_routes: a tenant's routing rules, by version (outbox/routing.py).
ALTER TABLE {s}.model_routes ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.model_routes;
CREATE POLICY tenant_isolation ON {s}.model_routes TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.model_routes;
CREATE POLICY all_tenants ON {s}.model_routes TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.model_routes;
CREATE POLICY audit_read ON {s}.model_routes FOR SELECT TO outbox_auditor USING (true);

-- tenant_roles: login roles bound to a tenant. Each session sees its own mapping only (what
-- current_tenant_v1() reads); the owner (`outbox tenants grant`) sees and changes them all.
ALTER TABLE {s}.tenant_roles ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_mapping ON {s}.tenant_roles;
CREATE POLICY own_mapping ON {s}.tenant_roles FOR SELECT TO PUBLIC
    USING (role_name = session_user);
DROP POLICY IF EXISTS all_mappings ON {s}.tenant_roles;
CREATE POLICY all_mappings ON {s}.tenant_roles TO CURRENT_USER USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.tenant_roles;
CREATE POLICY audit_read ON {s}.tenant_roles FOR SELECT TO outbox_auditor USING (true);
