-- 0049: model options reach the model: start_run_v3 takes them.
-- Frozen: what revision 0049 applies, forever.
--
-- * model_options_problem_v1: what is wrong with a run's model options, or NULL.
-- * start_run_v3: start_run_v2 with p_model_options (sampling, reasoning, the output cap,
--   the service tier, the cache key and identifiers, logprobs, include, the tool options,
--   max_tool_calls and the context budget), stored in runs.model_options and journaled
--   with run.created; start_run_v2 calls it without them.
-- * run_span_events_v1: also the cached tokens of a turn, for its chat span.

COMMENT ON COLUMN {s}.runs.model_options IS
    'what the run passes to its model beside the history and the tools, on every turn, in '
    'the Responses API''s terms (outbox/providers.py writes them per API; docs/models.md)';


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
    ON CONFLICT (dedup_key) DO NOTHING;
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


REVOKE ALL ON FUNCTION {s}.start_run_v3(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric, text, text, jsonb)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.model_options_problem_v1(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.start_run_v3(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric, text, text, jsonb),
                          {s}.model_options_problem_v1(jsonb)
    TO outbox_writer, outbox_api;


-- run_span_events_v1: what the trace exporter (outbox/traces.py) builds a run's chat and
-- execute_tool spans from: each journal event of the runs that carries an attempt's span
-- as the relay timed it (model_turn.recorded, tool_result.stored, *.retry_scheduled,
-- *.quarantined, *.outcome_unknown, write.fenced), and each run's run.created (its absence
-- says the journal was pruned past the run's start: its attempts' spans are gone). Only
-- what a span carries leaves the journal (no payload reference); an error's text is in
-- "error", which the exporter puts in a span only with content capture on. Runs as the
-- schema owner (SECURITY DEFINER): outbox_relay, whose role the exporter uses, reads no
-- journal otherwise. p_since (the earliest creation of the runs) spares the journal's
-- partitions older than any of them: every event of a run is journaled after it began.
CREATE OR REPLACE FUNCTION {s}.run_span_events_v1(p_run_ids uuid[], p_since timestamptz)
RETURNS TABLE (run_id uuid, event text, at timestamptz, tool_call_ref bigint, attempt integer,
               detail jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.run_id, j.event, j.at, j.tool_call_ref, j.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'span', j.detail->'span', 'step_no', j.detail->'step_no',
               'input_tokens', j.detail->'input_tokens',
               'output_tokens', j.detail->'output_tokens',
               'cached_tokens', j.detail->'cached_tokens',
               'status', j.detail->'status', 'error', j.detail->'error'))
    FROM {s}.journal j
    WHERE j.run_id = ANY(p_run_ids) AND j.at >= p_since
      AND (j.detail ? 'span' OR j.event = 'run.created')
    ORDER BY j.run_id, j.id
$$;
