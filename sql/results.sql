-- Tool results: recording them (the relay's, the writer's and a backend's client outputs)
-- and keeping those that may enter no context. `{s}` is the schema.


-- keep_orphaned_results_v1: keep results that may enter no context in orphaned_results.
--
-- The one place a result is orphaned: record_tool_results_v1 (its batch was closed),
-- submit_tool_outputs_v1 (its run is over) and the relay's completions fenced off (the
-- query insert_orphan of relay/queries/relay.sql) call it. Only operators read them
-- (the orphaned_results_report view).
--
--   SELECT * FROM outbox.keep_orphaned_results_v1(
--       '[{"ref": 42, "status": "ok", "output": {"id": 7}, "reason": "fenced",
--          "source": "relay", "attempt": 3}]');
--
-- p_results is a JSON array of {ref (tool_calls.id), status ('ok' or 'error'), output,
-- error, reason, source, attempt}; each is kept with its call's tenant, run, batch and
-- provider id (a JSON null output is kept as NULL, as tool_results keeps it). Returns the
-- rows kept, in input order. STRICT: NULL (jsonb_agg of nothing) keeps nothing and costs
-- nothing. Runs with the caller's rights (row-level security applies).
CREATE OR REPLACE FUNCTION {s}.keep_orphaned_results_v1(p_results jsonb)
RETURNS SETOF {s}.orphaned_results
LANGUAGE sql STRICT SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {s}.orphaned_results (tenant_id, run_id, batch_id, tool_call_ref,
                                      tool_call_id, status, output, error, reason, source,
                                      attempt)
    SELECT tc.tenant_id, tc.run_id, tc.batch_id, tc.id, tc.tool_call_id, o.status, o.output,
           o.error, o.reason, o.source, o.attempt
    FROM jsonb_array_elements(p_results) WITH ORDINALITY AS e(item, n)
    CROSS JOIN LATERAL jsonb_to_record(e.item)
        AS o(ref bigint, status text, output jsonb, error text, reason text, source text,
             attempt integer)
    JOIN {s}.tool_calls tc ON tc.id = o.ref
    ORDER BY e.n
    RETURNING *
