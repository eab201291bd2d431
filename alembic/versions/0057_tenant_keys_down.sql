-- 0056 down: the keys, the view and the functions as revision 0054 made them.

ALTER TABLE {s}.messages DROP CONSTRAINT messages_thread_fk;
ALTER TABLE {s}.responses DROP CONSTRAINT responses_thread_fk;
ALTER TABLE {s}.runs DROP CONSTRAINT runs_thread_fk;
ALTER TABLE {s}.approvals DROP CONSTRAINT approvals_run_fk;
ALTER TABLE {s}.assistant_runs DROP CONSTRAINT assistant_runs_run_fk;
ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_run_fk;
ALTER TABLE {s}.responses DROP CONSTRAINT responses_run_fk;
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_run_fk;
ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_message_fk;
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_message_fk;
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_message_fk;
ALTER TABLE {s}.approvals DROP CONSTRAINT approvals_call_fk;
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_call_fk;
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_call_fk;
ALTER TABLE {s}.messages DROP CONSTRAINT messages_tool_call_fk;
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_batch_fk;
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_batch_fk;
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_batch_fk;
ALTER TABLE {s}.assistant_runs DROP CONSTRAINT assistant_runs_assistant_fk;
ALTER TABLE {s}.webhook_deliveries DROP CONSTRAINT webhook_deliveries_endpoint_fk;
ALTER TABLE {s}.responses DROP CONSTRAINT responses_previous_fk;

ALTER TABLE {s}.threads DROP CONSTRAINT threads_pkey,
    ADD CONSTRAINT threads_pkey PRIMARY KEY (id),
    ADD CONSTRAINT threads_id_tenant_key UNIQUE (id, tenant_id);
ALTER TABLE {s}.runs DROP CONSTRAINT runs_pkey,
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id),
    ADD CONSTRAINT runs_id_tenant_key UNIQUE (id, tenant_id);
ALTER TABLE {s}.messages DROP CONSTRAINT messages_pkey,
    ADD CONSTRAINT messages_pkey PRIMARY KEY (id),
    ADD CONSTRAINT messages_id_tenant_key UNIQUE (id, tenant_id);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_pkey,
    ADD CONSTRAINT tool_calls_pkey PRIMARY KEY (id),
    ADD CONSTRAINT tool_calls_id_tenant_key UNIQUE (id, tenant_id);
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_pkey,
    ADD CONSTRAINT tool_batches_pkey PRIMARY KEY (id),
    ADD CONSTRAINT tool_batches_id_run_tenant_key UNIQUE (id, run_id, tenant_id);
ALTER TABLE {s}.assistants DROP CONSTRAINT assistants_pkey,
    ADD CONSTRAINT assistants_pkey PRIMARY KEY (id),
    ADD CONSTRAINT assistants_id_tenant_key UNIQUE (id, tenant_id);

ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_pkey,
    ADD CONSTRAINT model_turns_pkey PRIMARY KEY (id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_pkey,
    ADD CONSTRAINT tool_results_pkey PRIMARY KEY (tool_call_ref);
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_pkey,
    ADD CONSTRAINT orphaned_results_pkey PRIMARY KEY (id);
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_pkey,
    ADD CONSTRAINT submissions_pkey PRIMARY KEY (id);
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_pkey,
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
ALTER TABLE {s}.approvals DROP CONSTRAINT approvals_pkey,
    ADD CONSTRAINT approvals_pkey PRIMARY KEY (id);
ALTER TABLE {s}.assistant_runs DROP CONSTRAINT assistant_runs_pkey,
    ADD CONSTRAINT assistant_runs_pkey PRIMARY KEY (run_id);
ALTER TABLE {s}.webhook_endpoints DROP CONSTRAINT webhook_endpoints_pkey,
    ADD CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id);
ALTER TABLE {s}.webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);
ALTER TABLE {s}.responses DROP CONSTRAINT responses_pkey,
    ADD CONSTRAINT responses_pkey PRIMARY KEY (id);
ALTER TABLE {s}.compactions DROP CONSTRAINT compactions_pkey,
    ADD CONSTRAINT compactions_pkey PRIMARY KEY (id);
ALTER TABLE {s}.journal DROP CONSTRAINT journal_pkey,
    ADD CONSTRAINT journal_pkey PRIMARY KEY (id, at);
ALTER TABLE {s}.archived_runs DROP CONSTRAINT archived_runs_pkey,
    ADD CONSTRAINT archived_runs_pkey PRIMARY KEY (id, archived_at);

ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_run_step_key,
    ADD CONSTRAINT model_turns_run_step_key UNIQUE (run_id, step_no);
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_run_step_key,
    ADD CONSTRAINT tool_batches_run_step_key UNIQUE (run_id, step_no);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_run_call_key,
    ADD CONSTRAINT tool_calls_run_call_key UNIQUE (run_id, tool_call_id);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_batch_position_key,
    ADD CONSTRAINT tool_calls_batch_position_key UNIQUE (batch_id, "position");
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_id_thread_key,
    ADD CONSTRAINT tool_calls_id_thread_key UNIQUE (id, thread_id);
ALTER TABLE {s}.messages DROP CONSTRAINT messages_id_thread_key,
    ADD CONSTRAINT messages_id_thread_key UNIQUE (id, thread_id);
