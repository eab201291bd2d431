-- Model turns: recording a model's responses and the tool calls they asked for, with their
-- batches and queue rows. `{s}` is the schema.


-- record_model_turns_v1: record model responses and the tool calls they asked for, many
-- turns at once.
--
--   SELECT * FROM outbox.record_model_turns_v1(
--       '[{"tenant_id": "tenant-a", "run_id": "9f1c…", "step_no": 1, "content": null,
--          "reasoning": [{"type": "reasoning", "id": "rs_1", "encrypted_content": "…",
--                         "summary": []}],
--          "response_id": "resp_1", "input_tokens": 120, "output_tokens": 30,
--          "cached_tokens": 0},
--         {"tenant_id": "tenant-a", "run_id": "77aa…", "step_no": 3, "content": "Done.",
--          "response_id": "resp_2", "input_tokens": 400, "output_tokens": 12}]',
--       '[[{"tool_call_id": "call_1", "name": "lookup_order", "version": 1,
--           "arguments": {"order_id": "42"}, "arguments_raw": "{\"order_id\": \"42\"}",
--           "arguments_hash": "…", "executor": "http", "idempotency_mode": "key",
--           "idempotency_key": "ob-…", "status": "pending", "error": null,
--           "decision": {"action": "allow", "rule": "…"}, "max_attempts": 5,
--           "approval": null}],
--         []]');
--
-- p_calls[n] are the calls of turn p_turns[n] as outbox.registry.plan_call planned them, in
-- the model's order. A turn's "reasoning" (optional) is the reasoning items of a Responses
-- API answer, verbatim, kept on its assistant message (messages.reasoning) and given back
-- to the model before that message's text and calls. A call with an "error" is stored
-- with that error as its result (the model sees it next turn), a "client" call makes the
-- run wait in requires_action, any other gets its outbox row (held until decided when it
-- carries an "approval": {rule, approvers, timeout_s}). In the caller's transaction, all
-- or nothing: for each turn the assistant message, the turn with its cost by the model's
-- price, the tenant's tokens, the batch, each call's intent, journal event and outbox
-- row, the refused calls' results (record_tool_results_v1), and the run's new status
-- (completed without calls). A turn's "span" (optional: the attempt's span as the relay
-- timed it, {id, start, end, n}) is kept in its model_turn.recorded event, for the trace
-- exporter (outbox/trace_export.py). A turn's "model" and "base_url" (optional) name what
-- answered it (a fallback's or a routing rule's model, else the run's), kept on the turn
-- and priced by that model; its "route" (optional: why that model, outbox/routing.py) is
-- kept in its model_turn.recorded event.
--
-- Returns one row per turn, in p_turns' order: the turn, its message and batch, the calls'
-- ids in order, the run's status, created (false for a turn already recorded at this
-- step, which is returned as stored, or for a run that is over, whose turn is journaled
-- model_turn.discarded), the run's loop_limit and the tool calls of its latest loop_limit
-- x loop_periods batches (newest first, as {step_no, signature}) for the writer's loop
-- detection. A missing run raises P0002; another tenant's OB004; p_calls not matching
-- p_turns 22023. Locks the runs first, in id order (the one lock order: runs, then
-- batches). Runs with the caller's rights under row-level security.
--
-- Each table is written by one statement for all the turns, not one per turn: a
-- statement's fixed costs (its executor, its CHECK constraints parsed again, its
-- triggers) were most of what PostgreSQL spent on a turn recorded one at a time. Two turns
-- of one run are recorded one after the other, each seeing the one before it.
--
-- The joins to runs also say r.id = ANY(v_run_ids), and the repeat check's NOT EXISTS is
-- kept a per-turn probe (OFFSET 0): the relay keeps one generic plan per statement, made
-- when runs may have been near empty, and a join on the turns' run ids alone was then a
-- hash join over all of runs (or the check an anti-join over all of model_turns), read
-- again on every call. The last SELECT is left unbounded: bounded, its plan read more.
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
        ON CONFLICT (dedup_key, tenant_id) DO NOTHING;
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

