-- Runs: what a run's status means and the dedup keys of its queue rows; opening a
-- conversation, starting, ending and cancelling a run (the SQL API a backend calls, and the
-- one implementation the Python writer calls too). `{s}` is the schema.


-- The run status sets and the outbox's dedup-key formats, defined once for SQL (their
-- Python twins are in outbox/constants.py; tests/integration/test_record_tool_results.py
-- checks that both agree). Plain SQL expressions, IMMUTABLE: the planner inlines them, so
-- a query that calls one plans as if the literal were written in it (partial indexes
-- still match).

-- run_active_v1: a run that can still move (the one-active-run-per-thread index covers
-- exactly these statuses).
CREATE OR REPLACE FUNCTION {s}.run_active_v1(p_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('queued', 'in_progress', 'requires_action')
$$;

-- run_ended_v1: a run that is over; nothing of it starts again.
CREATE OR REPLACE FUNCTION {s}.run_ended_v1(p_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('completed', 'failed', 'cancelled', 'expired')
$$;

-- run_over_v1: a run whose work may not start any more: it ended, or it waits in
-- requires_action past its deadline (expired from that moment by the database clock,
-- whether or not a sweep has recorded it yet). A row of such a run leaves the queue
-- instead of being claimed, retried, parked or rescued, and outputs for it are refused.
-- STABLE (it reads now()) and plain SQL: inlined where it is called.
CREATE OR REPLACE FUNCTION {s}.run_over_v1(p_status text, p_action_deadline timestamptz)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT {s}.run_ended_v1(p_status)
        OR (p_status = 'requires_action' AND coalesce(p_action_deadline < now(), false))
$$;

-- deliver_key_v1: the dedup key of a batch's one delivery (outbox kind deliver_batch).
CREATE OR REPLACE FUNCTION {s}.deliver_key_v1(p_batch_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'deliver:' || p_batch_id::text
$$;

-- tool_call_key_v1: the dedup key of a tool call's outbox row (kind tool_call).
CREATE OR REPLACE FUNCTION {s}.tool_call_key_v1(p_tool_call_ref bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'tool_call:' || p_tool_call_ref::text
$$;

-- model_turn_key_v1: the dedup key of a run's model turn at a step (kind model_turn).
CREATE OR REPLACE FUNCTION {s}.model_turn_key_v1(p_run_id uuid, p_step_no integer)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'model_turn:' || p_run_id::text || ':' || p_step_no::text
$$;


-- create_thread_v1: "open a conversation for this tenant".
--
--   SELECT outbox.create_thread_v1('tenant-a');
--   SELECT outbox.create_thread_v1('tenant-a', p_title => 'refunds',
--       p_messages => '[{"role": "system", "content": "You are the refunds desk."}]');
--
-- Returns the thread id. p_messages are opening messages (roles system, user, assistant),
-- stored in order. Journals thread.created. Runs with the caller's rights under the
-- tenant's row-level security (outbox_writer may call it).
CREATE OR REPLACE FUNCTION {s}.create_thread_v1(
    p_tenant_id text,
    p_title text DEFAULT NULL,
    p_metadata jsonb DEFAULT '{}',
    p_messages jsonb DEFAULT '[]'
) RETURNS uuid
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_thread uuid;
    v_cap    integer := coalesce(
                 nullif(current_setting('outbox.max_payload_bytes', true), '')::integer, 262144);
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    IF jsonb_typeof(coalesce(p_messages, '[]')) <> 'array'
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p_messages, '[]')) m
                  WHERE jsonb_typeof(m) <> 'object'
                     OR m->>'role' IS NULL OR m->>'role' NOT IN ('system', 'user', 'assistant')
                     OR jsonb_typeof(m->'content') IS DISTINCT FROM 'string') THEN
        RAISE EXCEPTION 'opening messages must be a JSON array of {"role", "content"}'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'roles are system, user and assistant; content is a string';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p_messages, '[]')) m
               WHERE octet_length(m->>'content') > v_cap) THEN
        RAISE EXCEPTION 'an opening message is over the cap of % bytes', v_cap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {s}.threads (tenant_id, title, metadata, next_seq)
    VALUES (p_tenant_id, p_title, coalesce(p_metadata, '{}'),
            1 + jsonb_array_length(coalesce(p_messages, '[]')))
    RETURNING id INTO v_thread;
    INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content)
    SELECT p_tenant_id, v_thread, m.n, m.value->>'role', m.value->>'content'
    FROM jsonb_array_elements(coalesce(p_messages, '[]')) WITH ORDINALITY AS m(value, n)
    ORDER BY m.n;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, detail)
    VALUES (p_tenant_id, 'thread.created', v_thread, '{}');
    RETURN v_thread;