ALTER TABLE {s}.messages DROP CONSTRAINT messages_one_per_tool_call,
    ADD CONSTRAINT messages_one_per_tool_call UNIQUE (tool_call_ref);
ALTER TABLE {s}.messages DROP CONSTRAINT messages_thread_seq_key,
    ADD CONSTRAINT messages_thread_seq_key UNIQUE (thread_id, seq);
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_one_per_batch,
    ADD CONSTRAINT submissions_one_per_batch UNIQUE (batch_id);
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_dedup_key,
    ADD CONSTRAINT outbox_dedup_key UNIQUE (dedup_key);
ALTER TABLE {s}.approvals DROP CONSTRAINT approvals_one_per_call,
    ADD CONSTRAINT approvals_one_per_call UNIQUE (tool_call_ref);
ALTER TABLE {s}.webhook_deliveries DROP CONSTRAINT webhook_deliveries_once,
    ADD CONSTRAINT webhook_deliveries_once UNIQUE (endpoint_id, event_key);
ALTER TABLE {s}.compactions DROP CONSTRAINT compactions_one_per_step,
    ADD CONSTRAINT compactions_one_per_step UNIQUE (run_id, step_no);
DROP INDEX {s}.runs_one_active_per_thread;
CREATE UNIQUE INDEX runs_one_active_per_thread ON {s}.runs (thread_id)
    WHERE status IN ('queued', 'in_progress', 'requires_action');

ALTER TABLE {s}.messages ADD CONSTRAINT messages_thread_fk
    FOREIGN KEY (thread_id, tenant_id) REFERENCES {s}.threads (id, tenant_id);
ALTER TABLE {s}.responses ADD CONSTRAINT responses_thread_fk
    FOREIGN KEY (thread_id, tenant_id) REFERENCES {s}.threads (id, tenant_id);
ALTER TABLE {s}.runs ADD CONSTRAINT runs_thread_fk
    FOREIGN KEY (thread_id, tenant_id) REFERENCES {s}.threads (id, tenant_id);
ALTER TABLE {s}.approvals ADD CONSTRAINT approvals_run_fk
    FOREIGN KEY (run_id, tenant_id) REFERENCES {s}.runs (id, tenant_id);
ALTER TABLE {s}.assistant_runs ADD CONSTRAINT assistant_runs_run_fk
    FOREIGN KEY (run_id, tenant_id) REFERENCES {s}.runs (id, tenant_id);
ALTER TABLE {s}.model_turns ADD CONSTRAINT model_turns_run_fk
    FOREIGN KEY (run_id, tenant_id) REFERENCES {s}.runs (id, tenant_id);
ALTER TABLE {s}.responses ADD CONSTRAINT responses_run_fk
    FOREIGN KEY (run_id, tenant_id) REFERENCES {s}.runs (id, tenant_id);
ALTER TABLE {s}.submissions ADD CONSTRAINT submissions_run_fk
    FOREIGN KEY (run_id, tenant_id) REFERENCES {s}.runs (id, tenant_id);
ALTER TABLE {s}.model_turns ADD CONSTRAINT model_turns_message_fk
    FOREIGN KEY (message_id, tenant_id) REFERENCES {s}.messages (id, tenant_id);
ALTER TABLE {s}.tool_batches ADD CONSTRAINT tool_batches_message_fk
    FOREIGN KEY (message_id, thread_id) REFERENCES {s}.messages (id, thread_id);
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_message_fk
    FOREIGN KEY (message_id, thread_id) REFERENCES {s}.messages (id, thread_id);
ALTER TABLE {s}.approvals ADD CONSTRAINT approvals_call_fk
    FOREIGN KEY (tool_call_ref, tenant_id) REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.orphaned_results ADD CONSTRAINT orphaned_results_call_fk
    FOREIGN KEY (tool_call_ref, tenant_id) REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.tool_results ADD CONSTRAINT tool_results_call_fk
    FOREIGN KEY (tool_call_ref, tenant_id) REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.messages ADD CONSTRAINT messages_tool_call_fk
    FOREIGN KEY (tool_call_ref, thread_id) REFERENCES {s}.tool_calls (id, thread_id);
ALTER TABLE {s}.submissions ADD CONSTRAINT submissions_batch_fk
    FOREIGN KEY (batch_id, run_id, tenant_id) REFERENCES {s}.tool_batches (id, run_id, tenant_id);
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_batch_fk
    FOREIGN KEY (batch_id, run_id, tenant_id) REFERENCES {s}.tool_batches (id, run_id, tenant_id);
ALTER TABLE {s}.tool_results ADD CONSTRAINT tool_results_batch_fk
    FOREIGN KEY (batch_id, run_id, tenant_id) REFERENCES {s}.tool_batches (id, run_id, tenant_id);
ALTER TABLE {s}.assistant_runs ADD CONSTRAINT assistant_runs_assistant_fk
    FOREIGN KEY (assistant_id, tenant_id) REFERENCES {s}.assistants (id, tenant_id)
    ON DELETE SET NULL (assistant_id);
