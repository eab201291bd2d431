-- 0030: one source for the defaults of new runs, one definition of each rule written
-- twice, no claim of a run that is over, and outbox_api without the turn functions.
-- Frozen: what revision 0030 applies, forever.
--
-- * run_defaults: start_run_v1 wrote 20 steps, a loop limit of 3 and 600 s for a missing
--   argument while the Python writer API read its process's environment, so the same
--   settings made different runs by entry point. Both now leave a missing value to this
--   row (`outbox platform defaults`; `outbox db upgrade` stores OUTBOX_DEFAULT_MAX_STEPS,
--   OUTBOX_LOOP_LIMIT and OUTBOX_ACTION_TIMEOUT_S when set). The first model turn's row
--   takes the outbox column's attempts, as every later turn's did.
-- * run_over_v1: "ended, or in requires_action past its deadline", written out by
--   retry_later, quarantine, rescue_expired and submit_tool_outputs_v1; the relay's claim
--   asks it too, so a retry queued before a sweep expires its run is never started.
-- * require_tenant_scope_v1: the scope guard copied into submit_tool_outputs_v1,
--   decide_approval_v1 and enter_tenant_v1.
-- * keep_orphaned_results_v1: the insert into orphaned_results written by
--   record_tool_results_v1, submit_tool_outputs_v1 and the relay's fenced completions.
-- * lane_loads_v1: a lane's count of rows in flight, written by the claim and by
--   `outbox limits`.
-- * start_run_v1 says a tenant's spent money without the twenty decimals of a quotient.
-- * outbox_api may no longer call record_model_turn_v1 / record_model_turns_v1: `outbox
--   serve` records no model turns, and the role lacks the budgets they update (42501).

