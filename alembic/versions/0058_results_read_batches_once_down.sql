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