ALTER TABLE {s}.webhook_deliveries ADD CONSTRAINT webhook_deliveries_endpoint_id_fkey
    FOREIGN KEY (endpoint_id) REFERENCES {s}.webhook_endpoints (id);
ALTER TABLE {s}.responses ADD CONSTRAINT responses_previous_response_id_fkey
    FOREIGN KEY (previous_response_id) REFERENCES {s}.responses (id);

CREATE OR REPLACE VIEW {s}.duplicate_executions AS
WITH executions AS (
    SELECT tool_call_ref, created_at FROM {s}.tool_results
    WHERE source NOT IN ('validation', 'system')
    UNION ALL
    SELECT tool_call_ref, created_at FROM {s}.orphaned_results
    WHERE tool_call_ref IS NOT NULL
), per_call AS (
    SELECT tc.id, tc.tenant_id, tc.run_id, tc.tool_name, tc.arguments_hash,
           tc.idempotency_key, count(*) AS executions, min(e.created_at) AS first_at,
           max(e.created_at) AS last_at
    FROM executions e
    JOIN {s}.tool_calls tc ON tc.id = e.tool_call_ref
    GROUP BY tc.id
)
SELECT 'idempotency_key' AS kind, tenant_id, tool_name, arguments_hash, idempotency_key,
       executions, ARRAY[id] AS tool_call_refs, ARRAY[run_id] AS run_ids, first_at, last_at
FROM per_call
WHERE executions > 1
UNION ALL
SELECT 'fingerprint', tenant_id, tool_name, arguments_hash, NULL,
       sum(executions)::bigint, array_agg(id ORDER BY id), array_agg(DISTINCT run_id),
       min(first_at), max(last_at)
FROM per_call
GROUP BY tenant_id, tool_name, arguments_hash
HAVING count(*) > 1;