$$;
REVOKE ALL ON FUNCTION {s}.keep_orphaned_results_v1(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.keep_orphaned_results_v1(jsonb)
    TO outbox_writer, outbox_relay, outbox_api;


-- record_tool_results_v1: record terminal results of tool calls, many in one call.
--
-- The one implementation of "store the result, count the batch down, enqueue its delivery
-- once, journal it": the relay (every fenced result of a completion transaction in one
-- call), the Python writer (writer.record_tool_result: outbox reconcile, single results)
-- and submit_tool_outputs_v1 call it.
--
--   SELECT * FROM outbox.record_tool_results_v1(
--       '[{"ref": 42, "status": "ok", "output": {"id": 7}, "source": "relay",
--          "attempt": 2, "lag_s": 0.004}]', 'relay-host-1');
--
-- p_results is a JSON array of {ref (tool_calls.id), status ('ok' or 'error'), output,
-- error, source, attempt, lag_s (optional: how long the row waited, due, before a claim),
-- span (optional: the attempt's span as the relay timed it, {id, start, end, n}, kept in
-- the journal event for the trace exporter, outbox/trace_export.py)}, each ref at most once. Returns one row per input, in input order: outcome 'stored',
-- 'duplicate' (the call has its result already; it stays) or 'orphaned' (its batch is
-- closed: the result is kept in orphaned_results, never in a context), and
-- completed_batch, the batch this result completed (else null). For each result stored:
-- the call marked succeeded or failed, its batch's pending count lowered, journal
-- tool_result.stored (or tool_result.orphaned); for each batch completed: its delivery
-- enqueued once (dedup key deliver_key_v1) and journal batch.complete, after the results'
-- events. Locks the batches in id order; a caller that moves runs forward holds their
-- run locks first (the one lock order of every writer path: runs, then batches). Runs
-- with the caller's rights (row-level security applies); backends submit client outputs
-- through submit_tool_outputs_v1, which checks them first.
CREATE OR REPLACE FUNCTION {s}.record_tool_results_v1(p_results jsonb, p_worker text)
RETURNS TABLE (ref bigint, outcome text, completed_batch bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_refs         bigint[];
    v_outcomes     text[];
    v_completed    bigint[];
    v_attempts     integer[];
    v_batches      bigint[];
    v_statuses     text[];
    v_correlations text[];
BEGIN
    v_refs := ARRAY(SELECT (e->>'ref')::bigint FROM jsonb_array_elements(p_results) e);
    -- The batches locked, each with its status and its run's correlation id: read once a
    -- batch here, not once a result below (a completion writes tens of results a batch).
    SELECT array_agg(b.id), array_agg(b.status), array_agg(r.correlation_id)
    INTO v_batches, v_statuses, v_correlations
    FROM (SELECT b.id, b.status, b.run_id FROM {s}.tool_batches b
          WHERE b.id IN (SELECT tc.batch_id FROM {s}.tool_calls tc WHERE tc.id = ANY(v_refs))
          ORDER BY b.id FOR UPDATE) b
    JOIN {s}.runs r ON r.id = b.run_id;

    -- Every lookup is by primary key or a unique index, whatever the size of the tables.
    WITH input AS (
        SELECT i.*, row_number() OVER () AS n
        FROM jsonb_to_recordset(p_results)
            AS i(ref bigint, status text, output jsonb, error text, source text,
                 attempt int, lag_s float8, span jsonb)
    ), calls AS (
        -- repeat: the call has its result already. Asked only where the batch is not open:
        -- in an open batch the insert's ON CONFLICT tells a repeat, at no lookup more.
        SELECT i.*, tc.tenant_id, tc.run_id, tc.thread_id, tc.batch_id, tc.tool_call_id,
               b.status AS batch_status, b.correlation_id,
               b.status IS DISTINCT FROM 'open'
               AND EXISTS (SELECT 1 FROM {s}.tool_results x WHERE x.tool_call_ref = i.ref)
                   AS repeat
        FROM input i
        JOIN {s}.tool_calls tc ON tc.id = i.ref AND tc.id = ANY(v_refs)
        LEFT JOIN unnest(v_batches, v_statuses, v_correlations)
            AS b(id, status, correlation_id) ON b.id = tc.batch_id
    ), stored AS (
        INSERT INTO {s}.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status,
                                      output, error, attempt, source, worker)
        SELECT c.ref, c.tenant_id, c.run_id, c.batch_id, c.status, c.output, c.error,
               c.attempt, c.source, p_worker
        FROM calls c WHERE NOT c.repeat AND c.batch_status = 'open'
        ON CONFLICT (tool_call_ref, tenant_id) DO NOTHING
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
            ON CONFLICT (dedup_key, tenant_id) DO NOTHING
        )
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_id,
                                 correlation_id, attempt, worker)
        SELECT i.tenant_id, 'batch.complete', i.thread_id, i.run_id, i.batch_id,
               i.tool_call_id, i.correlation_id, i.attempt, p_worker
        FROM info i ORDER BY i.batch_id;
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_refs, v_outcomes, v_completed);
END $$;
REVOKE ALL ON FUNCTION {s}.record_tool_results_v1(jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.record_tool_results_v1(jsonb, text)
    TO outbox_writer, outbox_relay, outbox_api;


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
    v_late       boolean;
    v_kept       text[];
    v_cap        integer := coalesce(
                     nullif(current_setting('outbox.max_payload_bytes', true), '')::integer,
                     262144);
BEGIN
    PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'submit_tool_outputs_v1');
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
    IF {s}.run_over_v1(v_run.status, v_run.action_deadline) THEN
        v_late := NOT {s}.run_ended_v1(v_run.status);
        SELECT array_agg(k.tool_call_id ORDER BY k.id) INTO v_kept
        FROM {s}.keep_orphaned_results_v1((
            SELECT jsonb_agg(jsonb_build_object(
                       'ref', tc.id, 'status', a.status, 'output', o->'output',
                       'error', a.error, 'source', 'client',
                       'reason', CASE WHEN v_late THEN 'deadline_passed' ELSE 'run_ended' END)
                   ORDER BY e.n)
            FROM jsonb_array_elements(p_outputs) WITH ORDINALITY AS e(o, n)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN o ? 'error' THEN 'error' ELSE 'ok' END AS status,
                       CASE WHEN o ? 'error' THEN coalesce(o->>'error', 'error') END AS error
            ) a
            JOIN {s}.tool_calls tc
              ON tc.run_id = p_run_id AND tc.tool_call_id = o->>'tool_call_id'
            -- A resend is a no-op: a call that has its result, or this very output kept (a
            -- JSON null output matches a kept NULL or a kept JSON null).
            WHERE NOT EXISTS (SELECT 1 FROM {s}.tool_results r WHERE r.tool_call_ref = tc.id)
              AND NOT EXISTS (SELECT 1 FROM {s}.orphaned_results x
                              WHERE x.tool_call_ref = tc.id AND x.source = 'client'
                                AND x.status = a.status
                                AND coalesce({s}.resolved_json_v1(x.output, x.tenant_id,
                                                                  x.output_ref), 'null')
                                    = coalesce(o->'output', 'null')
                                AND x.error IS NOT DISTINCT FROM a.error))) k;
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

    -- The outputs as results of their calls: stored, counted against their batches, the
    -- delivery of a batch they complete enqueued once, all journaled (a resend is a no-op).
    PERFORM 1 FROM {s}.record_tool_results_v1(
        (SELECT jsonb_agg(jsonb_build_object(
                    'ref', tc.id,
                    'status', CASE WHEN o ? 'error' THEN 'error' ELSE 'ok' END,
                    'output', o->'output',
                    'error', CASE WHEN o ? 'error' THEN coalesce(o->>'error', 'error') END,
                    'source', 'client', 'attempt', 0) ORDER BY tc.id)
         FROM jsonb_array_elements(p_outputs) o
         JOIN {s}.tool_calls tc
           ON tc.run_id = p_run_id AND tc.tool_call_id = o->>'tool_call_id'),
        NULL);

    UPDATE {s}.runs SET status = 'in_progress', action_deadline = NULL, updated_at = now()
    WHERE id = p_run_id AND status = 'requires_action'
      AND NOT EXISTS (SELECT 1 FROM {s}.tool_calls tc
                      WHERE tc.run_id = p_run_id AND tc.executor = 'client'
                        AND tc.status = 'pending');
    RETURN (SELECT status FROM {s}.runs WHERE id = p_run_id);
END $$;
REVOKE ALL ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb)
    TO outbox_writer, outbox_api;  -- outbox_api: the requests of `outbox serve`
