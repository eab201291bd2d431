-- 0021: one function records tool results (record_tool_results_v1: store, count the batch
-- down, enqueue its delivery once, journal), called by the relay, the Python writer and
-- submit_tool_outputs_v1; the run status sets and the outbox's dedup-key formats as
-- functions (run_active_v1, run_ended_v1, deliver_key_v1, tool_call_key_v1,
-- model_turn_key_v1) that start_run_v1, end_run_v1, cancel_run_v1, decide_approval_v1 and
-- stuck_runs now use. Frozen: what revision 0021 applies, forever.

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
-- error, source, attempt, lag_s (optional: how long the row waited, due, before a claim)},
-- each ref at most once. Returns one row per input, in input order: outcome 'stored',
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
                 attempt int, lag_s float8)
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
        INSERT INTO {s}.orphaned_results (tenant_id, run_id, batch_id, tool_call_ref,
                                          tool_call_id, status, output, error, reason,
                                          source, attempt)
        SELECT c.tenant_id, c.run_id, c.batch_id, c.ref, c.tool_call_id, c.status, c.output,
               c.error, 'batch_closed', c.source, c.attempt
        FROM calls c WHERE NOT c.repeat AND c.batch_status <> 'open'
        RETURNING tool_call_ref
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
                        'status', c.status, 'source', c.source, 'lag_s', c.lag_s))
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
    v_scope      text := {s}.current_tenant_v1();
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
    IF v_late OR {s}.run_ended_v1(v_run.status) THEN
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
    TO outbox_writer, outbox_api;  -- outbox_api: migration 0020


-- start_run_v1: "start a run on this thread with this user turn".
--
--   SELECT * FROM outbox.start_run_v1('tenant-a', '5b0c…'::uuid, 'gpt-5',
--       p_message => 'Refund order 42', p_tools => ARRAY['lookup_order', 'refund'],
--       p_idempotency_key => 'request-7f3a');
--
-- Returns (run_id, status, created, correlation_id). In one go, all or nothing: the user
-- message, the run, its first model turn queued for the relay (outbox row
-- model_turn:<run>:1) and the journal event run.created. Guarantees:
--   * the same p_idempotency_key again returns the existing run with created = false, also
--     when two requests race; the key on another thread raises OB002;
--   * while the thread has an active run (queued, in_progress, requires_action), another
--     turn raises OB001, whose DETAIL is {"thread_id", "run_id", "status"} (the active run);
--   * unknown tools raise P0002; a thread that does not exist, or that row-level
--     security hides, raises P0002; one of another tenant (for roles that see every
--     tenant) raises OB004;
--   * a tenant whose token budget is spent raises OB003;
--   * bad arguments raise 22023 naming the argument.
-- Locks the thread, then the run: a run is inserted only under its thread's lock. Runs
-- with the caller's rights under the tenant's row-level security (outbox_writer may call
-- it). p_action_timeout_s, p_max_steps and p_loop_limit default to the columns' defaults.
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
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     {s}.runs;
    v_thread  {s}.threads;
    v_active  {s}.runs;
    v_missing text[];
    v_pins    jsonb;
    v_budget  {s}.tenant_budgets;
    v_seq     integer;
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
        RAISE EXCEPTION 'tenant % used % tokens and % in money; its budget is % tokens and % in money',
                        quote_literal(p_tenant_id), v_budget.tokens_used, v_budget.cost_used,
                        coalesce(v_budget.max_tokens::text, 'no limit on'),
                        coalesce(v_budget.max_cost::text, 'no limit')
            USING ERRCODE = 'OB003', HINT = 'raise the tenant''s budget (`outbox tenants budget`)';
    END IF;

    INSERT INTO {s}.runs AS r (tenant_id, thread_id, model, api, base_url, instructions,
                               tool_names, tool_pins, max_steps, max_tokens, max_cost,
                               loop_limit, action_timeout, idempotency_key, correlation_id)
    VALUES (p_tenant_id, p_thread_id, p_model, p_api, p_base_url, p_instructions,
            coalesce(p_tools, '{}'), v_pins, coalesce(p_max_steps, 20), p_max_tokens, p_max_cost,
            coalesce(p_loop_limit, 3), make_interval(secs => coalesce(p_action_timeout_s, 600)),
            p_idempotency_key,
            coalesce(p_correlation_id, replace(gen_random_uuid()::text, '-', '')))
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
                            max_attempts, payload)
    VALUES (p_tenant_id, 'model_turn', {s}.model_turn_key_v1(v_run.id, 1), p_thread_id, v_run.id,
            v_run.correlation_id, 5, '{"step_no": 1}')
    ON CONFLICT (dedup_key) DO NOTHING;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    VALUES (p_tenant_id, 'run.created', p_thread_id, v_run.id, v_run.correlation_id,
            jsonb_build_object('model', p_model, 'tools', to_jsonb(coalesce(p_tools, '{}')),
                               'tool_versions', v_pins));
    RETURN QUERY SELECT v_run.id, v_run.status, true, v_run.correlation_id;
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
            LEFT JOIN {s}.tool_results r ON r.tool_call_ref = tc.id
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
-- A run that does not exist for the tenant raises P0002; one that already ended raises
-- OB005. Runs as the schema owner (SECURITY DEFINER: ending a run removes outbox rows,
-- which outbox_writer may not delete) and refuses a tenant other than the session's scope.
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
    RETURN {s}.end_run_v1(p_run_id, 'cancelled', 'cancelled', 'cancelled by request',
                          coalesce(p_actor, session_user));