CREATE OR REPLACE FUNCTION {s}.record_model_turns_v1(p_turns jsonb, p_calls jsonb)
RETURNS TABLE (model_turn_id bigint, message_id bigint, batch_id bigint, tool_call_refs bigint[],
               run_status text, created boolean, loop_limit integer, recent_batches jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_run_ids uuid[];
    v_tenant  text;
    v_refusal record;
    v_new     bigint[];  -- positions (from 1) in p_turns of the turns to record
    v_ended   bigint[];  -- positions of the turns of runs that are over
    v_refused jsonb;     -- results of the calls refused when planned
    v_queued  jsonb;     -- the calls that get an outbox row
BEGIN
    IF jsonb_typeof(p_turns) IS DISTINCT FROM 'array'
       OR jsonb_typeof(p_calls) IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_turns) <> jsonb_array_length(p_calls) THEN
        RAISE EXCEPTION 'p_turns and p_calls must be JSON arrays of the same length'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass each turn''s list of calls at its turn''s position';
    END IF;
    v_run_ids := ARRAY(SELECT (t->>'run_id')::uuid FROM jsonb_array_elements(p_turns) t);
    FOR v_tenant IN
        SELECT t.turn->>'tenant_id' FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        GROUP BY 1 ORDER BY min(t.n)
    LOOP
        PERFORM {s}.enter_tenant_v1(v_tenant);
    END LOOP;
    PERFORM 1 FROM {s}.runs r WHERE r.id = ANY(v_run_ids) ORDER BY r.id FOR UPDATE;

    IF cardinality(v_run_ids) > 1
       AND cardinality(v_run_ids) > (SELECT count(DISTINCT id) FROM unnest(v_run_ids) id) THEN
        -- A run named twice (or a turn without one): one turn at a time, in order.
        RETURN QUERY
        SELECT r.*
        FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        CROSS JOIN LATERAL {s}.record_model_turns_v1(jsonb_build_array(t.turn),
                                                     jsonb_build_array(p_calls->(t.n::integer - 1))) r
        ORDER BY t.n;
        RETURN;
    END IF;
    SELECT (t.turn->>'run_id')::uuid AS run_id, t.turn->>'tenant_id' AS tenant_id,
           r.id IS NULL AS missing
    INTO v_refusal
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
    LEFT JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
    WHERE r.id IS NULL OR r.tenant_id <> t.turn->>'tenant_id'
    ORDER BY t.n LIMIT 1;
    IF FOUND AND v_refusal.missing THEN
        RAISE EXCEPTION 'run % does not exist', v_refusal.run_id
            USING ERRCODE = 'no_data_found', HINT = 'check the run id';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'run % does not belong to tenant %', v_refusal.run_id,
                        quote_literal(v_refusal.tenant_id)
            USING ERRCODE = 'OB004', HINT = 'pass the tenant that owns the object';
    END IF;

    -- A turn already recorded at its step is a repeat: nothing is written for it.
    SELECT coalesce(array_agg(t.n ORDER BY t.n) FILTER (WHERE NOT {s}.run_ended_v1(r.status)), '{}'),
           coalesce(array_agg(t.n ORDER BY t.n) FILTER (WHERE {s}.run_ended_v1(r.status)), '{}')
    INTO v_new, v_ended
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
    JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
    WHERE NOT EXISTS (SELECT 1 FROM {s}.model_turns mt
                      WHERE mt.run_id = r.id AND mt.step_no = (t.turn->>'step_no')::integer
                      OFFSET 0);

    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    SELECT r.tenant_id, 'model_turn.discarded', r.thread_id, r.id, r.correlation_id,
           jsonb_build_object('step_no', (t.turn->>'step_no')::integer,
                              'reason', 'run is ' || r.status)
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
    JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
    WHERE t.n = ANY(v_ended)
    ORDER BY t.n;

    -- The turns: messages (numbered in their threads), turns with their cost, the
    -- tenants' tokens, journal model_turn.recorded.
    WITH new AS (
        SELECT t.n, t.turn, r.id AS run_id, r.tenant_id, r.thread_id, r.correlation_id,
               coalesce(t.turn->>'model', r.model) AS model, t.turn->>'base_url' AS base_url,
               (t.turn->>'step_no')::integer AS step_no,
               coalesce((t.turn->>'input_tokens')::bigint, 0) AS input,
               coalesce((t.turn->>'output_tokens')::bigint, 0) AS output,
               coalesce((t.turn->>'cached_tokens')::bigint, 0) AS cached,
               jsonb_array_length(p_calls->(t.n::integer - 1)) AS calls
        FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
        WHERE t.n = ANY(v_new)
    ), numbered AS (
        UPDATE {s}.threads th SET next_seq = th.next_seq + 1
        FROM new WHERE th.id = new.thread_id
        RETURNING th.id AS thread_id, th.next_seq - 1 AS seq
    ), message AS (
        INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id, reasoning)
        SELECT new.tenant_id, new.thread_id, numbered.seq, 'assistant', new.turn->>'content',
               new.run_id, nullif(new.turn->'reasoning', 'null'::jsonb)
        FROM new JOIN numbered USING (thread_id)
        ORDER BY new.n
        RETURNING id, run_id
    ), turn AS (
        INSERT INTO {s}.model_turns (tenant_id, run_id, step_no, message_id, response_id,
                                     input_tokens, output_tokens, cached_tokens, cost, model,
                                     base_url)
        SELECT new.tenant_id, new.run_id, new.step_no, message.id, new.turn->>'response_id',
               new.input, new.output, new.cached,
               ((new.input - least(new.cached, new.input)) * p.input_per_mtok
                + least(new.cached, new.input) * coalesce(p.cached_input_per_mtok, p.input_per_mtok)
                + new.output * p.output_per_mtok) / 1000000,
               new.model, new.base_url
        FROM new
        JOIN message USING (run_id)
        LEFT JOIN {s}.model_prices p ON p.model = new.model
        ORDER BY new.n
        RETURNING run_id, cost
    ), spent AS (
        UPDATE {s}.tenant_budgets tb
        SET tokens_used = tb.tokens_used + s.tokens, cost_used = tb.cost_used + s.cost,
            updated_at = now()
        FROM (SELECT new.tenant_id, sum(new.input + new.output) AS tokens,
                     sum(coalesce(turn.cost, 0)) AS cost
              FROM new JOIN turn USING (run_id) GROUP BY new.tenant_id) s
        WHERE tb.tenant_id = s.tenant_id
    )
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    SELECT new.tenant_id, 'model_turn.recorded', new.thread_id, new.run_id, new.correlation_id,
           jsonb_build_object('step_no', new.step_no, 'tool_calls', new.calls,
                              'input_tokens', new.input, 'output_tokens', new.output,
                              'cached_tokens', new.cached, 'cost', turn.cost::text,
                              'model', new.model)
           || jsonb_strip_nulls(jsonb_build_object('span', new.turn->'span',
                                                   'base_url', new.base_url,
                                                   'route', new.turn->'route'))
    FROM new JOIN turn USING (run_id)
    ORDER BY new.n;

    -- The batches and each call's intent.
    WITH batch AS (
        INSERT INTO {s}.tool_batches (tenant_id, run_id, thread_id, step_no, message_id, status,
                                      size, pending)
        SELECT r.tenant_id, r.id, r.thread_id, mt.step_no, mt.message_id, 'open',
               jsonb_array_length(p_calls->(t.n::integer - 1)),
               jsonb_array_length(p_calls->(t.n::integer - 1))
        FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
        JOIN {s}.model_turns mt ON mt.run_id = r.id AND mt.step_no = (t.turn->>'step_no')::integer
        WHERE t.n = ANY(v_new) AND jsonb_array_length(p_calls->(t.n::integer - 1)) > 0
        ORDER BY t.n
        RETURNING id, tenant_id, run_id, thread_id, message_id, step_no
    )
    INSERT INTO {s}.tool_calls (tenant_id, run_id, thread_id, batch_id, message_id, position,
                                tool_call_id, tool_name, tool_version, arguments,
                                arguments_raw, arguments_hash, executor, idempotency_mode,
                                idempotency_key, status)
    SELECT b.tenant_id, b.run_id, b.thread_id, b.id, b.message_id, c.o - 1,
           c.call->>'tool_call_id', c.call->>'name', (c.call->>'version')::integer,
           nullif(c.call->'arguments', 'null'::jsonb), c.call->>'arguments_raw',
           c.call->>'arguments_hash', c.call->>'executor', c.call->>'idempotency_mode',
           c.call->>'idempotency_key', c.call->>'status'
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
    JOIN batch b ON b.run_id = (t.turn->>'run_id')::uuid
    CROSS JOIN LATERAL jsonb_array_elements(p_calls->(t.n::integer - 1)) WITH ORDINALITY AS c(call, o)
    ORDER BY t.n, c.o;

    -- Each call's approval, journal tool_call.intended (and approval.requested); then the
    -- outbox rows and the refused calls' results.
    WITH call AS (
        SELECT t.n, c.call, tc.id AS ref, tc.position, tc.tenant_id, tc.run_id, tc.thread_id,
               tc.batch_id, tc.tool_call_id, r.correlation_id,
               c.call->>'error' IS NULL AND c.call->>'executor' IS DISTINCT FROM 'client' AS queued,
               jsonb_typeof(c.call->'approval') = 'object' AS held
        FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid AND r.id = ANY(v_run_ids)
        JOIN {s}.tool_batches b ON b.run_id = r.id AND b.step_no = (t.turn->>'step_no')::integer
        CROSS JOIN LATERAL jsonb_array_elements(p_calls->(t.n::integer - 1)) WITH ORDINALITY AS c(call, o)
        JOIN {s}.tool_calls tc ON tc.batch_id = b.id AND tc.position = c.o - 1
        WHERE t.n = ANY(v_new)
    ), approval AS (
        INSERT INTO {s}.approvals (tenant_id, run_id, thread_id, batch_id, tool_call_ref,
                                   tool_call_id, tool_name, arguments_digest, rule, approvers,
                                   deadline)
        SELECT call.tenant_id, call.run_id, call.thread_id, call.batch_id, call.ref,
               call.tool_call_id, call.call->>'name', call.call->>'arguments_hash',
               call.call->'approval'->>'rule',
               ARRAY(SELECT jsonb_array_elements_text(call.call->'approval'->'approvers')),
               now() + make_interval(secs => (call.call->'approval'->>'timeout_s')::float8)
        FROM call WHERE call.queued AND call.held
        ORDER BY call.n, call.position
        RETURNING *
    ), journaled AS (
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                                 tool_call_id, correlation_id, detail)
        SELECT e.tenant_id, e.event, e.thread_id, e.run_id, e.batch_id, e.ref, e.tool_call_id,
               e.correlation_id, e.detail
        FROM (SELECT call.*, 1 AS k, 'tool_call.intended' AS event,
                     jsonb_build_object('tool', call.call->>'name',
                                        'executor', call.call->>'executor',
                                        'error', call.call->'error',
                                        'policy', call.call->'decision')
                     || jsonb_strip_nulls(jsonb_build_object(
                            'payload', CASE WHEN nullif(call.call->'arguments',
                                                        'null'::jsonb) IS NOT NULL
                                            THEN {s}.payload_ref_v1(
                                                     call.call->>'arguments_raw') END))
                         AS detail
              FROM call
              UNION ALL
              SELECT call.*, 2, 'approval.requested',
                     jsonb_build_object('approval_id', a.id, 'tool', a.tool_name,
                                        'arguments_digest', a.arguments_digest, 'rule', a.rule,
                                        'approvers', to_jsonb(a.approvers),
                                        'deadline', to_jsonb(a.deadline))
              FROM approval a JOIN call ON call.ref = a.tool_call_ref) e
        ORDER BY e.n, e.position, e.k
    )
    SELECT jsonb_agg(jsonb_build_object('ref', call.ref, 'status', 'error',
                                        'error', call.call->>'error', 'source', 'validation',
                                        'output', NULL, 'attempt', 0)
                     ORDER BY call.n, call.position) FILTER (WHERE call.call->>'error' IS NOT NULL),
           jsonb_agg(jsonb_build_object('ref', call.ref, 'held', call.held,
                                        'max_attempts', call.call->'max_attempts')
                     ORDER BY call.n, call.position) FILTER (WHERE call.queued)
    INTO v_refused, v_queued
    FROM call;
    -- Only a statement that inserts rows wakes the relays (the NOTIFY trigger is per statement).
    IF v_queued IS NOT NULL THEN
        INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                tool_call_ref, tool_name, correlation_id, max_attempts,
                                payload, available_at)
        SELECT tc.tenant_id, 'tool_call', {s}.tool_call_key_v1(tc.id), tc.thread_id, tc.run_id,
               tc.batch_id, tc.id, tc.tool_name, r.correlation_id, q.max_attempts, '{}',
               CASE WHEN q.held THEN 'infinity'::timestamptz ELSE now() END
        FROM jsonb_to_recordset(v_queued) AS q(ref bigint, held boolean, max_attempts integer)
        JOIN {s}.tool_calls tc ON tc.id = q.ref
        JOIN {s}.runs r ON r.id = tc.run_id AND r.id = ANY(v_run_ids)
        ORDER BY tc.id
        ON CONFLICT (dedup_key) DO NOTHING;
    END IF;
    IF v_refused IS NOT NULL THEN
        -- The one rule for results: stored, counted down, and the batch's delivery
        -- enqueued once if no call of it is left to run.
        PERFORM {s}.record_tool_results_v1(v_refused, NULL);
    END IF;

    -- The runs' new status (journal run.completed for a turn without calls).
    WITH outcome AS (
        SELECT t.n, mt.run_id, mt.step_no, mt.input_tokens::bigint + mt.output_tokens AS tokens,
               coalesce(mt.cost, 0) AS cost,
               CASE WHEN jsonb_array_length(p_calls->(t.n::integer - 1)) = 0 THEN 'completed'
                    WHEN EXISTS (SELECT 1 FROM jsonb_array_elements(p_calls->(t.n::integer - 1)) c
                                 WHERE c->>'error' IS NULL AND c->>'executor' = 'client')
                         THEN 'requires_action'
                    ELSE 'in_progress' END AS status
        FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
        JOIN {s}.model_turns mt ON mt.run_id = (t.turn->>'run_id')::uuid
                               AND mt.step_no = (t.turn->>'step_no')::integer
        WHERE t.n = ANY(v_new)
    ), moved AS (
        UPDATE {s}.runs r
        SET step_count = greatest(r.step_count, o.step_no),
            tokens_used = r.tokens_used + o.tokens,
            cost = r.cost + o.cost,
            status = o.status,
            action_deadline = CASE WHEN o.status = 'requires_action' THEN now() + r.action_timeout END,
            ended_at = CASE WHEN o.status = 'completed' THEN now() END,
            failure_reason = NULL,
            last_error = NULL,
            updated_at = now()
        FROM outcome o WHERE r.id = o.run_id
        RETURNING r.id, r.tenant_id, r.thread_id, r.correlation_id
    )
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    SELECT moved.tenant_id, 'run.completed', moved.thread_id, moved.id, moved.correlation_id, '{}'
    FROM moved JOIN outcome o ON o.run_id = moved.id
    WHERE o.status = 'completed'
    ORDER BY o.n;

    RETURN QUERY
    SELECT mt.id, mt.message_id, b.id,
           ARRAY(SELECT tc.id FROM {s}.tool_calls tc WHERE tc.batch_id = b.id ORDER BY tc.position),
           r.status, t.n = ANY(v_new), r.loop_limit,
           CASE WHEN t.n = ANY(v_new) AND b.id IS NOT NULL THEN
               (SELECT coalesce(jsonb_agg(jsonb_build_object('step_no', s.step_no,
                                                             'signature', s.signature)
                                          ORDER BY s.step_no DESC), '[]')
                FROM (SELECT rb.step_no,
                             array_agg(tc.arguments_hash ORDER BY tc.arguments_hash) AS signature
                      FROM {s}.tool_batches rb
                      JOIN {s}.tool_calls tc ON tc.batch_id = rb.id
                      WHERE rb.run_id = r.id AND rb.step_no <= mt.step_no
                      GROUP BY rb.step_no
                      ORDER BY rb.step_no DESC
                      LIMIT r.loop_limit * coalesce((t.turn->>'loop_periods')::integer, 1)) s)
           END
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(turn, n)
    JOIN {s}.runs r ON r.id = (t.turn->>'run_id')::uuid
    LEFT JOIN {s}.model_turns mt ON mt.run_id = r.id
                                AND mt.step_no = (t.turn->>'step_no')::integer
    LEFT JOIN {s}.tool_batches b ON b.run_id = r.id AND b.step_no = mt.step_no
    ORDER BY t.n;
