-- 0017: runs pin their tool versions when they start, and budgets in money (issue 17).
-- Frozen: what revision 0017 applies, forever.

-- The tool versions a run was given: a new registration never changes the schema or the
-- endpoint a running conversation was given.
ALTER TABLE {s}.runs ADD COLUMN tool_pins jsonb NOT NULL DEFAULT '{}'::jsonb;
COMMENT ON COLUMN {s}.runs.tool_pins IS
    'the tool versions the run was started with: {"name": {"tenant_id", "version"}}; '
    'a run without pins (started before 0017) uses the newest versions';

-- Prices per model (per million tokens, in the one currency the platform bills in), so
-- that runs and tenants can have budgets in money beside tokens.
CREATE TABLE {s}.model_prices (
    model                 text PRIMARY KEY CHECK (model <> ''),
    input_per_mtok        numeric NOT NULL CHECK (input_per_mtok >= 0),
    cached_input_per_mtok numeric CHECK (cached_input_per_mtok >= 0),
    output_per_mtok       numeric NOT NULL CHECK (output_per_mtok >= 0),
    updated_by            text NOT NULL DEFAULT session_user,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE {s}.model_prices IS
    'price per million tokens of each model (input, cached input: input''s price when '
    'NULL, output), in the platform''s currency: what budgets in money count';
GRANT SELECT ON {s}.model_prices TO outbox_writer, outbox_relay, outbox_auditor;

ALTER TABLE {s}.model_turns
    ADD COLUMN cached_tokens integer NOT NULL DEFAULT 0 CHECK (cached_tokens >= 0),
    ADD COLUMN cost numeric CHECK (cost >= 0);
COMMENT ON COLUMN {s}.model_turns.cost IS
    'what the turn cost by model_prices when it was recorded; NULL: the model had no price';
ALTER TABLE {s}.runs
    ADD COLUMN max_cost numeric CHECK (max_cost > 0),
    ADD COLUMN cost numeric NOT NULL DEFAULT 0 CHECK (cost >= 0);
ALTER TABLE {s}.tenant_budgets
    ALTER COLUMN max_tokens DROP NOT NULL,
    ADD COLUMN max_cost numeric CHECK (max_cost > 0),
    ADD COLUMN cost_used numeric NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    ADD CONSTRAINT tenant_budgets_limit_something
        CHECK (max_tokens IS NOT NULL OR max_cost IS NOT NULL);
-- Whoever records turns counts their cost, as it counts their tokens.
GRANT UPDATE (cost_used) ON {s}.tenant_budgets TO outbox_writer, outbox_relay;

-- Limits over every run of every tenant: one row.
CREATE TABLE {s}.platform_limits (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    max_steps  integer CHECK (max_steps > 0),
    updated_by text NOT NULL DEFAULT session_user,
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE {s}.platform_limits IS
    'limits over every run: max_steps caps any run''s model turns, whatever it asked for';
GRANT SELECT ON {s}.platform_limits TO outbox_writer, outbox_relay, outbox_auditor;

-- start_run_v1 gains p_max_cost (last, optional: calls written for 0010 still work) and
-- pins the run's tool versions.
DROP FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                               integer, bigint, integer, double precision, text);

-- start_run_v1: "start a run on this thread with this user turn".
--
--   SELECT * FROM outbox.start_run_v1('tenant-a', '5b0c…'::uuid, 'gpt-5',
--       p_message => 'Refund order 42', p_tools => ARRAY['lookup_order', 'refund'],
--       p_idempotency_key => 'request-7f3a');
--
-- Returns (run_id, status, created, correlation_id). In one go, all or nothing: the user
-- message, the run, its first model turn queued for the relay (outbox row
-- model_turn:<run>:1) and the journal event run.created. Guarantees:
--   * the same p_idempotency_key again returns the existing run with created = false, also
--     when two requests race; the key on another thread raises OB002;
--   * while the thread has an active run (queued, in_progress, requires_action), another
--     turn raises OB001, whose DETAIL is {"thread_id", "run_id", "status"} (the active run);
--   * unknown tools raise P0002; a thread that does not exist, or that row-level
--     security hides, raises P0002; one of another tenant (for roles that see every
--     tenant) raises OB004;
--   * a tenant whose token budget is spent raises OB003;
--   * bad arguments raise 22023 naming the argument.
-- Locks the thread, then the run: a run is inserted only under its thread's lock. Runs
-- with the caller's rights under the tenant's row-level security (outbox_writer may call
-- it). p_action_timeout_s, p_max_steps and p_loop_limit default to the columns' defaults.
CREATE OR REPLACE FUNCTION {s}.start_run_v1(
    p_tenant_id text,
    p_thread_id uuid,
    p_model text,
    p_message text DEFAULT NULL,
    p_tools text[] DEFAULT '{}',
    p_idempotency_key text DEFAULT NULL,
    p_api text DEFAULT 'responses',
    p_base_url text DEFAULT NULL,
    p_instructions text DEFAULT NULL,
    p_max_steps integer DEFAULT NULL,
    p_max_tokens bigint DEFAULT NULL,
    p_loop_limit integer DEFAULT NULL,
    p_action_timeout_s double precision DEFAULT NULL,
    p_correlation_id text DEFAULT NULL,
    p_max_cost numeric DEFAULT NULL
) RETURNS TABLE (run_id uuid, status text, created boolean, correlation_id text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     {s}.runs;
    v_thread  {s}.threads;
    v_active  {s}.runs;
    v_missing text[];
    v_pins    jsonb;
    v_budget  {s}.tenant_budgets;
    v_seq     integer;
    v_cap     integer := coalesce(
                  nullif(current_setting('outbox.max_payload_bytes', true), '')::integer, 262144);
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    IF p_model IS NULL OR length(p_model) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'p_model must be 1-200 characters' USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_api IS NULL OR p_api NOT IN ('responses', 'chat') THEN
        RAISE EXCEPTION 'p_api must be responses or chat, not %', quote_nullable(p_api)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_idempotency_key IS NOT NULL AND length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'p_idempotency_key must be 1-255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF cardinality(coalesce(p_tools, '{}')) > 128
          OR EXISTS (SELECT 1 FROM unnest(p_tools) t WHERE t IS NULL OR t !~ '^[a-zA-Z0-9_-]{1,64}$') THEN
        RAISE EXCEPTION 'p_tools must be at most 128 tool names (letters, digits, _ and -)'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF coalesce(p_max_steps, 1) NOT BETWEEN 1 AND 10000 OR coalesce(p_max_tokens, 1) < 1
          OR coalesce(p_loop_limit, 2) < 2 OR coalesce(p_action_timeout_s, 1) <= 0
          OR coalesce(p_max_cost, 1) <= 0 THEN
        RAISE EXCEPTION 'limits out of range: max_steps 1-10000, max_tokens > 0, loop_limit > 1, action_timeout_s > 0, max_cost > 0'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_max_cost IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM {s}.model_prices mp WHERE mp.model = p_model) THEN
        RAISE EXCEPTION 'a budget in money needs the price of model %, and it has none', quote_literal(p_model)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'set it with `outbox prices set MODEL --input X --output Y`';
    ELSIF octet_length(p_message) > v_cap OR octet_length(p_instructions) > v_cap THEN
        RAISE EXCEPTION 'the message or the instructions are over the cap of % bytes', v_cap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO v_run FROM {s}.runs r
        WHERE r.tenant_id = p_tenant_id AND r.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM {s}.same_run_request_v1(v_run, p_thread_id, p_idempotency_key, p_message, p_model, p_tools);
            RETURN;
        END IF;
    END IF;
    SELECT * INTO v_thread FROM {s}.threads t WHERE t.id = p_thread_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'thread % does not exist', p_thread_id
            USING ERRCODE = 'no_data_found', HINT = 'check the thread id';
    ELSIF v_thread.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'thread % does not belong to tenant %', p_thread_id, quote_literal(p_tenant_id)
            USING ERRCODE = 'OB004', HINT = 'pass the tenant that owns the object';
    END IF;
    SELECT * INTO v_active FROM {s}.runs r
    WHERE r.thread_id = p_thread_id AND r.status IN ('queued', 'in_progress', 'requires_action');
    IF FOUND THEN
        IF p_idempotency_key IS NOT NULL THEN  -- a twin with our key may have committed meanwhile
            SELECT * INTO v_run FROM {s}.runs r
            WHERE r.tenant_id = p_tenant_id AND r.idempotency_key = p_idempotency_key;
            IF FOUND THEN
                RETURN QUERY SELECT * FROM {s}.same_run_request_v1(v_run, p_thread_id, p_idempotency_key, p_message, p_model, p_tools);
                RETURN;
            END IF;
        END IF;
        RAISE EXCEPTION 'thread % already has active run % (%)', p_thread_id, v_active.id, v_active.status
            USING ERRCODE = 'OB001',
                  DETAIL = json_build_object('thread_id', p_thread_id, 'run_id', v_active.id,
                                            'status', v_active.status)::text,
                  HINT = format('wait for run %s to finish, cancel it, or resend this turn with the same idempotency key', v_active.id);
    END IF;
    SELECT array_agg(t ORDER BY t) INTO v_missing FROM unnest(p_tools) t
    WHERE NOT EXISTS (SELECT 1 FROM {s}.tools tl
                      WHERE tl.name = t AND tl.tenant_id IN (p_tenant_id, '*'));
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'unknown tools %: they are not in the tool registry', v_missing
            USING ERRCODE = 'no_data_found', HINT = 'register them first (`outbox tools register`)';
    END IF;
    -- Pin each tool's version now: a later registration never changes what this run's
    -- conversation was given (its own version before a shared one, the newest).
    SELECT coalesce(jsonb_object_agg(p.name, jsonb_build_object('tenant_id', p.tenant_id,
                                                                'version', p.version)), '{}')
    INTO v_pins
    FROM (SELECT DISTINCT ON (tl.name) tl.name, tl.tenant_id, tl.version FROM {s}.tools tl
          WHERE tl.name = ANY(p_tools) AND tl.tenant_id IN (p_tenant_id, '*')
          ORDER BY tl.name, (tl.tenant_id = '*'), tl.version DESC) p;
    SELECT * INTO v_budget FROM {s}.tenant_budgets b
    WHERE b.tenant_id = p_tenant_id
      AND (b.tokens_used >= b.max_tokens OR b.cost_used >= b.max_cost);
    IF FOUND THEN
        RAISE EXCEPTION 'tenant % used % tokens and % in money; its budget is % tokens and % in money',
                        quote_literal(p_tenant_id), v_budget.tokens_used, v_budget.cost_used,
                        coalesce(v_budget.max_tokens::text, 'no limit on'),
                        coalesce(v_budget.max_cost::text, 'no limit')
            USING ERRCODE = 'OB003', HINT = 'raise the tenant''s budget (`outbox tenants budget`)';
    END IF;

    INSERT INTO {s}.runs AS r (tenant_id, thread_id, model, api, base_url, instructions,
                               tool_names, tool_pins, max_steps, max_tokens, max_cost,
                               loop_limit, action_timeout, idempotency_key, correlation_id)
    VALUES (p_tenant_id, p_thread_id, p_model, p_api, p_base_url, p_instructions,
            coalesce(p_tools, '{}'), v_pins, coalesce(p_max_steps, 20), p_max_tokens, p_max_cost,
            coalesce(p_loop_limit, 3), make_interval(secs => coalesce(p_action_timeout_s, 600)),
            p_idempotency_key,
            coalesce(p_correlation_id, replace(gen_random_uuid()::text, '-', '')))
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING * INTO v_run;
    IF NOT FOUND THEN  -- the same key won a race on another thread of this tenant
        SELECT * INTO v_run FROM {s}.runs r
        WHERE r.tenant_id = p_tenant_id AND r.idempotency_key = p_idempotency_key;
        RETURN QUERY SELECT * FROM {s}.same_run_request_v1(v_run, p_thread_id, p_idempotency_key, p_message, p_model, p_tools);
        RETURN;
    END IF;
    IF p_message IS NOT NULL THEN
        UPDATE {s}.threads t SET next_seq = t.next_seq + 1 WHERE t.id = p_thread_id
        RETURNING t.next_seq - 1 INTO v_seq;
        INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id)
        VALUES (p_tenant_id, p_thread_id, v_seq, 'user', p_message, v_run.id);
    END IF;
    INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, correlation_id,
                            max_attempts, payload)
    VALUES (p_tenant_id, 'model_turn', 'model_turn:' || v_run.id || ':1', p_thread_id, v_run.id,
            v_run.correlation_id, 5, '{"step_no": 1}')
    ON CONFLICT (dedup_key) DO NOTHING;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    VALUES (p_tenant_id, 'run.created', p_thread_id, v_run.id, v_run.correlation_id,
            jsonb_build_object('model', p_model, 'tools', to_jsonb(coalesce(p_tools, '{}')),
                               'tool_versions', v_pins));
    RETURN QUERY SELECT v_run.id, v_run.status, true, v_run.correlation_id;
END $$;

REVOKE ALL ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric)
    TO outbox_writer, outbox_relay;
