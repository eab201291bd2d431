-- Back to 0051: no fallbacks, circuits or routing rules; record_model_turns_v1 as 0046 made
-- it (the run's model answers every turn).

DROP TRIGGER IF EXISTS runs_pin_route ON {s}.runs;
DROP FUNCTION IF EXISTS {s}.runs_pin_route();
DROP FUNCTION IF EXISTS {s}.claim_model_probe_v1(text);
DROP FUNCTION IF EXISTS {s}.report_model_calls_v1(text[], integer[], integer[]);
DROP TABLE {s}.model_routes;
DROP TABLE {s}.model_circuits;
DROP TABLE {s}.model_fallbacks;
ALTER TABLE {s}.model_turns DROP COLUMN model, DROP COLUMN base_url;
ALTER TABLE {s}.runs DROP COLUMN route_version;

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
        SELECT t.n, t.turn, r.id AS run_id, r.tenant_id, r.thread_id, r.correlation_id, r.model,
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
                                     input_tokens, output_tokens, cached_tokens, cost)
        SELECT new.tenant_id, new.run_id, new.step_no, message.id, new.turn->>'response_id',
               new.input, new.output, new.cached,
               ((new.input - least(new.cached, new.input)) * p.input_per_mtok
                + least(new.cached, new.input) * coalesce(p.cached_input_per_mtok, p.input_per_mtok)
                + new.output * p.output_per_mtok) / 1000000
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
                              'cached_tokens', new.cached, 'cost', turn.cost::text)
           || jsonb_strip_nulls(jsonb_build_object('span', new.turn->'span'))
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
    TO outbox_writer, outbox_relay;  -- not outbox_api: `outbox serve` records no turns (0030)