END $$;

REVOKE ALL ON FUNCTION {s}.record_model_turns_v1(jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.record_model_turns_v1(jsonb, jsonb)
    TO outbox_writer, outbox_relay;  -- not outbox_api: `outbox serve` records no turns


-- record_model_turn_v1: record a model's response and the tool calls it asked for.
--
--   SELECT * FROM outbox.record_model_turn_v1(
--       '{"tenant_id": "tenant-a", "run_id": "9f1c…", "step_no": 1, "content": null,
--         "response_id": "resp_1", "input_tokens": 120, "output_tokens": 30,
--         "cached_tokens": 0}',
--       '[{"tool_call_id": "call_1", "name": "lookup_order", "version": 1,
--          "arguments": {"order_id": "42"}, "arguments_raw": "{\"order_id\": \"42\"}",
--          "arguments_hash": "…", "executor": "http", "idempotency_mode": "key",
--          "idempotency_key": "ob-…", "status": "pending", "error": null,
--          "decision": {"action": "allow", "rule": "…"}, "max_attempts": 5,
--          "approval": null}]');
--
-- record_model_turns_v1 for one turn: the same writes, the same row, the same errors.
CREATE OR REPLACE FUNCTION {s}.record_model_turn_v1(p_turn jsonb, p_calls jsonb)
RETURNS TABLE (model_turn_id bigint, message_id bigint, batch_id bigint, tool_call_refs bigint[],
               run_status text, created boolean, loop_limit integer, recent_batches jsonb)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM {s}.record_model_turns_v1(jsonb_build_array(p_turn), jsonb_build_array(p_calls))