END $$;


-- model_options_problem_v1: what is wrong with p_model_options of start_run_v3, in words
-- naming the option, or NULL when nothing is: a JSON object of the options outbox passes on
-- (docs/models.md), each of its type and range. outbox.schemas.ModelOptions checks the same
-- for Python callers before they get here.
CREATE OR REPLACE FUNCTION {s}.model_options_problem_v1(p_options jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_key   text;
    v_value jsonb;
    v_kind  text;
BEGIN
    IF p_options IS NULL OR jsonb_typeof(p_options) <> 'object' THEN
        RETURN 'must be a JSON object';
    END IF;
    FOR v_key, v_value IN SELECT * FROM jsonb_each(p_options) LOOP
        v_kind := jsonb_typeof(v_value);
        IF v_kind = 'null' THEN
            CONTINUE;
        ELSIF v_key = 'temperature' THEN
            IF v_kind <> 'number' OR (v_value::text)::numeric NOT BETWEEN 0 AND 2 THEN
                RETURN 'temperature is a number from 0 to 2';
            END IF;
        ELSIF v_key = 'top_p' THEN
            IF v_kind <> 'number' OR (v_value::text)::numeric NOT BETWEEN 0 AND 1 THEN
                RETURN 'top_p is a number from 0 to 1';
            END IF;
        ELSIF v_key IN ('max_output_tokens', 'max_tool_calls', 'max_prompt_tokens') THEN
            IF v_kind <> 'number' OR (v_value::text)::numeric <> trunc((v_value::text)::numeric)
               OR (v_value::text)::numeric < 1 THEN
                RETURN format('%s is a whole number over 0', v_key);
            END IF;
        ELSIF v_key = 'top_logprobs' THEN
            IF v_kind <> 'number' OR (v_value::text)::numeric <> trunc((v_value::text)::numeric)
               OR (v_value::text)::numeric NOT BETWEEN 0 AND 20 THEN
                RETURN 'top_logprobs is a whole number from 0 to 20';
            END IF;
        ELSIF v_key = 'parallel_tool_calls' THEN
            IF v_kind <> 'boolean' THEN
                RETURN 'parallel_tool_calls is true or false';
            END IF;
        ELSIF v_key IN ('verbosity', 'service_tier', 'truncation', 'prompt_cache_retention') THEN
            IF v_kind <> 'string' OR NOT (v_value #>> '{}') = ANY (CASE v_key
                    WHEN 'verbosity' THEN ARRAY['low', 'medium', 'high']
                    WHEN 'service_tier' THEN ARRAY['auto', 'default', 'flex', 'scale', 'priority']
                    WHEN 'truncation' THEN ARRAY['auto', 'disabled']
                    ELSE ARRAY['in-memory', '24h'] END) THEN
                RETURN format('%s %s is not one of its values', v_key, v_value);
            END IF;
        ELSIF v_key IN ('prompt_cache_key', 'safety_identifier', 'user') THEN
            IF v_kind <> 'string' OR length(v_value #>> '{}') NOT BETWEEN 1 AND 64 THEN
                RETURN format('%s is text of 1-64 characters', v_key);
            END IF;
        ELSIF v_key = 'reasoning' THEN
            IF v_kind <> 'object'
               OR EXISTS (SELECT 1 FROM jsonb_object_keys(v_value) k
                          WHERE k NOT IN ('effort', 'summary'))
               OR coalesce(v_value ->> 'effort', 'low')
                      NOT IN ('none', 'minimal', 'low', 'medium', 'high', 'xhigh')
               OR coalesce(v_value ->> 'summary', 'auto') NOT IN ('auto', 'concise', 'detailed') THEN
                RETURN 'reasoning is {"effort": none, minimal, low, medium, high or xhigh, "summary": auto, concise or detailed}';
            END IF;
        ELSIF v_key = 'include' THEN
            IF v_kind <> 'array' OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_value) e
                                            WHERE jsonb_typeof(e) <> 'string') THEN
                RETURN 'include is an array of names of output data';
            END IF;
        ELSIF v_key = 'tool_choice' THEN
            IF NOT (v_kind = 'string' AND v_value #>> '{}' IN ('none', 'auto', 'required'))
               AND NOT (v_kind = 'object' AND v_value ->> 'type' = 'function'
                        AND v_value ->> 'name' ~ '^[a-zA-Z0-9_-]{1,64}$') THEN
                RETURN 'tool_choice is none, auto, required or {"type": "function", "name": NAME}';
            END IF;
        ELSIF v_key IN ('format', 'truncation_strategy') THEN
            IF v_kind <> 'object' OR NOT v_value ? 'type' THEN
                RETURN format('%s is an object with a type', v_key);
            END IF;
        ELSE
            RETURN format('%s is not a model option outbox passes on', quote_literal(v_key));
        END IF;
    END LOOP;
    RETURN NULL;
END $$;


-- start_run_v3: "start a run on this thread with this user turn".
--
--   SELECT * FROM outbox.start_run_v3('tenant-a', '5b0c…'::uuid, 'gpt-5',
--       p_message => 'Refund order 42', p_tools => ARRAY['lookup_order', 'refund'],
--       p_idempotency_key => 'request-7f3a',
--       p_traceparent => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
--       p_model_options => '{"temperature": 0, "reasoning": {"effort": "low"}}');
--
-- Returns (run_id, status, created, correlation_id). In one go, all or nothing: the user
-- message, the run, its first model turn queued for the relay (outbox row
-- model_turn:<run>:1) and the journal event run.created. Guarantees:
--   * the same p_idempotency_key again returns the existing run with created = false, also
--     when two requests race; the key on another thread raises OB002;
--   * while the thread has an active run (queued, in_progress, requires_action), another
--     turn raises OB001, whose DETAIL is {"thread_id", "run_id", "status"} (the active run);
--   * unknown tools raise P0002; a thread that does not exist, that row-level
--     security hides, or that was deleted (deleted_at, 0026) raises P0002; one of another tenant (for roles that see every
--     tenant) raises OB004;
--   * a tenant whose token budget is spent raises OB003;
--   * bad arguments raise 22023 naming the argument.
-- p_traceparent and p_tracestate: the W3C trace context the run continues (the backend's
-- span that starts it), stored with the run: every span of the run (its model turns and
-- tool calls, recorded by whichever relay works on them) joins that trace, and tools and
-- models receive it (docs/operations.md, "Traces"). A resend with the same idempotency key
-- keeps the first request's.
-- p_model_options: what the run passes to its model on every turn beside the history, in
-- the Responses API's terms (docs/models.md); model_options_problem_v1 refuses a key or a
-- value no model could take (22023 naming it). Kept in runs.model_options and journaled
-- with run.created.
-- Locks the thread, then the run: a run is inserted only under its thread's lock. Runs
-- with the caller's rights under the tenant's row-level security (outbox_writer may call
-- it). p_action_timeout_s, p_max_steps and p_loop_limit default to outbox.run_defaults, the
-- one source of the defaults of new runs for SQL and the Python writer API alike (`outbox
-- platform defaults`); the first model turn's attempts to the outbox column's default, as
-- every later turn's.
CREATE OR REPLACE FUNCTION {s}.start_run_v3(
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
    p_max_cost numeric DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
    p_tracestate text DEFAULT NULL,
    p_model_options jsonb DEFAULT '{}'
) RETURNS TABLE (run_id uuid, status text, created boolean, correlation_id text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     {s}.runs;
    v_thread  {s}.threads;
    v_active  {s}.runs;
    v_missing text[];
    v_pins    jsonb;
    v_budget  {s}.tenant_budgets;
    v_default {s}.run_defaults;
    v_seq     integer;
    v_problem text := {s}.model_options_problem_v1(p_model_options);
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
    ELSIF p_traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
          OR p_traceparent ~ '^00-0{32}-' OR p_traceparent ~ '-0{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'p_traceparent must be a W3C traceparent (00-<32 hex digits, trace id>-<16 hex digits, parent id>-<2 hex digits, flags>, lower case, ids not all zero), not %', quote_literal(p_traceparent)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the traceparent header of the request that starts the run as it came, or NULL';
    ELSIF p_tracestate IS NOT NULL AND (p_traceparent IS NULL OR length(p_tracestate) > 512) THEN
        RAISE EXCEPTION 'p_tracestate must come with p_traceparent and be at most 512 characters'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'p_model_options: %', v_problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'docs/models.md lists the options and their values';
    ELSIF octet_length(p_model_options::text) > v_cap THEN
        RAISE EXCEPTION 'p_model_options are over the cap of % bytes', v_cap
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
    ELSIF v_thread.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'thread % was deleted at %', p_thread_id, v_thread.deleted_at
            USING ERRCODE = 'no_data_found', HINT = 'start the run on a new thread';
    END IF;
    SELECT * INTO v_active FROM {s}.runs r
    WHERE r.thread_id = p_thread_id AND {s}.run_active_v1(r.status);
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
        -- Money as it was priced and set: a cost is a quotient with twenty decimals.
        RAISE EXCEPTION 'tenant % used % tokens and % in money; its budget is % tokens and % in money',
                        quote_literal(p_tenant_id), v_budget.tokens_used,
                        trim_scale(v_budget.cost_used),
                        coalesce(v_budget.max_tokens::text, 'no limit on'),
                        coalesce(v_budget.max_cost::text, 'no limit')
            USING ERRCODE = 'OB003', HINT = 'raise the tenant''s budget (`outbox tenants budget`)';
    END IF;
    SELECT * INTO v_default FROM {s}.run_defaults;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the defaults of new runs are missing: outbox.run_defaults has no row'
            USING ERRCODE = 'no_data_found',
                  HINT = 'set them again with `outbox platform defaults --max-steps N`';
    END IF;

    INSERT INTO {s}.runs AS r (tenant_id, thread_id, model, api, base_url, instructions,
                               tool_names, tool_pins, max_steps, max_tokens, max_cost,
                               loop_limit, action_timeout, idempotency_key, correlation_id,
                               traceparent, tracestate, model_options)
    VALUES (p_tenant_id, p_thread_id, p_model, p_api, p_base_url, p_instructions,
            coalesce(p_tools, '{}'), v_pins, coalesce(p_max_steps, v_default.max_steps),
            p_max_tokens, p_max_cost, coalesce(p_loop_limit, v_default.loop_limit),
            make_interval(secs => coalesce(p_action_timeout_s, v_default.action_timeout_s)),
            p_idempotency_key,
            coalesce(p_correlation_id, replace(gen_random_uuid()::text, '-', '')),
            p_traceparent, p_tracestate, p_model_options)
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
                            payload)
    VALUES (p_tenant_id, 'model_turn', {s}.model_turn_key_v1(v_run.id, 1), p_thread_id, v_run.id,
            v_run.correlation_id, '{"step_no": 1}')
    ON CONFLICT (dedup_key, tenant_id) DO NOTHING;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    VALUES (p_tenant_id, 'run.created', p_thread_id, v_run.id, v_run.correlation_id,
            jsonb_build_object('model', p_model, 'tools', to_jsonb(coalesce(p_tools, '{}')),
                               'tool_versions', v_pins, 'model_options', p_model_options));
    RETURN QUERY SELECT v_run.id, v_run.status, true, v_run.correlation_id;
END $$;


-- start_run_v2: start_run_v3 without model options; kept for callers written against it.
CREATE OR REPLACE FUNCTION {s}.start_run_v2(
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
    p_max_cost numeric DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
    p_tracestate text DEFAULT NULL
) RETURNS TABLE (run_id uuid, status text, created boolean, correlation_id text)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM {s}.start_run_v3(p_tenant_id, p_thread_id, p_model, p_message, p_tools,
                                   p_idempotency_key, p_api, p_base_url, p_instructions,
                                   p_max_steps, p_max_tokens, p_loop_limit, p_action_timeout_s,
                                   p_correlation_id, p_max_cost, p_traceparent, p_tracestate)
$$;


-- start_run_v1: start_run_v2 without a trace context (the run starts a trace of its own);
-- kept for callers written against it.
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
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM {s}.start_run_v2(p_tenant_id, p_thread_id, p_model, p_message, p_tools,
                                   p_idempotency_key, p_api, p_base_url, p_instructions,
                                   p_max_steps, p_max_tokens, p_loop_limit, p_action_timeout_s,
                                   p_correlation_id, p_max_cost)
$$;


-- same_run_request_v1: the run an idempotency key already started, if the request is the
-- same (thread, user message, model and set of tools; the order of the tools is not part
-- of it); else OB002 naming what differs. A helper of start_run_v2.
CREATE OR REPLACE FUNCTION {s}.same_run_request_v1(
    p_run {s}.runs, p_thread_id uuid, p_idempotency_key text, p_message text, p_model text,
    p_tools text[]
) RETURNS TABLE (run_id uuid, status text, created boolean, correlation_id text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_message text;
    v_differ  text[] := '{}';
BEGIN
    SELECT m.content INTO v_message FROM {s}.messages m
    WHERE m.thread_id = p_run.thread_id AND m.run_id = p_run.id AND m.role = 'user'
    ORDER BY m.seq LIMIT 1;
    IF p_run.thread_id <> p_thread_id THEN
        v_differ := v_differ || 'thread'::text;
    END IF;
    IF v_message IS DISTINCT FROM p_message THEN
        v_differ := v_differ || 'message'::text;
    END IF;
    IF p_run.model IS DISTINCT FROM p_model THEN
        v_differ := v_differ || 'model'::text;
    END IF;
    IF ARRAY(SELECT DISTINCT t FROM unnest(coalesce(p_run.tool_names, '{}')) t ORDER BY t)
       <> ARRAY(SELECT DISTINCT t FROM unnest(coalesce(p_tools, '{}')) t ORDER BY t) THEN
        v_differ := v_differ || 'tools'::text;
    END IF;
    IF cardinality(v_differ) > 0 THEN
        RAISE EXCEPTION 'idempotency key % already started run % with another %',
                        quote_literal(p_idempotency_key), p_run.id,
                        array_to_string(v_differ, ' and ')
            USING ERRCODE = 'OB002',
                  HINT = 'use a new key for a new turn; resend a turn with exactly its first request';
    END IF;
    RETURN QUERY SELECT p_run.id, p_run.status, false, p_run.correlation_id;
END $$;


-- end_run_v1: end a run (failed, cancelled or expired) and keep its thread replayable.
--
-- The one implementation of ending a run: the Python writer (writer.end_run: the relay's
-- step cap, budget, loop and expiry) and cancel_run_v1 call it. Every batch whose outputs
-- did not reach the history is closed and each of its calls gets a tool message at once
-- (its result, or an error that claims no more than is known, as answer_calls); rows nobody
-- holds a lease on leave the outbox (no new claims); work in flight finishes and its
-- results land in orphaned_results. Journals batch.closed per batch and run.<status>.
-- Locks the run, then its batches. Not for backends (EXECUTE: the relay role).
CREATE OR REPLACE FUNCTION {s}.end_run_v1(
    p_run_id uuid, p_status text, p_reason text, p_error text DEFAULT NULL,
    p_actor text DEFAULT NULL
) RETURNS {s}.runs
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     {s}.runs;
    v_batch   {s}.tool_batches;
    v_why     text := format('the run was %s (%s)', p_status, p_reason);
    v_closed  integer := 0;
    v_answers integer;
    v_dropped jsonb;
BEGIN
    IF p_status NOT IN ('failed', 'cancelled', 'expired') THEN
        RAISE EXCEPTION 'a run ends failed, cancelled or expired, not %', quote_nullable(p_status)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_batch IN SELECT * FROM {s}.tool_batches
                   WHERE run_id = p_run_id AND status IN ('open', 'complete')
                   ORDER BY id FOR UPDATE LOOP
        UPDATE {s}.tool_batches
        SET status = CASE WHEN p_status = 'expired' THEN 'expired' ELSE 'cancelled' END
        WHERE id = v_batch.id;
        UPDATE {s}.tool_calls SET status = 'cancelled', updated_at = now()
        WHERE batch_id = v_batch.id
          AND status IN ('pending', 'quarantined', 'awaiting_approval');
        -- A tool message for every call of the batch that has none, in call order (the
        -- statement of answer_calls in outbox/queries/writer.sql, for one batch).
        WITH answers AS (
            SELECT tc.tenant_id, tc.thread_id, tc.run_id, tc.position, tc.id AS ref,
                   CASE WHEN r.status = 'ok' AND jsonb_typeof(r.output) = 'string'
                            THEN r.output #>> '{}'
                        WHEN r.status = 'ok' THEN coalesce(r.output::text, 'null')
                        WHEN r.status = 'error' THEN jsonb_build_object('error', r.error)::text
                        WHEN tc.executor = 'client' THEN jsonb_build_object(
                            'error', 'no output: ' || v_why
                                     || ' before an output of this call was submitted')::text
                        WHEN tc.attempts > 0 OR tc.dispatched_attempt IS NOT NULL
                             OR EXISTS (SELECT 1 FROM {s}.outbox o
                                        WHERE o.dedup_key = {s}.tool_call_key_v1(tc.id)
                                          AND o.attempts > 0
                                        OFFSET 0)
                            THEN jsonb_build_object(
                            'error', 'outcome unknown: ' || v_why
                                     || ' while an attempt of this call may have been under'
                                     || ' way; it may have taken effect, and a result that'
                                     || ' arrives later is kept out of this conversation')::text
                        ELSE jsonb_build_object('error', 'not executed: ' || v_why)::text
                   END AS content
            FROM {s}.tool_calls tc
            LEFT JOIN (SELECT x.tool_call_ref, x.status, x.error,
                              {s}.resolved_json_v1(x.output, x.tenant_id, x.output_ref) AS output
                       FROM {s}.tool_results x) r ON r.tool_call_ref = tc.id
            WHERE tc.batch_id = v_batch.id
              AND NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.tool_call_ref = tc.id)
        ), numbered AS (
            SELECT a.*, count(*) OVER () AS n, row_number() OVER (ORDER BY a.position) AS k
            FROM answers a
        ), seqs AS (
            UPDATE {s}.threads t SET next_seq = t.next_seq + w.n
            FROM (SELECT DISTINCT n FROM numbered) w
            WHERE t.id = v_batch.thread_id
            RETURNING t.next_seq - w.n AS first_seq
        )
        INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id, tool_call_ref)
        SELECT m.tenant_id, m.thread_id, s.first_seq + m.k - 1, 'tool', m.content, m.run_id, m.ref
        FROM numbered m CROSS JOIN seqs s
        ORDER BY m.k;
        GET DIAGNOSTICS v_answers = ROW_COUNT;
        v_closed := v_closed + v_answers;
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, correlation_id,
                                 detail)
        VALUES (v_batch.tenant_id, 'batch.closed', v_batch.thread_id, p_run_id, v_batch.id,
                v_run.correlation_id,
                jsonb_build_object('status', CASE WHEN p_status = 'expired' THEN 'expired'
                                                  ELSE 'cancelled' END,
                                   'answered_calls', v_answers, 'why', v_why));
    END LOOP;
    WITH dropped AS (
        DELETE FROM {s}.outbox WHERE run_id = p_run_id AND status IN ('ready', 'quarantined')
        RETURNING kind
    )
    SELECT coalesce(jsonb_agg(kind), '[]') INTO v_dropped FROM dropped;
    UPDATE {s}.runs
    SET status = p_status, failure_reason = p_reason,
        last_error = coalesce(p_error, last_error), action_deadline = NULL, ended_at = now(),
        updated_at = now()
    WHERE id = p_run_id
    RETURNING * INTO v_run;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, actor, detail)
    VALUES (v_run.tenant_id, 'run.' || p_status, v_run.thread_id, p_run_id, v_run.correlation_id,
            p_actor, jsonb_build_object('reason', p_reason, 'error', p_error,
                                        'closed_calls', v_closed, 'dropped_rows', v_dropped));
    RETURN v_run;
