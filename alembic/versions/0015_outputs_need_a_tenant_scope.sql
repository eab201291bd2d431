-- 0015: submit_tool_outputs_v1 acts only for the tenant the transaction is scoped to; an
-- unscoped session is refused (issue 17: as outbox_writer with no scope, outputs were
-- submitted into another tenant's run). Frozen: what revision 0015 applies, forever.

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
--   * submitting the same outputs again is a no-op that returns the status, also after
--     the run ended (an output of a call that has its result, or one already kept in
--     orphaned_results, is not kept twice);
--   * the deadline is decided by the database clock at submission: outputs submitted
--     after the run's action_deadline are refused, kept in orphaned_results (reason
--     deadline_passed) and the function returns 'expired', whether or not a relay's sweep
--     has recorded the expiry yet;
--   * outputs for a run that already ended (cancelled, expired, failed, completed) are
--     kept in orphaned_results (reason run_ended) and never reach a context;
--   * when the last output of a batch lands, the batch's delivery is enqueued in the same
--     transaction, exactly once.
-- Locks the run, then batches: the one lock order of every writer path.
-- Runs as the schema owner (SECURITY DEFINER) so that a least-privilege writer role only
-- needs EXECUTE. Row-level security does not apply inside, so it acts only for the tenant
-- the transaction is scoped to (outbox.enter_tenant_v1, or the Python writer API, which
-- scopes first): an unscoped session is refused (42501), as is another tenant.
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
    v_late       boolean;
    v_kept       text[];
    v_cap        integer := coalesce(
                     nullif(current_setting('outbox.max_payload_bytes', true), '')::integer,
                     262144);
    v_scope      text := nullif(current_setting('outbox.tenant_id', true), '');
BEGIN
    IF v_scope IS NULL THEN
        RAISE EXCEPTION 'submit_tool_outputs_v1 acts for the tenant this transaction is scoped to, and it has none'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('call outbox.enter_tenant_v1(%L) first in this transaction',
                                p_tenant_id);
    END IF;
    IF v_scope <> p_tenant_id THEN
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

    -- Past the deadline by the database clock (a sweep may not have expired it yet), the
    -- run takes no more outputs: it is expired from that moment.
    v_late := v_run.status = 'requires_action' AND coalesce(v_run.action_deadline < now(), false);
    IF v_late OR v_run.status IN ('completed', 'failed', 'cancelled', 'expired') THEN
        WITH kept AS (
            INSERT INTO {s}.orphaned_results (tenant_id, run_id, batch_id, tool_call_ref,
                                              tool_call_id, status, output, error, reason,
                                              source)
            SELECT tc.tenant_id, tc.run_id, tc.batch_id, tc.id, tc.tool_call_id, a.status,
                   o->'output', a.error,
                   CASE WHEN v_late THEN 'deadline_passed' ELSE 'run_ended' END, 'client'
            FROM jsonb_array_elements(p_outputs) o
            CROSS JOIN LATERAL (
                SELECT CASE WHEN o ? 'error' THEN 'error' ELSE 'ok' END AS status,
                       CASE WHEN o ? 'error' THEN coalesce(o->>'error', 'error') END AS error
            ) a
            JOIN {s}.tool_calls tc
              ON tc.run_id = p_run_id AND tc.tool_call_id = o->>'tool_call_id'
            -- A resend is a no-op: a call that has its result, or this very output kept.
            WHERE NOT EXISTS (SELECT 1 FROM {s}.tool_results r WHERE r.tool_call_ref = tc.id)
              AND NOT EXISTS (SELECT 1 FROM {s}.orphaned_results x
                              WHERE x.tool_call_ref = tc.id AND x.source = 'client'
                                AND x.status = a.status
                                AND x.output IS NOT DISTINCT FROM o->'output'
                                AND x.error IS NOT DISTINCT FROM a.error)
            RETURNING tool_call_id
        )
        SELECT array_agg(tool_call_id) INTO v_kept FROM kept;
        IF v_kept IS NOT NULL THEN
            INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
            VALUES (p_tenant_id, 'tool_outputs.orphaned', v_run.thread_id, p_run_id,
                    v_run.correlation_id,
                    jsonb_build_object('run_status', v_run.status,
                                       'reason', CASE WHEN v_late THEN 'deadline_passed'
                                                      ELSE 'run_ended' END,
                                       'action_deadline', v_run.action_deadline,
                                       'tool_call_ids', v_kept));
        END IF;
        RETURN CASE WHEN v_late THEN 'expired' ELSE v_run.status END;
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