$$;

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

CREATE OR REPLACE FUNCTION {s}.record_tool_results_v1(p_results jsonb, p_worker text)
RETURNS TABLE (ref bigint, outcome text, completed_batch bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_refs      bigint[];
    v_outcomes  text[];
    v_completed bigint[];
    v_attempts  integer[];
BEGIN
    v_refs := ARRAY(SELECT (e->>'ref')::bigint FROM jsonb_array_elements(p_results) e);
    PERFORM 1 FROM {s}.tool_batches b
    WHERE b.id IN (SELECT tc.batch_id FROM {s}.tool_calls tc WHERE tc.id = ANY(v_refs))
    ORDER BY b.id FOR UPDATE;

    -- Every lookup is by primary key or a unique index, whatever the size of the tables.
    WITH input AS (
        SELECT i.*, row_number() OVER () AS n
        FROM jsonb_to_recordset(p_results)
            AS i(ref bigint, status text, output jsonb, error text, source text,
                 attempt int, lag_s float8, span jsonb)
    ), calls AS (
        SELECT i.*, tc.tenant_id, tc.run_id, tc.thread_id, tc.batch_id, tc.tool_call_id,
               (SELECT b.status FROM {s}.tool_batches b WHERE b.id = tc.batch_id)
                   AS batch_status,
               (SELECT r.correlation_id FROM {s}.runs r WHERE r.id = tc.run_id)
                   AS correlation_id,
               EXISTS (SELECT 1 FROM {s}.tool_results x WHERE x.tool_call_ref = i.ref)
                   AS repeat
        FROM input i
        JOIN {s}.tool_calls tc ON tc.id = i.ref AND tc.id = ANY(v_refs)
    ), stored AS (
        INSERT INTO {s}.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status,
                                      output, error, attempt, source, worker)
        SELECT c.ref, c.tenant_id, c.run_id, c.batch_id, c.status, c.output, c.error,
               c.attempt, c.source, p_worker
        FROM calls c WHERE NOT c.repeat AND c.batch_status = 'open'
        ON CONFLICT (tool_call_ref) DO NOTHING
        RETURNING tool_call_ref, batch_id, status, error
    ), orphaned AS (
        -- The journal's insert reads it for every input row not stored, so it runs whenever
        -- there is something to keep (a CTE with a volatile function runs once, at most).
        SELECT k.tool_call_ref
        FROM {s}.keep_orphaned_results_v1(
            (SELECT jsonb_agg(jsonb_build_object(
                        'ref', c.ref, 'status', c.status, 'output', c.output,
                        'error', c.error, 'reason', 'batch_closed', 'source', c.source,
                        'attempt', c.attempt) ORDER BY c.n)
             FROM calls c WHERE NOT c.repeat AND c.batch_status <> 'open')) k
    ), done AS (
        UPDATE {s}.tool_calls tc
        SET status = CASE WHEN s.status = 'ok' THEN 'succeeded' ELSE 'failed' END,
            last_error = s.error, updated_at = now()
        FROM stored s
        WHERE tc.id = s.tool_call_ref
    ), counted AS (
        UPDATE {s}.tool_batches b
        SET pending = b.pending - n.n,
            status = CASE WHEN b.pending - n.n = 0 THEN 'complete' ELSE b.status END,
            completed_at = CASE WHEN b.pending - n.n = 0 THEN now() END
        FROM (SELECT s.batch_id, count(*) AS n, max(s.tool_call_ref) AS last_ref
              FROM stored s GROUP BY s.batch_id) n
        WHERE b.id = n.batch_id
        RETURNING b.id, b.pending, n.last_ref
    ), journaled AS (
        -- Each input row is matched against the stored and orphaned refs as one array
        -- each: a join of these CTEs, each estimated at one row, was a nested loop over
        -- both (n^2).
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id,
                                 tool_call_ref, tool_call_id, correlation_id, attempt,
                                 worker, detail)
        SELECT c.tenant_id,
               CASE WHEN c.stored THEN 'tool_result.stored' ELSE 'tool_result.orphaned' END,
               c.thread_id, c.run_id, c.batch_id, c.ref, c.tool_call_id, c.correlation_id,
               c.attempt, p_worker,
               CASE WHEN c.stored
                    THEN jsonb_strip_nulls(jsonb_build_object(
                        'status', c.status, 'source', c.source, 'lag_s', c.lag_s,
                        'payload', {s}.payload_ref_v1(c.output), 'span', c.span))
                    ELSE jsonb_build_object('batch_status', c.batch_status,
                                            'source', c.source) END
        FROM (
            SELECT calls.*,
                   calls.ref = ANY (ARRAY(SELECT tool_call_ref FROM stored)) AS stored,
                   calls.ref = ANY (ARRAY(SELECT tool_call_ref FROM orphaned)) AS orphaned
            FROM calls
        ) c
        WHERE c.stored OR c.orphaned
        ORDER BY c.batch_id, c.ref
    )
    SELECT array_agg(i.ref ORDER BY i.n),
           array_agg(CASE WHEN i.ref = ANY (ARRAY(SELECT tool_call_ref FROM stored))
                              THEN 'stored'
                          WHEN i.ref = ANY (ARRAY(SELECT tool_call_ref FROM orphaned))
                              THEN 'orphaned'
                          ELSE 'duplicate' END ORDER BY i.n),
           array_agg((SELECT k.id FROM counted k WHERE k.last_ref = i.ref AND k.pending = 0)
                     ORDER BY i.n),
           array_agg(i.attempt ORDER BY i.n)
    INTO v_refs, v_outcomes, v_completed, v_attempts
    FROM input i;

    IF EXISTS (SELECT 1 FROM unnest(v_completed) c WHERE c IS NOT NULL) THEN
        WITH info AS (
            SELECT d.batch_id, d.attempt, tc.tenant_id, tc.thread_id, tc.run_id,
                   tc.tool_call_id, r.correlation_id
            FROM unnest(v_completed, v_refs, v_attempts) AS d(batch_id, ref, attempt)
            JOIN {s}.tool_calls tc ON tc.id = d.ref
            JOIN {s}.runs r ON r.id = tc.run_id
            WHERE d.batch_id IS NOT NULL
        ), queued AS (
            INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                    correlation_id)
            SELECT i.tenant_id, 'deliver_batch', {s}.deliver_key_v1(i.batch_id), i.thread_id,
                   i.run_id, i.batch_id, i.correlation_id
            FROM info i ORDER BY i.batch_id
            ON CONFLICT (dedup_key) DO NOTHING
        )
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_id,
                                 correlation_id, attempt, worker)
        SELECT i.tenant_id, 'batch.complete', i.thread_id, i.run_id, i.batch_id,
               i.tool_call_id, i.correlation_id, i.attempt, p_worker
        FROM info i ORDER BY i.batch_id;
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_refs, v_outcomes, v_completed);
END $$;