END $$;


-- decide_approval_v1: approve or deny a tool call that waits for approval.
--
-- Answers: "a reviewer looked at this call's arguments and decided".
--
--   SELECT * FROM outbox.decide_approval_v1('tenant-a', 42, 'approve', 'alice');
--   SELECT * FROM outbox.decide_approval_v1('tenant-a', 42, 'deny', 'alice',
--       'refunds over 500 EUR need a manager', 'sha256:…');
--
-- Returns the approval as decided. Guarantees:
--   * decided once: a second decision, whatever it is, is refused (55000) naming the first;
--     an approval never turns into two executions (the call has one outbox row, made due
--     here once);
--   * bound to the arguments: p_digest, when given, must be the digest the approval was
--     requested for (the reviewer saw those arguments), else 22023 and nothing changes;
--   * only a listed approver decides when the policy lists approvers (OB006 otherwise);
--   * past the deadline, or once the run ended, nothing is decided (55000): the relay's
--     sweep denies the call;
--   * journaled as approval.approved or approval.denied with the decider as actor.
-- The relay claims the call within its poll interval (an UPDATE sends no NOTIFY).
-- Runs as the schema owner (SECURITY DEFINER); it acts only for the tenant the transaction
-- is scoped to (outbox.enter_tenant_v1): an unscoped session is refused (42501).
CREATE OR REPLACE FUNCTION {s}.decide_approval_v1(
    p_tenant_id text, p_approval_id bigint, p_decision text, p_decider text,
    p_reason text DEFAULT '', p_digest text DEFAULT NULL
) RETURNS SETOF {s}.approvals
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope    text := {s}.current_tenant_v1();
    v_approval {s}.approvals;
    v_run      {s}.runs;
BEGIN
    IF v_scope IS NULL THEN
        RAISE EXCEPTION 'decide_approval_v1 acts for the tenant this transaction is scoped to, and it has none'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('call outbox.enter_tenant_v1(%L) first in this transaction',
                                p_tenant_id);
    END IF;
    IF v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_decision IS NULL OR p_decision NOT IN ('approve', 'deny') THEN
        RAISE EXCEPTION 'the decision must be ''approve'' or ''deny'', got %', p_decision
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(p_decider, '') = '' THEN
        RAISE EXCEPTION 'a decision needs the decider''s identity'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_approval FROM {s}.approvals WHERE id = p_approval_id;
    IF NOT FOUND OR v_approval.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'approval % does not exist for tenant %', p_approval_id, p_tenant_id
            USING ERRCODE = 'no_data_found', HINT = 'outbox approvals list shows the pending ones';
    END IF;
    -- The run first, then the approval: the lock order of every writer path.
    SELECT * INTO v_run FROM {s}.runs WHERE id = v_approval.run_id FOR UPDATE;
    SELECT * INTO v_approval FROM {s}.approvals WHERE id = p_approval_id FOR UPDATE;
    IF {s}.run_ended_v1(v_run.status) THEN
        RAISE EXCEPTION 'approval % is for run %, which is %: nothing to decide',
            p_approval_id, v_run.id, v_run.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_approval.status <> 'pending' THEN
        RAISE EXCEPTION 'approval % was already decided: % by % at %', p_approval_id,
            v_approval.status, v_approval.decided_by, v_approval.decided_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF p_digest IS NOT NULL AND p_digest <> v_approval.arguments_digest THEN
        RAISE EXCEPTION 'approval % is for arguments with digest %, not %', p_approval_id,
            v_approval.arguments_digest, p_digest
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'show the approval again and decide on the arguments it holds';
    END IF;
    IF cardinality(v_approval.approvers) > 0 AND NOT p_decider = ANY(v_approval.approvers) THEN
        RAISE EXCEPTION '% may not decide approval %: its approvers are %', p_decider,
            p_approval_id, v_approval.approvers
            USING ERRCODE = 'OB006', HINT = 'ask one of the approvers the policy lists';
    END IF;
    IF v_approval.deadline <= now() THEN
        RAISE EXCEPTION 'approval % passed its deadline at %: the call will be denied',
            p_approval_id, v_approval.deadline
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE {s}.approvals
    SET status = CASE p_decision WHEN 'approve' THEN 'approved' ELSE 'denied' END,
        decided_by = p_decider, decided_at = now(), reason = nullif(p_reason, '')
    WHERE id = p_approval_id
    RETURNING * INTO v_approval;
    UPDATE {s}.tool_calls SET status = 'pending', updated_at = now()
    WHERE id = v_approval.tool_call_ref AND status = 'awaiting_approval';
    -- The call's row becomes due: the relay runs it, or answers it with the denial.
    UPDATE {s}.outbox SET available_at = now()
    WHERE tool_call_ref = v_approval.tool_call_ref AND kind = 'tool_call'
      AND status = 'ready' AND available_at = 'infinity';
    INSERT INTO {s}.journal (tenant_id, thread_id, run_id, batch_id, tool_call_ref,
                             tool_call_id, correlation_id, event, actor, detail)
    VALUES (v_approval.tenant_id, v_approval.thread_id, v_approval.run_id,
            v_approval.batch_id, v_approval.tool_call_ref, v_approval.tool_call_id,
            v_run.correlation_id, 'approval.' || v_approval.status, p_decider,
            jsonb_build_object('approval_id', v_approval.id, 'tool', v_approval.tool_name,
                               'arguments_digest', v_approval.arguments_digest,
                               'reason', v_approval.reason, 'rule', v_approval.rule));
    RETURN NEXT v_approval;