END $$;
REVOKE ALL ON FUNCTION {s}.end_run_v1(uuid, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.end_run_v1(uuid, text, text, text, text) TO outbox_relay;


-- cancel_run_v1: "stop this run".
--
--   SELECT status FROM outbox.cancel_run_v1('tenant-a', '9f1c…'::uuid, p_actor => 'ops@acme');
--
-- Returns the run's row, now cancelled. No new claims; calls in flight finish and their
-- results land in orphaned_results; every call of an undelivered batch gets a tool message
-- at once, so the thread is replayable and a new run may start on it (see end_run_v1).
-- The run is marked agent_span_due (and cancelled_by): the trace exporter builds its
-- invoke_agent span once this commits (outbox/trace_export.py; every run that ends is marked
-- by the runs_span_due trigger). A run that does not exist for the tenant
-- raises P0002; one that already ended raises OB005. Runs as the schema owner (SECURITY
-- DEFINER: ending a run removes outbox rows, which outbox_writer may not delete) and
-- refuses a tenant other than the session's scope.
CREATE OR REPLACE FUNCTION {s}.cancel_run_v1(
    p_tenant_id text, p_run_id uuid, p_actor text DEFAULT NULL
) RETURNS {s}.runs
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run {s}.runs;
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND OR v_run.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'run % does not exist for tenant %', p_run_id, quote_literal(p_tenant_id)
            USING ERRCODE = 'no_data_found', HINT = 'check the run id and the tenant';
    END IF;
    IF {s}.run_ended_v1(v_run.status) THEN
        RAISE EXCEPTION 'run % is already %: there is nothing to cancel', p_run_id, v_run.status
            USING ERRCODE = 'OB005', HINT = 'start a new run on the thread if more work is needed';
    END IF;
    PERFORM {s}.end_run_v1(p_run_id, 'cancelled', 'cancelled', 'cancelled by request',
                           coalesce(p_actor, session_user));
    UPDATE {s}.runs
    SET agent_span_due = true, cancelled_by = coalesce(p_actor, session_user)
    WHERE id = p_run_id
    RETURNING * INTO v_run;
    RETURN v_run;
END $$;

REVOKE ALL ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.start_run_v2(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric, text, text)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.start_run_v3(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric, text, text, jsonb)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.model_options_problem_v1(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.cancel_run_v1(text, uuid, text) FROM PUBLIC;
-- The relay starts, creates and cancels nothing.
GRANT EXECUTE ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb),
                          {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric),
                          {s}.start_run_v2(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric, text, text),
                          {s}.start_run_v3(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric, text, text, jsonb),
                          {s}.model_options_problem_v1(jsonb),
                          {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                          {s}.cancel_run_v1(text, uuid, text)
    TO outbox_writer, outbox_api;  -- outbox_api: the requests of `outbox serve`