REVOKE ALL ON FUNCTION {s}.record_model_turn_v1(jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.record_model_turn_v1(jsonb, jsonb)
    TO outbox_writer, outbox_relay;  -- not outbox_api: `outbox serve` records no turns


-- report_model_calls_v1: what the model calls of a completer's transaction said about
-- each base URL's server, applied to its circuit (model_circuits, one row per base URL,
-- shared by every relay); the circuits whose state this changed.
--
--   SELECT * FROM outbox.report_model_calls_v1('{http://a/v1}', '{3}', '{0}');
--
-- p_failed[n] and p_answered[n] count the calls to p_base_urls[n] that failed (429, 5xx,
-- a timeout, no connection) and that were answered. A closed circuit counts consecutive
-- failures within its window_s (an answer starts the count again) and opens at open_after
-- of them. An open circuit stays open: calls sent before it opened may still fail, and
-- only the probe (claim_model_probe_v1) decides. A half-open circuit closes on an answer
-- and opens again, for another cool-down, on a failure. A base URL that never failed has
-- no row: the happy path writes nothing. URLs are locked in name order, so two completers
-- reporting the same servers queue instead of deadlocking.
CREATE OR REPLACE FUNCTION {s}.report_model_calls_v1(
    p_base_urls text[], p_failed integer[], p_answered integer[]
) RETURNS TABLE (base_url text, state text, was text, failures integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_url      text;
    v_failed   integer;
    v_answered integer;
    v_c        {s}.model_circuits;
    v_was      text;
BEGIN
    FOR v_url, v_failed, v_answered IN
        SELECT u, sum(f)::integer, sum(a)::integer
        FROM unnest(p_base_urls, p_failed, p_answered) AS x(u, f, a)
        GROUP BY u ORDER BY u
    LOOP
        IF v_failed > 0 THEN
            INSERT INTO {s}.model_circuits (base_url) VALUES (v_url)
            ON CONFLICT (base_url) DO NOTHING;
        END IF;
        SELECT * INTO v_c FROM {s}.model_circuits c WHERE c.base_url = v_url FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_was := v_c.state;
        IF v_answered > 0 THEN
            IF v_c.state = 'half_open' THEN
                v_c.state := 'closed';
                v_c.failures := 0;
                v_c.first_failure_at := NULL;
                v_c.probe_at := NULL;
            ELSIF v_c.state = 'closed' AND v_c.failures > 0 THEN
                v_c.failures := 0;
                v_c.first_failure_at := NULL;
            ELSE
                CONTINUE;
            END IF;
        ELSIF v_c.state = 'closed' THEN
            IF v_c.first_failure_at IS NULL
               OR v_c.first_failure_at < now() - make_interval(secs => v_c.window_s) THEN
                v_c.failures := v_failed;
                v_c.first_failure_at := now();
            ELSE
                v_c.failures := v_c.failures + v_failed;
            END IF;
            IF v_c.failures >= v_c.open_after THEN
                v_c.state := 'open';
                v_c.opened_at := now();
            END IF;
        ELSIF v_c.state = 'half_open' THEN
            v_c.state := 'open';
            v_c.opened_at := now();
            v_c.probe_at := NULL;
            v_c.failures := v_c.failures + v_failed;
        ELSE
            v_c.failures := v_c.failures + v_failed;
        END IF;
        UPDATE {s}.model_circuits c
        SET state = v_c.state, failures = v_c.failures, first_failure_at = v_c.first_failure_at,
            opened_at = v_c.opened_at, probe_at = v_c.probe_at, updated_at = now()
        WHERE c.base_url = v_url;
        IF v_c.state <> v_was THEN
            RETURN QUERY SELECT v_url, v_c.state, v_was, v_c.failures;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION {s}.report_model_calls_v1(text[], integer[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.report_model_calls_v1(text[], integer[], integer[])
    TO outbox_relay;


-- claim_model_probe_v1: take the one probe of an open circuit whose cool-down is over (or
-- whose probe went unanswered for probe_timeout_s: its relay died); true for the caller
-- that took it, which then sends its turn to that base URL, and false for everyone else,
-- whose turns keep going to the fallback. The circuit is half-open until the probe's
-- outcome is reported (report_model_calls_v1).
CREATE OR REPLACE FUNCTION {s}.claim_model_probe_v1(p_base_url text) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH taken AS (
        UPDATE {s}.model_circuits c SET state = 'half_open', probe_at = now(), updated_at = now()
        WHERE c.base_url = p_base_url
          AND ((c.state = 'open' AND c.opened_at + make_interval(secs => c.cool_down_s) <= now())
               OR (c.state = 'half_open'
                   AND c.probe_at + make_interval(secs => c.probe_timeout_s) <= now()))
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM taken)
$$;
REVOKE ALL ON FUNCTION {s}.claim_model_probe_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.claim_model_probe_v1(text) TO outbox_relay;