END $$;
REVOKE ALL ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text)
    TO outbox_writer, outbox_api;  -- outbox_api: migration 0020


-- stuck_runs: "Which runs are not moving, and why?"
-- reason = 'undelivered_batch': a batch of an active run has every result (status
--   'complete') but no delivery is queued, so nothing will submit its outputs (the classic
--   stall at requires_action);
-- reason = 'lease_expired': a worker holds a lease on the run's work past its expiry (the
--   worker died or stalled; the relay's rescue sweep should take it back);
-- reason = 'past_deadline': the run waits for client outputs (requires_action) past its
--   action deadline (the sweep expires it once no call of it is being executed; outputs
--   submitted meanwhile are refused);
-- reason = 'no_work_queued': the run is queued or in progress but nothing is queued for it
--   (no outbox row, no complete batch), so nothing will ever move it: typically a run
--   inserted by hand or by an ORM without the writer API or start_run_v1;
-- reason = 'parked_call': a row of an active run is quarantined (an operator must requeue,
--   reconcile or release it, or cancel the run): the run waits for it and nothing else will
--   move it.
-- stuck_for says for how long; filter on it to ignore the last few seconds.
CREATE OR REPLACE VIEW {s}.stuck_runs AS
SELECT r.id AS run_id, r.tenant_id, r.thread_id, r.status, 'undelivered_batch' AS reason,
       b.id AS batch_id, NULL::bigint AS outbox_id, b.completed_at AS since,
       now() - b.completed_at AS stuck_for,
       format('batch %s (step %s) has all %s results since %s; no delivery is queued',
              b.id, b.step_no, b.size, b.completed_at) AS detail
FROM {s}.runs r
JOIN {s}.tool_batches b ON b.run_id = r.id AND b.status = 'complete'
WHERE {s}.run_active_v1(r.status)
  AND NOT EXISTS (SELECT 1 FROM {s}.outbox o
                  WHERE o.kind = 'deliver_batch' AND o.batch_id = b.id)
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'lease_expired',
       o.batch_id, o.id, o.lease_expires_at, now() - o.lease_expires_at,
       format('%s row %s leased by %s (attempt %s) expired at %s',
              o.kind, o.id, o.lease_owner, o.attempts, o.lease_expires_at)
FROM {s}.outbox o
JOIN {s}.runs r ON r.id = o.run_id
WHERE o.status = 'leased' AND o.lease_expires_at < now()
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'past_deadline',
       NULL, NULL, r.action_deadline, now() - r.action_deadline,
       format('waiting for client outputs since %s; the deadline was %s',
              r.updated_at, r.action_deadline)
FROM {s}.runs r
WHERE r.status = 'requires_action' AND r.action_deadline < now()
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'no_work_queued',
       NULL, NULL, r.updated_at, now() - r.updated_at,
       format('the run is %s and nothing is queued for it since %s (no outbox row): was it '
              'inserted without the writer API or start_run_v1?', r.status, r.updated_at)
FROM {s}.runs r
WHERE r.status IN ('queued', 'in_progress')
  AND NOT EXISTS (SELECT 1 FROM {s}.outbox o WHERE o.run_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM {s}.tool_batches b
                  WHERE b.run_id = r.id AND b.status = 'complete')
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'parked_call',
       o.batch_id, o.id, coalesce(tc.updated_at, o.available_at),
       now() - coalesce(tc.updated_at, o.available_at),
       format('%s row %s (%s) is quarantined: %s; requeue, reconcile or release it, or '
              'cancel the run', o.kind, o.id, coalesce(tc.tool_name, 'no tool'),
              left(coalesce(o.last_error, 'no error recorded'), 200))
FROM {s}.outbox o
JOIN {s}.runs r ON r.id = o.run_id
LEFT JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
WHERE o.status = 'quarantined' AND {s}.run_active_v1(r.status);
