-- Frozen: submit_tool_outputs_v1 exactly as migration 0003 creates it. Never edit this
-- file; the functions as they are now live in outbox/sql/functions.sql.
--
-- Functions for backends that do not run Python; `{s}` is the schema. Names carry a
-- version so old and new code can overlap during a deploy.

-- submit_tool_outputs_v1: submit the outputs of client-executed tool calls of a run.
--
-- Answers: "my backend ran the tools the run is waiting for; record their outputs".
--
--   SELECT outbox.submit_tool_outputs_v1('tenant-a', '9f1c…'::uuid,
--       '[{"tool_call_id": "call_1", "output": {"ok": true}},
--         {"tool_call_id": "call_2", "error": "card declined"}]');
--
-- Returns the run's status afterwards. The Python writer API calls this same function.
-- Guarantees:
--   * all or nothing: unknown call ids, ids of calls the relay runs itself, outputs that
--     leave a pending client call of the batch unanswered, or an oversized output raise an
--     error (SQLSTATE 22023, or P0002 for a missing run) that names the problem; nothing
--     is written then;
--   * submitting the same outputs again is a no-op that returns the status;
--   * outputs for a run that already ended (cancelled, expired, failed, completed) are
--     kept in orphaned_results and never reach a context;
--   * when the last output of a batch lands, the batch's delivery is enqueued in the same
--     transaction, exactly once.
-- Locks the run, then batches: the one lock order of every writer path.
-- Runs as the schema owner (SECURITY DEFINER) so that a least-privilege writer role only
-- needs EXECUTE; it refuses a tenant other than the one the session is scoped to.
CREATE OR REPLACE FUNCTION {s}.submit_tool_outputs_v1(
    p_tenant_id text, p_run_id uuid, p_outputs jsonb
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run        {s}.runs;
    v_given      text[];
    v_bad        text[];
    v_output     jsonb;
    v_call       {s}.tool_calls;
    v_remaining  integer;
    v_cap        integer := coalesce(
                     nullif(current_setting('outbox.max_payload_bytes', true), '')::integer,
                     262144);
    v_scope      text := nullif(current_setting('outbox.tenant_id', true), '');
BEGIN
    IF v_scope IS NOT NULL AND v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND OR v_run.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'run % does not exist for tenant %', p_run_id, p_tenant_id
            USING ERRCODE = 'no_data_found', HINT = 'check the run id and the tenant';
    END IF;
    IF jsonb_typeof(p_outputs) IS DISTINCT FROM 'array' OR jsonb_array_length(p_outputs) = 0 THEN
        RAISE EXCEPTION 'outputs must be a non-empty JSON array'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'send [{"tool_call_id": "...", "output": ...} | {"tool_call_id": "...", "error": "..."}]';
    END IF;
    SELECT array_agg(o->>'tool_call_id') INTO v_given FROM jsonb_array_elements(p_outputs) o;
    IF array_position(v_given, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT g) FROM unnest(v_given) g) <> cardinality(v_given) THEN
        RAISE EXCEPTION 'every output needs a tool_call_id, each at most once: %', v_given
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(g) INTO v_bad FROM unnest(v_given) g
    WHERE NOT EXISTS (SELECT 1 FROM {s}.tool_calls tc
                      WHERE tc.run_id = p_run_id AND tc.tool_call_id = g);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'tool call ids % are not calls of run %', v_bad, p_run_id
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'submit the ids the run lists as waiting (outbox runs show RUN)';
    END IF;
    SELECT array_agg(tc.tool_call_id) INTO v_bad FROM {s}.tool_calls tc
    WHERE tc.run_id = p_run_id AND tc.tool_call_id = ANY(v_given) AND tc.executor <> 'client';
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'tool calls % are run by the relay, not by the client', v_bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(o->>'tool_call_id') INTO v_bad FROM jsonb_array_elements(p_outputs) o
    WHERE octet_length(o::text) > v_cap;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'outputs for % are over the cap of % bytes', v_bad, v_cap
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'store large data elsewhere and submit a reference';
    END IF;

    IF v_run.status IN ('completed', 'failed', 'cancelled', 'expired') THEN
        INSERT INTO {s}.orphaned_results (tenant_id, run_id, batch_id, tool_call_ref,
                                          tool_call_id, status, output, error, reason, source)
        SELECT tc.tenant_id, tc.run_id, tc.batch_id, tc.id, tc.tool_call_id,
               CASE WHEN o ? 'error' THEN 'error' ELSE 'ok' END, o->'output',
               CASE WHEN o ? 'error' THEN coalesce(o->>'error', 'error') END, 'run_ended', 'client'
        FROM jsonb_array_elements(p_outputs) o
        JOIN {s}.tool_calls tc ON tc.run_id = p_run_id AND tc.tool_call_id = o->>'tool_call_id';
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
        VALUES (p_tenant_id, 'tool_outputs.orphaned', v_run.thread_id, p_run_id,
                v_run.correlation_id, jsonb_build_object('run_status', v_run.status,
                                                         'tool_call_ids', v_given));
        RETURN v_run.status;
    END IF;

    -- Every client call still waiting in the run's open batch must be answered together.
    SELECT array_agg(tc.tool_call_id ORDER BY tc.position) INTO v_bad
    FROM {s}.tool_calls tc
    JOIN {s}.tool_batches b ON b.id = tc.batch_id AND b.status = 'open'
    WHERE tc.run_id = p_run_id AND tc.executor = 'client' AND tc.status = 'pending'
      AND NOT (tc.tool_call_id = ANY(v_given));
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'incomplete outputs for run %: still missing %', p_run_id, v_bad
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'submit the outputs of every waiting call in one request';
    END IF;

    FOR v_output IN SELECT o FROM jsonb_array_elements(p_outputs) o LOOP
        SELECT * INTO v_call FROM {s}.tool_calls
        WHERE run_id = p_run_id AND tool_call_id = v_output->>'tool_call_id';
        PERFORM 1 FROM {s}.tool_batches WHERE id = v_call.batch_id FOR UPDATE;
        CONTINUE WHEN EXISTS (SELECT 1 FROM {s}.tool_results WHERE tool_call_ref = v_call.id);
        INSERT INTO {s}.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status, output,
                                      error, attempt, source)
        VALUES (v_call.id, v_call.tenant_id, p_run_id, v_call.batch_id,
                CASE WHEN v_output ? 'error' THEN 'error' ELSE 'ok' END, v_output->'output',
                CASE WHEN v_output ? 'error' THEN coalesce(v_output->>'error', 'error') END,
                0, 'client');
        UPDATE {s}.tool_calls
        SET status = CASE WHEN v_output ? 'error' THEN 'failed' ELSE 'succeeded' END,
            updated_at = now()
        WHERE id = v_call.id;
        UPDATE {s}.tool_batches
        SET pending = pending - 1,
            status = CASE WHEN pending - 1 = 0 THEN 'complete' ELSE status END,
            completed_at = CASE WHEN pending - 1 = 0 THEN now() END
        WHERE id = v_call.batch_id
        RETURNING pending INTO v_remaining;
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                                 tool_call_id, correlation_id, detail)
        VALUES (p_tenant_id, 'tool_result.stored', v_run.thread_id, p_run_id, v_call.batch_id,
                v_call.id, v_call.tool_call_id, v_run.correlation_id,
                jsonb_build_object('source', 'client'));
        IF v_remaining = 0 THEN
            INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                    correlation_id)
            VALUES (p_tenant_id, 'deliver_batch', 'deliver:' || v_call.batch_id,
                    v_run.thread_id, p_run_id, v_call.batch_id, v_run.correlation_id)
            ON CONFLICT (dedup_key) DO NOTHING;
            INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id,
                                     correlation_id)
            VALUES (p_tenant_id, 'batch.complete', v_run.thread_id, p_run_id, v_call.batch_id,
                    v_run.correlation_id);
        END IF;
    END LOOP;

    UPDATE {s}.runs SET status = 'in_progress', action_deadline = NULL, updated_at = now()
    WHERE id = p_run_id AND status = 'requires_action'
      AND NOT EXISTS (SELECT 1 FROM {s}.tool_calls tc
                      WHERE tc.run_id = p_run_id AND tc.executor = 'client'
                        AND tc.status = 'pending');
    RETURN (SELECT status FROM {s}.runs WHERE id = p_run_id);
END $$;
REVOKE ALL ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb) TO outbox_writer;
