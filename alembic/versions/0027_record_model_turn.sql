-- 0027: record_model_turn_v1, a model turn recorded in one round trip. Frozen: what
-- revision 0027 applies, forever.
--
-- The writer recorded a model turn with about twenty statements (the message, the turn,
-- its batch, each call's intent, journal event and outbox row, the run's new status), each
-- a round trip; with thousands of runs in flight those round trips were most of what the
-- relay's completers and PostgreSQL spent on a turn. The writer still decides how each
-- call will run (its tool, JSON Schema, risk policy: outbox.registry.plan_call) and passes
-- the plans; this function writes them, in the order the writer did.


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
-- p_calls are the turn's calls as outbox.registry.plan_call planned them, in the model's
-- order: a call with an "error" is stored with that error as its result (the model sees
-- it next turn), a "client" call makes the run wait in requires_action, any other gets
-- its outbox row (held until decided when it carries an "approval": {rule, approvers,
-- timeout_s}). In the caller's transaction, all or nothing: the assistant message, the
-- turn with its cost by the model's price, the tenant's tokens, the batch, each call's
-- intent, journal event and outbox row, the refused calls' results
-- (record_tool_results_v1), and the run's new status (completed without calls).
--
-- Returns one row: the turn, its message and batch, the calls' ids in order, the run's
-- status, created (false for a turn already recorded at this step, which is returned as
-- stored, or for a run that is over, whose turn is journaled model_turn.discarded), the
-- run's loop_limit and the tool calls of its latest loop_limit x p_turn.loop_periods
-- batches (newest first, as {step_no, signature}) for the writer's loop detection. A missing run raises P0002; another tenant's OB004. Locks
-- the run first (the one lock order: runs, then batches). Runs with the caller's rights
-- under row-level security.
CREATE OR REPLACE FUNCTION {s}.record_model_turn_v1(p_turn jsonb, p_calls jsonb)
RETURNS TABLE (model_turn_id bigint, message_id bigint, batch_id bigint, tool_call_refs bigint[],
               run_status text, created boolean, loop_limit integer, recent_batches jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant   text := p_turn->>'tenant_id';
    v_run_id   uuid := (p_turn->>'run_id')::uuid;
    v_step     integer := (p_turn->>'step_no')::integer;
    v_input    bigint := coalesce((p_turn->>'input_tokens')::bigint, 0);
    v_output   bigint := coalesce((p_turn->>'output_tokens')::bigint, 0);
    v_cached   bigint := coalesce((p_turn->>'cached_tokens')::bigint, 0);
    v_run      {s}.runs;
    v_turn_id  bigint;
    v_msg_id   bigint;
    v_batch_id bigint;
    v_cost     numeric;
    v_seq      integer;
    v_refs     bigint[] := '{}';
    v_refused  jsonb := '[]';
    v_client   boolean := false;
    v_status   text;
    v_call     jsonb;
    v_position bigint;
    v_ref      bigint;
    v_approval {s}.approvals;
BEGIN
    PERFORM {s}.enter_tenant_v1(v_tenant);
    SELECT * INTO v_run FROM {s}.runs r WHERE r.id = v_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', v_run_id
            USING ERRCODE = 'no_data_found', HINT = 'check the run id';
    ELSIF v_run.tenant_id <> v_tenant THEN
        RAISE EXCEPTION 'run % does not belong to tenant %', v_run_id, quote_literal(v_tenant)
            USING ERRCODE = 'OB004', HINT = 'pass the tenant that owns the object';
    END IF;

    SELECT mt.id, mt.message_id, b.id INTO v_turn_id, v_msg_id, v_batch_id
    FROM {s}.model_turns mt
    LEFT JOIN {s}.tool_batches b ON b.run_id = mt.run_id AND b.step_no = mt.step_no
    WHERE mt.run_id = v_run_id AND mt.step_no = v_step;
    IF FOUND THEN  -- a repeat: what is stored
        RETURN QUERY SELECT v_turn_id, v_msg_id, v_batch_id,
            ARRAY(SELECT tc.id FROM {s}.tool_calls tc WHERE tc.batch_id = v_batch_id
                  ORDER BY tc.position),
            v_run.status, false, v_run.loop_limit, NULL::jsonb;
        RETURN;
    END IF;
    IF {s}.run_ended_v1(v_run.status) THEN
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
        VALUES (v_tenant, 'model_turn.discarded', v_run.thread_id, v_run.id, v_run.correlation_id,
                jsonb_build_object('step_no', v_step, 'reason', 'run is ' || v_run.status));
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::bigint, '{}'::bigint[],
            v_run.status, false, v_run.loop_limit, NULL::jsonb;
        RETURN;
    END IF;

    UPDATE {s}.threads t SET next_seq = t.next_seq + 1 WHERE t.id = v_run.thread_id
    RETURNING t.next_seq - 1 INTO v_seq;
    INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id)
    VALUES (v_tenant, v_run.thread_id, v_seq, 'assistant', p_turn->>'content', v_run.id)
    RETURNING id INTO v_msg_id;
    INSERT INTO {s}.model_turns (tenant_id, run_id, step_no, message_id, response_id,
                                 input_tokens, output_tokens, cached_tokens, cost)
    SELECT v_tenant, v_run.id, v_step, v_msg_id, p_turn->>'response_id',
           v_input, v_output, v_cached,
           (SELECT ((v_input - least(v_cached, v_input)) * p.input_per_mtok
                    + least(v_cached, v_input) * coalesce(p.cached_input_per_mtok, p.input_per_mtok)
                    + v_output * p.output_per_mtok) / 1000000
            FROM {s}.model_prices p WHERE p.model = v_run.model)
    RETURNING id, cost INTO v_turn_id, v_cost;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    VALUES (v_tenant, 'model_turn.recorded', v_run.thread_id, v_run.id, v_run.correlation_id,
            jsonb_build_object('step_no', v_step, 'tool_calls', jsonb_array_length(p_calls),
                               'input_tokens', v_input, 'output_tokens', v_output,
                               'cached_tokens', v_cached, 'cost', v_cost::text));
    UPDATE {s}.tenant_budgets
    SET tokens_used = tokens_used + v_input + v_output,
        cost_used = cost_used + coalesce(v_cost, 0), updated_at = now()
    WHERE tenant_id = v_tenant;

    IF jsonb_array_length(p_calls) = 0 THEN
        v_status := 'completed';
    ELSE
        INSERT INTO {s}.tool_batches (tenant_id, run_id, thread_id, step_no, message_id, status,
                                      size, pending)
        VALUES (v_tenant, v_run.id, v_run.thread_id, v_step, v_msg_id, 'open',
                jsonb_array_length(p_calls), jsonb_array_length(p_calls))
        RETURNING id INTO v_batch_id;
        FOR v_call, v_position IN SELECT e, o - 1 FROM jsonb_array_elements(p_calls) WITH ORDINALITY AS c(e, o)
        LOOP
            INSERT INTO {s}.tool_calls (tenant_id, run_id, thread_id, batch_id, message_id, position,
                                        tool_call_id, tool_name, tool_version, arguments,
                                        arguments_raw, arguments_hash, executor, idempotency_mode,
                                        idempotency_key, status)
            VALUES (v_tenant, v_run.id, v_run.thread_id, v_batch_id, v_msg_id, v_position,
                    v_call->>'tool_call_id', v_call->>'name', (v_call->>'version')::integer,
                    nullif(v_call->'arguments', 'null'::jsonb), v_call->>'arguments_raw',
                    v_call->>'arguments_hash', v_call->>'executor', v_call->>'idempotency_mode',
                    v_call->>'idempotency_key', v_call->>'status')
            RETURNING id INTO v_ref;
            v_refs := v_refs || v_ref;
            INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                                     tool_call_id, correlation_id, detail)
            VALUES (v_tenant, 'tool_call.intended', v_run.thread_id, v_run.id, v_batch_id, v_ref,
                    v_call->>'tool_call_id', v_run.correlation_id,
                    jsonb_build_object('tool', v_call->>'name', 'executor', v_call->>'executor',
                                       'error', v_call->'error', 'policy', v_call->'decision'));
            IF v_call->>'error' IS NOT NULL THEN
                v_refused := v_refused || jsonb_build_object(
                    'ref', v_ref, 'status', 'error', 'error', v_call->>'error',
                    'source', 'validation', 'output', NULL, 'attempt', 0);
            ELSIF v_call->>'executor' = 'client' THEN
                v_client := true;
            ELSE
                INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                        tool_call_ref, tool_name, correlation_id, max_attempts,
                                        payload, available_at)
                VALUES (v_tenant, 'tool_call', {s}.tool_call_key_v1(v_ref), v_run.thread_id,
                        v_run.id, v_batch_id, v_ref, v_call->>'name', v_run.correlation_id,
                        (v_call->>'max_attempts')::integer, '{}',
                        CASE WHEN jsonb_typeof(v_call->'approval') = 'object'
                             THEN 'infinity'::timestamptz ELSE now() END)
                ON CONFLICT (dedup_key) DO NOTHING;
                IF jsonb_typeof(v_call->'approval') = 'object' THEN
                    INSERT INTO {s}.approvals (tenant_id, run_id, thread_id, batch_id,
                                               tool_call_ref, tool_call_id, tool_name,
                                               arguments_digest, rule, approvers, deadline)
                    VALUES (v_tenant, v_run.id, v_run.thread_id, v_batch_id, v_ref,
                            v_call->>'tool_call_id', v_call->>'name', v_call->>'arguments_hash',
                            v_call->'approval'->>'rule',
                            ARRAY(SELECT jsonb_array_elements_text(v_call->'approval'->'approvers')),
                            now() + make_interval(secs => (v_call->'approval'->>'timeout_s')::float8))
                    RETURNING * INTO v_approval;
                    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id,
                                             tool_call_ref, tool_call_id, correlation_id, detail)
                    VALUES (v_tenant, 'approval.requested', v_run.thread_id, v_run.id, v_batch_id,
                            v_ref, v_call->>'tool_call_id', v_run.correlation_id,
                            jsonb_build_object('approval_id', v_approval.id,
                                               'tool', v_call->>'name',
                                               'arguments_digest', v_approval.arguments_digest,
                                               'rule', v_approval.rule,
                                               'approvers', to_jsonb(v_approval.approvers),
                                               'deadline', to_jsonb(v_approval.deadline)));
                END IF;
            END IF;
        END LOOP;
        IF jsonb_array_length(v_refused) > 0 THEN
            -- The one rule for results: stored, counted down, and the batch's delivery
            -- enqueued once if no call of it is left to run.
            PERFORM {s}.record_tool_results_v1(v_refused, NULL);
        END IF;
        v_status := CASE WHEN v_client THEN 'requires_action' ELSE 'in_progress' END;
    END IF;

    UPDATE {s}.runs r
    SET step_count = greatest(r.step_count, v_step),
        tokens_used = r.tokens_used + v_input + v_output,
        cost = r.cost + coalesce(v_cost, 0),
        status = v_status,
        action_deadline = CASE WHEN v_status = 'requires_action' THEN now() + r.action_timeout END,
        ended_at = CASE WHEN v_status = 'completed' THEN now() END,
        failure_reason = NULL,
        last_error = NULL,
        updated_at = now()
    WHERE r.id = v_run.id;
    IF v_status = 'completed' THEN
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
        VALUES (v_tenant, 'run.completed', v_run.thread_id, v_run.id, v_run.correlation_id, '{}');
        RETURN QUERY SELECT v_turn_id, v_msg_id, NULL::bigint, '{}'::bigint[], v_status, true,
            v_run.loop_limit, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY SELECT v_turn_id, v_msg_id, v_batch_id, v_refs, v_status, true, v_run.loop_limit,
        (SELECT coalesce(jsonb_agg(jsonb_build_object('step_no', s.step_no,
                                                      'signature', s.signature)
                                   ORDER BY s.step_no DESC), '[]')
         FROM (SELECT b.step_no, array_agg(tc.arguments_hash ORDER BY tc.arguments_hash) AS signature
               FROM {s}.tool_batches b
               JOIN {s}.tool_calls tc ON tc.batch_id = b.id
               WHERE b.run_id = v_run.id AND b.step_no <= v_step
               GROUP BY b.step_no
               ORDER BY b.step_no DESC
               LIMIT v_run.loop_limit * coalesce((p_turn->>'loop_periods')::integer, 1)) s);
END $$;

REVOKE ALL ON FUNCTION {s}.record_model_turn_v1(jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.record_model_turn_v1(jsonb, jsonb)
    TO outbox_writer, outbox_relay, outbox_api;