CREATE OR REPLACE FUNCTION {s}.webhook_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_event    text := 'run.' || NEW.status;
    v_endpoint {s}.webhook_endpoints;
    v_key      text;
    v_delivery bigint;
BEGIN
    FOR v_endpoint IN
        SELECT * FROM {s}.webhook_endpoints e
        WHERE e.tenant_id = NEW.tenant_id AND e.removed_at IS NULL
          AND (e.events = '{}' OR v_event = ANY(e.events))
        ORDER BY e.id
    LOOP
        v_key := NEW.id || ':' || v_event || ':' || (1 + (
            SELECT count(*) FROM {s}.webhook_deliveries d
            WHERE d.endpoint_id = v_endpoint.id AND d.run_id = NEW.id AND d.event = v_event));
        INSERT INTO {s}.webhook_deliveries (endpoint_id, tenant_id, run_id, event, event_key)
        VALUES (v_endpoint.id, NEW.tenant_id, NEW.id, v_event, v_key)
        ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO NOTHING
        RETURNING id INTO v_delivery;
        CONTINUE WHEN v_delivery IS NULL;
        INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, correlation_id, max_attempts,
                                payload)
        VALUES (NEW.tenant_id, 'webhook', 'webhook:' || v_endpoint.id || ':' || v_key,
                NEW.correlation_id, 8,
                jsonb_build_object(
                    'delivery_id', v_delivery, 'endpoint_id', v_endpoint.id,
                    'event_key', v_key,
                    'body', jsonb_build_object(
                        'type', v_event,
                        'timestamp', to_char(now() AT TIME ZONE 'UTC',
                                             'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                        'data', jsonb_build_object(
                            'object', 'run', 'id', NEW.id, 'tenant_id', NEW.tenant_id,
                            'thread_id', NEW.thread_id, 'status', NEW.status,
                            'previous_status',
                            CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                            'failure_reason', NEW.failure_reason))));
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {s}.thread_delete_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_active {s}.runs;
BEGIN
    SELECT * INTO v_active FROM {s}.runs r
    WHERE r.thread_id = NEW.id AND {s}.run_active_v1(r.status);
    IF FOUND THEN
        RAISE EXCEPTION 'thread % has active run % (%): it cannot be deleted',
                        NEW.id, v_active.id, v_active.status
            USING ERRCODE = 'OB001',
                  DETAIL = json_build_object('thread_id', NEW.id, 'run_id', v_active.id,
                                            'status', v_active.status)::text,
                  HINT = 'cancel the run first, or wait for it to end';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION {s}.message_delete_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A model turn's calls carry its run: by the run's index; a message of no run
    -- (imported or added through the API) by its thread.
    IF EXISTS (SELECT 1 FROM {s}.tool_calls tc
               WHERE tc.message_id = NEW.id
                 AND (CASE WHEN NEW.run_id IS NULL THEN tc.thread_id = NEW.thread_id
                           ELSE tc.run_id = NEW.run_id END)) THEN
        RAISE EXCEPTION 'message % carries tool calls: it cannot be deleted', NEW.id
            USING ERRCODE = 'OB007',
                  HINT = 'deleting it would leave the results of its calls without the call that asked for them';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION {s}.orphaned_results_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.runs r JOIN {s}.threads t ON t.id = r.thread_id
               WHERE r.id = NEW.run_id AND t.erased_at IS NOT NULL)
       OR EXISTS (SELECT 1 FROM {s}.tool_calls c JOIN {s}.threads t ON t.id = c.thread_id
                  WHERE c.id = NEW.tool_call_ref AND t.erased_at IS NOT NULL) THEN
        NEW.output := NULL;
        NEW.error := CASE WHEN NEW.error IS NOT NULL THEN 'erased' END;
    END IF;
    RETURN NEW;
END $$;