CREATE TABLE {s}.run_defaults (
    id               boolean PRIMARY KEY DEFAULT true CHECK (id),
    max_steps        integer NOT NULL DEFAULT 20 CHECK (max_steps BETWEEN 1 AND 10000),
    loop_limit       integer NOT NULL DEFAULT 3 CHECK (loop_limit > 1),
    action_timeout_s double precision NOT NULL DEFAULT 600 CHECK (action_timeout_s > 0),
    updated_by       text NOT NULL DEFAULT session_user,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE {s}.run_defaults IS
    'defaults of new runs, one row: start_run_v1 takes each one its caller (SQL or the '
    'Python writer API) leaves out (outbox platform defaults)';
INSERT INTO {s}.run_defaults DEFAULT VALUES;
GRANT SELECT ON {s}.run_defaults TO outbox_writer, outbox_relay, outbox_api, outbox_auditor;


-- run_over_v1: a run whose work may not start any more: it ended, or it waits in
-- requires_action past its deadline (expired from that moment by the database clock,
-- whether or not a sweep has recorded it yet). A row of such a run leaves the queue
-- instead of being claimed, retried, parked or rescued, and outputs for it are refused.
-- STABLE (it reads now()) and plain SQL: inlined where it is called.
CREATE OR REPLACE FUNCTION {s}.run_over_v1(p_status text, p_action_deadline timestamptz)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT {s}.run_ended_v1(p_status)
        OR (p_status = 'requires_action' AND coalesce(p_action_deadline < now(), false))
$$;


-- require_tenant_scope_v1: refuse (42501) unless this session acts for p_tenant_id (the
-- tenant its login role is bound to, else the one its transaction is scoped to:
-- current_tenant_v1). The guard of the functions that act beyond row-level security
-- (submit_tool_outputs_v1, decide_approval_v1) and of enter_tenant_v1; p_caller names the
-- function refused.
CREATE OR REPLACE FUNCTION {s}.require_tenant_scope_v1(p_tenant_id text, p_caller text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope text := {s}.current_tenant_v1();
BEGIN
    IF v_scope IS NULL THEN
        RAISE EXCEPTION '% acts for the tenant this transaction is scoped to, and it has none',
                        p_caller
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('call outbox.enter_tenant_v1(%L) first in this transaction',
                                p_tenant_id);
    ELSIF v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION {s}.require_tenant_scope_v1(text, text) TO PUBLIC;


-- keep_orphaned_results_v1: keep results that may enter no context in orphaned_results.
--
-- The one place a result is orphaned: record_tool_results_v1 (its batch was closed),
-- submit_tool_outputs_v1 (its run is over) and the relay's completions fenced off (the
-- query insert_orphan of outbox/queries/writer.sql) call it. Only operators read them
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


-- lane_loads_v1: every lane with a limit (outbox.lanes: a tool or a tenant) and what it has
-- in flight now (its leased rows, counted through the lease indexes). The one count of a
-- lane's load: the relay's claim passes over lanes at their limit by it, and `outbox
-- limits` shows it. Plain SQL and STABLE, so the planner inlines it into the claim. Runs
-- with the caller's rights: the relay's role and the owner see every tenant's rows.
CREATE OR REPLACE FUNCTION {s}.lane_loads_v1()
RETURNS TABLE (scope text, name text, max_concurrency integer, rate double precision,
               tokens double precision, refilled_at timestamptz, claimed_at timestamptz,
               updated_at timestamptz, in_flight bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.scope, l.name, l.max_concurrency, l.rate, l.tokens, l.refilled_at, l.claimed_at,
           l.updated_at,
           CASE l.scope
               WHEN 'tenant' THEN (SELECT count(*) FROM {s}.outbox o
                                   WHERE o.status = 'leased' AND o.tenant_id = l.name)
               ELSE (SELECT count(*) FROM {s}.outbox o
                     WHERE o.status = 'leased' AND o.tool_name = l.name)
           END
    FROM {s}.lanes l
$$;
REVOKE ALL ON FUNCTION {s}.lane_loads_v1() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.lane_loads_v1() TO outbox_relay;


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
            -- JSON null output is kept as NULL, and was kept as JSON null before 0030).
            WHERE NOT EXISTS (SELECT 1 FROM {s}.tool_results r WHERE r.tool_call_ref = tc.id)
              AND NOT EXISTS (SELECT 1 FROM {s}.orphaned_results x
                              WHERE x.tool_call_ref = tc.id AND x.source = 'client'
                                AND x.status = a.status
                                AND coalesce(x.output, 'null') = coalesce(o->'output', 'null')
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


-- enter_tenant_v1: bind this transaction to a tenant, or refuse another one.
--
-- The first statement of every function below. A session already scoped to a tenant
-- (the transaction-local setting outbox.tenant_id, which the Python writer API and your
-- own middleware may set) may act for that tenant only; an unscoped one is scoped here, so
-- that row-level security shows and accepts only that tenant's rows until the
-- transaction ends. Raises 22023 for an ill-formed tenant id, 42501 for another tenant.
CREATE OR REPLACE FUNCTION {s}.enter_tenant_v1(p_tenant_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id !~ '^[A-Za-z0-9_.:@-]{1,128}$' THEN
        RAISE EXCEPTION 'tenant id % is not valid', quote_nullable(p_tenant_id)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'use 1-128 letters, digits or _.:@-';
    END IF;
    IF {s}.current_tenant_v1() IS NOT NULL THEN
        PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'enter_tenant_v1');
    END IF;
    PERFORM set_config('outbox.tenant_id', p_tenant_id, true);
END $$;


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
--   * unknown tools raise P0002; a thread that does not exist, that row-level
--     security hides, or that was deleted (deleted_at, 0026) raises P0002; one of another tenant (for roles that see every
--     tenant) raises OB004;
--   * a tenant whose token budget is spent raises OB003;
--   * bad arguments raise 22023 naming the argument.
-- Locks the thread, then the run: a run is inserted only under its thread's lock. Runs
-- with the caller's rights under the tenant's row-level security (outbox_writer may call
-- it). p_action_timeout_s, p_max_steps and p_loop_limit default to outbox.run_defaults, the
-- one source of the defaults of new runs for SQL and the Python writer API alike (`outbox
-- platform defaults`); the first model turn's attempts to the outbox column's default, as
-- every later turn's.
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
    v_default {s}.run_defaults;
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
                               loop_limit, action_timeout, idempotency_key, correlation_id)
    VALUES (p_tenant_id, p_thread_id, p_model, p_api, p_base_url, p_instructions,
            coalesce(p_tools, '{}'), v_pins, coalesce(p_max_steps, v_default.max_steps),
            p_max_tokens, p_max_cost, coalesce(p_loop_limit, v_default.loop_limit),
            make_interval(secs => coalesce(p_action_timeout_s, v_default.action_timeout_s)),
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
                            payload)
    VALUES (p_tenant_id, 'model_turn', {s}.model_turn_key_v1(v_run.id, 1), p_thread_id, v_run.id,
            v_run.correlation_id, '{"step_no": 1}')
    ON CONFLICT (dedup_key) DO NOTHING;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
    VALUES (p_tenant_id, 'run.created', p_thread_id, v_run.id, v_run.correlation_id,
            jsonb_build_object('model', p_model, 'tools', to_jsonb(coalesce(p_tools, '{}')),
                               'tool_versions', v_pins));
    RETURN QUERY SELECT v_run.id, v_run.status, true, v_run.correlation_id;
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
    v_approval {s}.approvals;
    v_run      {s}.runs;
BEGIN
    PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'decide_approval_v1');
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


REVOKE EXECUTE ON FUNCTION {s}.record_model_turns_v1(jsonb, jsonb),
                           {s}.record_model_turn_v1(jsonb, jsonb)
    FROM outbox_api;
