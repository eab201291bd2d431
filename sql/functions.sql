-- Functions for backends that do not run Python; `{s}` is the schema. Names carry a
-- version so old and new code can overlap during a deploy. This file is every function but
-- the trigger functions (triggers.sql keeps those beside their triggers), with its grants,
-- as the newest migration leaves it (tests/migration/test_history.py checks it, and that
-- none is missing); migrations carry frozen copies (0003 created submit_tool_outputs_v1,
-- 0016 the status sets, the dedup keys and record_tool_results_v1). Applied after
-- roles.sql, whose roles the grants name.

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

-- Large payloads by reference (0040) ------------------------------------------------------
--
-- An argument, a result or a tool message above payload_inline_max_v1() bytes is stored
-- once per tenant in payloads, keyed by its digest (the hex SHA-256 of its UTF-8 text: for
-- arguments the model's raw text, for a result its output's canonical JSON text, for a
-- tool message its text; a result's body and its tool message's are the same text, so
-- they are stored once), and referenced from its row by the triggers payload_by_reference
-- (triggers.sql). A reference column (tool_calls.arguments_ref, tool_results.output_ref,
-- orphaned_results.output_ref, messages.content_ref) is NULL for a body kept inline; when
-- it is set, the inline column is empty (NULL, or '' for arguments_raw). Every reader
-- resolves with resolved_text_v1 or resolved_json_v1. Nothing below is ever a body that
-- differs from what was written.

-- payload_inline_max_v1: the largest body kept inline, in bytes: the setting
-- outbox.payload_inline_max (ALTER DATABASE ... SET outbox.payload_inline_max = '16384'),
-- 8192 when unset. A change applies to rows written from then on; rows already written
-- keep their form (both are read alike).
CREATE OR REPLACE FUNCTION {s}.payload_inline_max_v1() RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('outbox.payload_inline_max', true), '')::integer,
                    8192)
$$;

-- resolved_text_v1: a text column as written: p_inline, or the body p_ref names. Plain SQL
-- and STABLE: inlined where it is called; runs with the caller's rights (row-level
-- security applies to payloads as to the row that references it).
CREATE OR REPLACE FUNCTION {s}.resolved_text_v1(p_inline text, p_tenant_id text, p_ref text)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_ref IS NULL THEN p_inline
                ELSE (SELECT p.body FROM {s}.payloads p
                      WHERE p.digest = p_ref AND p.tenant_id = p_tenant_id) END
$$;
REVOKE ALL ON FUNCTION {s}.resolved_text_v1(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.resolved_text_v1(text, text, text)
    TO outbox_writer, outbox_relay, outbox_api;

-- resolved_json_v1: a JSON column as written: p_inline, or the body p_ref names as JSON.
CREATE OR REPLACE FUNCTION {s}.resolved_json_v1(p_inline jsonb, p_tenant_id text, p_ref text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_ref IS NULL THEN p_inline
                ELSE (SELECT p.body::jsonb FROM {s}.payloads p
                      WHERE p.digest = p_ref AND p.tenant_id = p_tenant_id) END
$$;
REVOKE ALL ON FUNCTION {s}.resolved_json_v1(jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.resolved_json_v1(jsonb, text, text)
    TO outbox_writer, outbox_relay, outbox_api;

-- payload_digest_v1: the digest a body is stored under.
CREATE OR REPLACE FUNCTION {s}.payload_digest_v1(p_body text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(p_body, 'UTF8')), 'hex')
$$;

-- payload_ref_v1: what the journal says of a body: {"digest", "bytes"} when it is stored
-- by reference (over payload_inline_max_v1()), else NULL (a small body is not named in
-- the journal: it never was). The jsonb form is a result's output; the text form a
-- call's raw arguments.
CREATE OR REPLACE FUNCTION {s}.payload_ref_v1(p_output jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_output IS NOT NULL
                     AND pg_column_size(p_output) * 6 > {s}.payload_inline_max_v1()
                     AND octet_length(p_output::text) > {s}.payload_inline_max_v1()
                THEN jsonb_build_object('digest', {s}.payload_digest_v1(p_output::text),
                                        'bytes', octet_length(p_output::text)) END
$$;
CREATE OR REPLACE FUNCTION {s}.payload_ref_v1(p_text text) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(p_text) > {s}.payload_inline_max_v1()
                THEN jsonb_build_object('digest', {s}.payload_digest_v1(p_text),
                                        'bytes', octet_length(p_text)) END
$$;

-- payload_put_v1: store p_body for p_tenant_id once and return its digest, holding a KEY
-- SHARE lock on its row until the caller commits. A sweep deletes a body only under a FOR
-- UPDATE lock of its row (SKIP LOCKED: a body being referenced is passed over) and after
-- checking again, in a fresh snapshot, that nothing references it; so a body this
-- function found already stored is either locked here before the sweep looks (kept), or
-- deleted first, in which case the lock finds no row and the body is stored again. The
-- reference's foreign key is the last word: no statement can leave a reference to a body
-- that is gone. Only the trigger functions call it (as the schema owner).
CREATE OR REPLACE FUNCTION {s}.payload_put_v1(p_tenant_id text, p_body text)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_digest text := {s}.payload_digest_v1(p_body);
BEGIN
    LOOP
        INSERT INTO {s}.payloads (digest, tenant_id, bytes, body)
        VALUES (v_digest, p_tenant_id, octet_length(p_body), p_body)
        ON CONFLICT (digest, tenant_id) DO NOTHING;
        PERFORM 1 FROM {s}.payloads p
        WHERE p.digest = v_digest AND p.tenant_id = p_tenant_id FOR KEY SHARE;
        IF FOUND THEN
            RETURN v_digest;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION {s}.payload_put_v1(text, text) FROM PUBLIC;

-- payload_referenced_v1: whether any row references the body (p_digest, p_tenant_id), in
-- the caller's snapshot. Each lookup goes through a partial index of references.
CREATE OR REPLACE FUNCTION {s}.payload_referenced_v1(p_digest text, p_tenant_id text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {s}.tool_calls c
                   WHERE c.arguments_ref = p_digest AND c.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.tool_results r
                   WHERE r.output_ref = p_digest AND r.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.orphaned_results o
                   WHERE o.output_ref = p_digest AND o.tenant_id = p_tenant_id)
        OR EXISTS (SELECT 1 FROM {s}.messages m
                   WHERE m.content_ref = p_digest AND m.tenant_id = p_tenant_id)
$$;
REVOKE ALL ON FUNCTION {s}.payload_referenced_v1(text, text) FROM PUBLIC;

-- sweep_payloads_v1: delete bodies nothing references any more; returns how many.
--
--   SELECT outbox.sweep_payloads_v1();                 -- up to 1000 bodies, see below
--   SELECT outbox.sweep_payloads_v1(ARRAY['9f86…']);   -- these digests only
--
-- retain_v1 and erase_thread_v1 sweep the digests they dropped references to; the relay's
-- retention task (and `outbox retention run`) sweeps the rest: a body left by a row
-- refused after its trigger stored it, or passed over below. Without digests it looks at
-- up to p_limit bodies from a random digest on (wrapping around), so each call costs the
-- same however many bodies there are and every body is looked at over the calls. Each
-- candidate is locked FOR UPDATE SKIP LOCKED (a body being referenced right now is locked
-- KEY SHARE by payload_put_v1 and is passed over) and checked again under the lock, in a
-- fresh snapshot, before it goes. Runs as the schema owner (SECURITY DEFINER), every
-- tenant.
CREATE OR REPLACE FUNCTION {s}.sweep_payloads_v1(p_digests text[] DEFAULT NULL,
                                                 p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_row   record;
    v_gone  integer := 0;
    v_seen  integer := 0;
    v_start text;
BEGIN
    IF p_digests IS NOT NULL THEN
        FOR v_row IN
            SELECT p.digest, p.tenant_id FROM {s}.payloads p
            WHERE p.digest = ANY (p_digests)
            ORDER BY p.digest, p.tenant_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        LOOP
            IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
                DELETE FROM {s}.payloads p
                WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
                v_gone := v_gone + 1;
            END IF;
        END LOOP;
        RETURN v_gone;
    END IF;
    v_start := {s}.payload_digest_v1(random()::text);
    FOR v_row IN
        SELECT p.digest, p.tenant_id FROM {s}.payloads p
        WHERE p.digest >= v_start
        ORDER BY p.digest, p.tenant_id
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        v_seen := v_seen + 1;
        IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
            DELETE FROM {s}.payloads p
            WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
            v_gone := v_gone + 1;
        END IF;
    END LOOP;
    FOR v_row IN
        SELECT p.digest, p.tenant_id FROM {s}.payloads p
        WHERE p.digest < v_start
        ORDER BY p.digest, p.tenant_id
        LIMIT greatest(p_limit - v_seen, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        IF NOT {s}.payload_referenced_v1(v_row.digest, v_row.tenant_id) THEN
            DELETE FROM {s}.payloads p
            WHERE p.digest = v_row.digest AND p.tenant_id = v_row.tenant_id;
            v_gone := v_gone + 1;
        END IF;
    END LOOP;
    RETURN v_gone;
END $$;
REVOKE ALL ON FUNCTION {s}.sweep_payloads_v1(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.sweep_payloads_v1(text[], integer) TO outbox_relay;


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
-- error, source, attempt, lag_s (optional: how long the row waited, due, before a claim),
-- span (optional: the attempt's span as the relay timed it, {id, start, end, n}, kept in
-- the journal event for the trace exporter, outbox/traces.py)}, each ref at most once. Returns one row per input, in input order: outcome 'stored',
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
            -- JSON null output is kept as NULL, and was kept as JSON null before 0030).
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
    TO outbox_writer, outbox_api;  -- outbox_api: migration 0020


-- current_tenant_v1: the tenant this session acts for. A login role mapped to a tenant
-- (outbox.tenant_roles, `outbox tenants grant`) acts for that tenant whatever it sets; any
-- other session for the tenant its transaction is scoped to (outbox.tenant_id), or none.
-- Row-level security and the functions below ask it. Its sub-SELECT keeps the planner from
-- inlining it: each call runs its query, executor set up anew. So the policies ask it as
-- (SELECT current_tenant_v1()), an init plan run once a statement, not once a row or a
-- rescan, and enter_tenant_v1 asks it once. It runs as the owner (SECURITY DEFINER, a
-- fixed search_path; migration 0044): tenant_roles is under row-level security, so a plan
-- of its query holds for one user, and as the invoker it was planned again at every call
-- under another user than the last (SET ROLE outbox_api, the SECURITY DEFINER functions).
-- The owner reads every mapping; the query asks for session_user's only.
CREATE OR REPLACE FUNCTION {s}.current_tenant_v1() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT m.tenant_id FROM {s}.tenant_roles m
         WHERE m.role_name OPERATOR(pg_catalog.=) session_user),
        nullif(pg_catalog.current_setting('outbox.tenant_id', true), ''))
$$;
GRANT EXECUTE ON FUNCTION {s}.current_tenant_v1() TO PUBLIC;


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


-- enter_tenant_v1: bind this transaction to a tenant, or refuse another one.
--
-- The first statement of every function below. A session already scoped to a tenant
-- (the transaction-local setting outbox.tenant_id, which the Python writer API and your
-- own middleware may set) may act for that tenant only; an unscoped one is scoped here, so
-- that row-level security shows and accepts only that tenant's rows until the
-- transaction ends. Raises 22023 for an ill-formed tenant id, 42501 for another tenant.
CREATE OR REPLACE FUNCTION {s}.enter_tenant_v1(p_tenant_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope text;
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id !~ '^[A-Za-z0-9_.:@-]{1,128}$' THEN
        RAISE EXCEPTION 'tenant id % is not valid', quote_nullable(p_tenant_id)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'use 1-128 letters, digits or _.:@-';
    END IF;
    -- current_tenant_v1 asked once (it is no cheap call); only a session scoped to another
    -- tenant goes to the guard, which refuses it
    v_scope := {s}.current_tenant_v1();
    IF v_scope IS NOT NULL AND v_scope <> p_tenant_id THEN
        PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'enter_tenant_v1');
    END IF;
    PERFORM set_config('outbox.tenant_id', p_tenant_id, true);
END $$;


-- create_thread_v1: "open a conversation for this tenant".
--
--   SELECT outbox.create_thread_v1('tenant-a');
--   SELECT outbox.create_thread_v1('tenant-a', p_title => 'refunds',
--       p_messages => '[{"role": "system", "content": "You are the refunds desk."}]');
--
-- Returns the thread id. p_messages are opening messages (roles system, user, assistant),
-- stored in order. Journals thread.created. Runs with the caller's rights under the
-- tenant's row-level security (outbox_writer may call it).
CREATE OR REPLACE FUNCTION {s}.create_thread_v1(
    p_tenant_id text,
    p_title text DEFAULT NULL,
    p_metadata jsonb DEFAULT '{}',
    p_messages jsonb DEFAULT '[]'
) RETURNS uuid
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_thread uuid;
    v_cap    integer := coalesce(
                 nullif(current_setting('outbox.max_payload_bytes', true), '')::integer, 262144);
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    IF jsonb_typeof(coalesce(p_messages, '[]')) <> 'array'
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p_messages, '[]')) m
                  WHERE jsonb_typeof(m) <> 'object'
                     OR m->>'role' IS NULL OR m->>'role' NOT IN ('system', 'user', 'assistant')
                     OR jsonb_typeof(m->'content') IS DISTINCT FROM 'string') THEN
        RAISE EXCEPTION 'opening messages must be a JSON array of {"role", "content"}'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'roles are system, user and assistant; content is a string';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(p_messages, '[]')) m
               WHERE octet_length(m->>'content') > v_cap) THEN
        RAISE EXCEPTION 'an opening message is over the cap of % bytes', v_cap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {s}.threads (tenant_id, title, metadata, next_seq)
    VALUES (p_tenant_id, p_title, coalesce(p_metadata, '{}'),
            1 + jsonb_array_length(coalesce(p_messages, '[]')))
    RETURNING id INTO v_thread;
    INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content)
    SELECT p_tenant_id, v_thread, m.n, m.value->>'role', m.value->>'content'
    FROM jsonb_array_elements(coalesce(p_messages, '[]')) WITH ORDINALITY AS m(value, n)
    ORDER BY m.n;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, detail)
    VALUES (p_tenant_id, 'thread.created', v_thread, '{}');
    RETURN v_thread;
END $$;


-- start_run_v2: "start a run on this thread with this user turn".
--
--   SELECT * FROM outbox.start_run_v2('tenant-a', '5b0c…'::uuid, 'gpt-5',
--       p_message => 'Refund order 42', p_tools => ARRAY['lookup_order', 'refund'],
--       p_idempotency_key => 'request-7f3a',
--       p_traceparent => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
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
-- p_traceparent and p_tracestate: the W3C trace context the run continues (the backend's
-- span that starts it), stored with the run: every span of the run (its model turns and
-- tool calls, recorded by whichever relay works on them) joins that trace, and tools and
-- models receive it (docs/operations.md, "Traces"). A resend with the same idempotency key
-- keeps the first request's.
-- Locks the thread, then the run: a run is inserted only under its thread's lock. Runs
-- with the caller's rights under the tenant's row-level security (outbox_writer may call
-- it). p_action_timeout_s, p_max_steps and p_loop_limit default to outbox.run_defaults, the
-- one source of the defaults of new runs for SQL and the Python writer API alike (`outbox
-- platform defaults`); the first model turn's attempts to the outbox column's default, as
-- every later turn's.
CREATE OR REPLACE FUNCTION {s}.start_run_v2(
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
    p_tracestate text DEFAULT NULL
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
    ELSIF p_traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
          OR p_traceparent ~ '^00-0{32}-' OR p_traceparent ~ '-0{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'p_traceparent must be a W3C traceparent (00-<32 hex digits, trace id>-<16 hex digits, parent id>-<2 hex digits, flags>, lower case, ids not all zero), not %', quote_literal(p_traceparent)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the traceparent header of the request that starts the run as it came, or NULL';
    ELSIF p_tracestate IS NOT NULL AND (p_traceparent IS NULL OR length(p_tracestate) > 512) THEN
        RAISE EXCEPTION 'p_tracestate must come with p_traceparent and be at most 512 characters'
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
                               traceparent, tracestate)
    VALUES (p_tenant_id, p_thread_id, p_model, p_api, p_base_url, p_instructions,
            coalesce(p_tools, '{}'), v_pins, coalesce(p_max_steps, v_default.max_steps),
            p_max_tokens, p_max_cost, coalesce(p_loop_limit, v_default.loop_limit),
            make_interval(secs => coalesce(p_action_timeout_s, v_default.action_timeout_s)),
            p_idempotency_key,
            coalesce(p_correlation_id, replace(gen_random_uuid()::text, '-', '')),
            p_traceparent, p_tracestate)
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


-- start_run_v1: start_run_v2 without a trace context (the run starts a trace of its own);
-- kept for callers written against it.
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
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM {s}.start_run_v2(p_tenant_id, p_thread_id, p_model, p_message, p_tools,
                                   p_idempotency_key, p_api, p_base_url, p_instructions,
                                   p_max_steps, p_max_tokens, p_loop_limit, p_action_timeout_s,
                                   p_correlation_id, p_max_cost)
$$;


-- same_run_request_v1: the run an idempotency key already started, if the request is the
-- same (thread, user message, model and set of tools; the order of the tools is not part
-- of it); else OB002 naming what differs. A helper of start_run_v2.
CREATE OR REPLACE FUNCTION {s}.same_run_request_v1(
    p_run {s}.runs, p_thread_id uuid, p_idempotency_key text, p_message text, p_model text,
    p_tools text[]
) RETURNS TABLE (run_id uuid, status text, created boolean, correlation_id text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_message text;
    v_differ  text[] := '{}';
BEGIN
    SELECT m.content INTO v_message FROM {s}.messages m
    WHERE m.thread_id = p_run.thread_id AND m.run_id = p_run.id AND m.role = 'user'
    ORDER BY m.seq LIMIT 1;
    IF p_run.thread_id <> p_thread_id THEN
        v_differ := v_differ || 'thread'::text;
    END IF;
    IF v_message IS DISTINCT FROM p_message THEN
        v_differ := v_differ || 'message'::text;
    END IF;
    IF p_run.model IS DISTINCT FROM p_model THEN
        v_differ := v_differ || 'model'::text;
    END IF;
    IF ARRAY(SELECT DISTINCT t FROM unnest(coalesce(p_run.tool_names, '{}')) t ORDER BY t)
       <> ARRAY(SELECT DISTINCT t FROM unnest(coalesce(p_tools, '{}')) t ORDER BY t) THEN
        v_differ := v_differ || 'tools'::text;
    END IF;
    IF cardinality(v_differ) > 0 THEN
        RAISE EXCEPTION 'idempotency key % already started run % with another %',
                        quote_literal(p_idempotency_key), p_run.id,
                        array_to_string(v_differ, ' and ')
            USING ERRCODE = 'OB002',
                  HINT = 'use a new key for a new turn; resend a turn with exactly its first request';
    END IF;
    RETURN QUERY SELECT p_run.id, p_run.status, false, p_run.correlation_id;
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
            LEFT JOIN (SELECT x.tool_call_ref, x.status, x.error,
                              {s}.resolved_json_v1(x.output, x.tenant_id, x.output_ref) AS output
                       FROM {s}.tool_results x) r ON r.tool_call_ref = tc.id
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
-- The run is marked agent_span_due (and cancelled_by): the trace exporter builds its
-- invoke_agent span once this commits (outbox/traces.py; every run that ends is marked,
-- since 0042, by the runs_span_due trigger). A run that does not exist for the tenant
-- raises P0002; one that already ended raises OB005. Runs as the schema owner (SECURITY
-- DEFINER: ending a run removes outbox rows, which outbox_writer may not delete) and
-- refuses a tenant other than the session's scope.
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
    PERFORM {s}.end_run_v1(p_run_id, 'cancelled', 'cancelled', 'cancelled by request',
                           coalesce(p_actor, session_user));
    UPDATE {s}.runs
    SET agent_span_due = true, cancelled_by = coalesce(p_actor, session_user)
    WHERE id = p_run_id
    RETURNING * INTO v_run;
    RETURN v_run;
END $$;

REVOKE ALL ON FUNCTION {s}.enter_tenant_v1(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.start_run_v2(text, uuid, text, text, text[], text, text, text, text,
                                         integer, bigint, integer, double precision, text,
                                         numeric, text, text)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.cancel_run_v1(text, uuid, text) FROM PUBLIC;
-- The relay enters a tenant (record_model_turns_v1 calls enter_tenant_v1 as its invoker) but
-- starts, creates and cancels nothing (migration 0041).
GRANT EXECUTE ON FUNCTION {s}.enter_tenant_v1(text) TO outbox_writer, outbox_relay, outbox_api;
GRANT EXECUTE ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb),
                          {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric),
                          {s}.start_run_v2(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric, text, text),
                          {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                          {s}.cancel_run_v1(text, uuid, text)
    TO outbox_writer, outbox_api;  -- outbox_api: migration 0020


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
REVOKE ALL ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text)
    TO outbox_writer, outbox_api;  -- outbox_api: migration 0020


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
-- exporter (outbox/traces.py).
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
    TO outbox_writer, outbox_relay;  -- not outbox_api: `outbox serve` records no turns (0030)


-- journal_ddl_lock_v1: the key of the transaction-level advisory lock that the journal's
-- DDL takes before anything else (prune_journal's drops, journal_partitions_v1's attaches),
-- so that one runs at a time: each waited for a lock the other held (the journal, its
-- default partition) and PostgreSQL ended one as a deadlock. One key per schema.
CREATE OR REPLACE FUNCTION {s}.journal_ddl_lock_v1() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.hashtextextended('{s}.journal ddl', 0)
$$;
REVOKE ALL ON FUNCTION {s}.journal_ddl_lock_v1() FROM PUBLIC;


-- prune_journal: remove journal events older than older_than, journaled first
-- (journal.pruned, with the cut-off, the count and the partitions dropped); returns how
-- many it removed.
--
--   SELECT outbox.prune_journal(interval '90 days');   -- or: outbox prune --older-than 90d
--
-- The journal is partitioned by day, or by the width journal_partitions_v1 was given (0036):
-- a partition wholly older than the cut-off (its upper bound at or before it) is dropped
-- whole (no row deleted, nothing left to vacuum); one that straddles the cut-off stays
-- whole until it is past it, so an event is kept at most a partition longer than the age. Rows
-- of the default partition (days journal_partitions_v1 had not made) and of the journal
-- from before 0036 (journal_upto_YYYYMMDD) are deleted by row through the journal guard's
-- door (journal_refuse_change, triggers.sql), which opens on those partitions only: it
-- marks its transaction with the id of the journal.pruned event it wrote, and the guard
-- lets through deletions of rows older than that event's cut-off. Runs with its owner's
-- rights (SECURITY DEFINER); only the owner (and superusers) may execute it. Dropping a
-- day takes a lock on the journal that inserts wait for: it gives up after lock_timeout
-- (2 s) and changes nothing.
CREATE OR REPLACE FUNCTION {s}.prune_journal(older_than interval, actor text DEFAULT session_user)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s' AS $$
DECLARE
    removed bigint := 0;
    v_rows bigint;
    v_before timestamptz;
    v_event bigint;
    v_part record;
    v_drop text[] := '{}';
    v_trim text[] := '{}';
    v_name text;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune_journal needs a positive age, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Before any lock on the journal or its partitions: journal_partitions_v1 takes the
    -- same lock first, so the two never hold locks the other waits for (a drop waits for
    -- the journal an ATTACH holds, the ATTACH for the default partition this read).
    PERFORM pg_advisory_xact_lock({s}.journal_ddl_lock_v1());
    v_before := now() - older_than;
    FOR v_part IN
        SELECT c.relname,
               c.relname <> 'journal_default'
               AND (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                 'TO \(''([^'']+)''\)'))[1]::timestamptz <= v_before AS whole
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{s}.journal'::regclass
        ORDER BY c.relname
    LOOP
        IF v_part.whole THEN
            EXECUTE format('SELECT count(*) FROM {s}.%I', v_part.relname) INTO v_rows;
            v_drop := v_drop || v_part.relname::text;
        ELSIF v_part.relname = 'journal_default' OR v_part.relname ~ '^journal_upto_[0-9]{8}$' THEN
            EXECUTE format('SELECT count(*) FROM {s}.%I WHERE at < %L', v_part.relname, v_before)
                INTO v_rows;
            CONTINUE WHEN v_rows = 0;
            v_trim := v_trim || v_part.relname::text;
        ELSE
            CONTINUE;
        END IF;
        removed := removed + v_rows;
    END LOOP;
    INSERT INTO {s}.journal (tenant_id, event, actor, detail)
    VALUES ('*', 'journal.pruned', actor,
            jsonb_build_object('older_than', older_than::text, 'removed', removed,
                               'before', v_before, 'partitions_dropped', to_jsonb(v_drop)))
    RETURNING id INTO v_event;
    FOREACH v_name IN ARRAY v_drop LOOP
        EXECUTE format('DROP TABLE {s}.%I', v_name);
    END LOOP;
    PERFORM set_config('outbox.journal_prune', v_event::text, true);
    FOREACH v_name IN ARRAY v_trim LOOP
        EXECUTE format('DELETE FROM {s}.%I WHERE at < %L', v_name, v_before);
    END LOOP;
    PERFORM set_config('outbox.journal_prune', '', true);
    RETURN removed;
END $$;
REVOKE ALL ON FUNCTION {s}.prune_journal(interval, text) FROM PUBLIC;


-- api_key_tenant_v1: "which tenant does this key act for?" `outbox serve` looks a request's
-- key up before any tenant is known: given the SHA-256 of a key it answers the key's
-- tenant, or NULL for an unknown or revoked key, without its caller reading api_keys
-- (SECURITY DEFINER). Nothing else about keys is visible through it.
CREATE OR REPLACE FUNCTION {s}.api_key_tenant_v1(p_key_hash text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT tenant_id FROM {s}.api_keys WHERE key_hash = p_key_hash AND revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION {s}.api_key_tenant_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.api_key_tenant_v1(text) TO outbox_api;


-- console_account_v1: "who is this name, and may they try a password now?" The console
-- looks a person up before any tenant is known (SECURITY DEFINER, as api_key_tenant_v1):
-- the account's tenant, role and password hash, and whether it is locked now.
CREATE OR REPLACE FUNCTION {s}.console_account_v1(p_name text)
RETURNS TABLE (name text, tenant_id text, role text, password_hash text, locked boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.name, u.tenant_id, u.role, u.password_hash,
           coalesce(u.locked_until > now(), false)
    FROM {s}.console_users u WHERE u.name = p_name
$$;
REVOKE ALL ON FUNCTION {s}.console_account_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_account_v1(text) TO outbox_api;

-- console_signed_in_v1: the outcome of a sign-in the console checked. A right password
-- (p_token_hash given) clears the count of failures and opens a session until p_ttl from
-- now; a wrong one (p_token_hash NULL) counts a failure, and the p_max_failures-th in a row
-- locks the account for p_lockout and starts the count again. A locked account opens no
-- session whatever it is given. Returns whether a session was opened.
CREATE OR REPLACE FUNCTION {s}.console_signed_in_v1(
    p_name text, p_token_hash text, p_csrf_token text, p_ttl interval,
    p_max_failures integer DEFAULT 5, p_lockout interval DEFAULT '15 minutes'
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_user {s}.console_users;
BEGIN
    SELECT * INTO v_user FROM {s}.console_users u WHERE u.name = p_name FOR UPDATE;
    IF NOT FOUND OR coalesce(v_user.locked_until > now(), false) THEN
        RETURN false;
    END IF;
    IF p_token_hash IS NULL THEN
        UPDATE {s}.console_users u
        SET failed_attempts = CASE WHEN v_user.failed_attempts + 1 >= p_max_failures THEN 0
                                   ELSE v_user.failed_attempts + 1 END,
            locked_until = CASE WHEN v_user.failed_attempts + 1 >= p_max_failures
                                THEN now() + p_lockout ELSE u.locked_until END
        WHERE u.name = p_name;
        RETURN false;
    END IF;
    UPDATE {s}.console_users u SET failed_attempts = 0, locked_until = NULL
    WHERE u.name = p_name;
    INSERT INTO {s}.console_sessions (token_hash, user_name, tenant_id, csrf_token, expires_at)
    VALUES (p_token_hash, p_name, v_user.tenant_id, p_csrf_token, now() + p_ttl);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION {s}.console_signed_in_v1(text, text, text, interval, integer, interval)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_signed_in_v1(text, text, text, interval, integer, interval)
    TO outbox_api;

-- console_session_v1: "who holds this cookie?" The person of an unexpired session (by the
-- SHA-256 of its token), with the session's CSRF token; no row otherwise.
CREATE OR REPLACE FUNCTION {s}.console_session_v1(p_token_hash text)
RETURNS TABLE (name text, tenant_id text, role text, csrf_token text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT u.name, u.tenant_id, u.role, s.csrf_token
    FROM {s}.console_sessions s JOIN {s}.console_users u ON u.name = s.user_name
    WHERE s.token_hash = p_token_hash AND s.expires_at > now()
$$;
REVOKE ALL ON FUNCTION {s}.console_session_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_session_v1(text) TO outbox_api;

-- console_signed_out_v1: end a session (by the SHA-256 of its token), and any expired one.
CREATE OR REPLACE FUNCTION {s}.console_signed_out_v1(p_token_hash text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM {s}.console_sessions s
    WHERE s.token_hash = p_token_hash OR s.expires_at <= now()
$$;
REVOKE ALL ON FUNCTION {s}.console_signed_out_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.console_signed_out_v1(text) TO outbox_api;


-- retention_cutoff_v1: "before when must a conversation of this tenant have been last
-- active to leave the hot tables?" now() minus the tenant's retention age, or the default
-- ('*') policy's; NULL when neither exists (kept forever).
CREATE OR REPLACE FUNCTION {s}.retention_cutoff_v1(p_tenant_id text)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() - p.max_age FROM {s}.retention_policies p
    WHERE p.tenant_id IN (p_tenant_id, '*')
    ORDER BY p.tenant_id = '*'
    LIMIT 1
$$;
REVOKE ALL ON FUNCTION {s}.retention_cutoff_v1(text) FROM PUBLIC;


-- thread_idle_v1: "may this thread leave the hot tables?" Every run of it ended before
-- p_before, no message written since, no work of its runs left in the outbox (a webhook to
-- deliver, a call parked for an operator), and no response of another thread continues one
-- of its responses. An active run (queued, in progress, waiting for outputs or for an
-- approval) keeps its thread, whatever its age.
CREATE OR REPLACE FUNCTION {s}.thread_idle_v1(p_thread_id uuid, p_before timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM {s}.runs r
                       WHERE r.thread_id = p_thread_id
                         AND NOT ({s}.run_ended_v1(r.status)
                                  AND coalesce(r.ended_at, r.updated_at) < p_before))
       AND NOT EXISTS (SELECT 1 FROM {s}.messages m
                       WHERE m.thread_id = p_thread_id AND m.created_at >= p_before)
       AND NOT EXISTS (SELECT 1 FROM {s}.runs r JOIN {s}.outbox o ON o.run_id = r.id
                       WHERE r.thread_id = p_thread_id)
       AND NOT EXISTS (SELECT 1 FROM {s}.responses x
                       JOIN {s}.responses y ON y.previous_response_id = x.id
                       WHERE x.thread_id = p_thread_id AND y.thread_id <> p_thread_id)
$$;
REVOKE ALL ON FUNCTION {s}.thread_idle_v1(uuid, timestamptz) FROM PUBLIC;


-- archived_row_v1 (0040): a row of a conversation as the archive keeps it (run_document_v1,
-- retain_v1): its bodies inline, whether it held them inline or by reference, and no
-- reference columns (an archived document stands alone: the bodies it references leave
-- payloads with the row).
CREATE OR REPLACE FUNCTION {s}.archived_row_v1(p_row jsonb)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT (p_row - 'content_ref' - 'arguments_ref' - 'output_ref')
        || CASE WHEN p_row ->> 'content_ref' IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('content', {s}.resolved_text_v1(
                         NULL, p_row ->> 'tenant_id', p_row ->> 'content_ref')) END
        || CASE WHEN p_row ->> 'arguments_ref' IS NULL THEN '{}'::jsonb
                ELSE (SELECT jsonb_build_object('arguments_raw', b.body,
                                                'arguments', b.body::jsonb)
                      FROM (SELECT {s}.resolved_text_v1(NULL, p_row ->> 'tenant_id',
                                                        p_row ->> 'arguments_ref') AS body) b)
           END
        || CASE WHEN p_row ->> 'output_ref' IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('output', {s}.resolved_json_v1(
                         NULL, p_row ->> 'tenant_id', p_row ->> 'output_ref')) END
$$;
REVOKE ALL ON FUNCTION {s}.archived_row_v1(jsonb) FROM PUBLIC;


-- run_document_v1: a run and every row under it as one JSON document (what the archive
-- keeps): the run, its assistant, messages, model turns, batches, tool calls, results,
-- orphaned results, submissions, approvals, responses, webhook deliveries and journal
-- events, each a list of rows in order.
CREATE OR REPLACE FUNCTION {s}.run_document_v1(p_run_id uuid)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'run', (SELECT to_jsonb(r) FROM {s}.runs r WHERE r.id = p_run_id),
        'assistant_run', (SELECT to_jsonb(a) FROM {s}.assistant_runs a WHERE a.run_id = p_run_id),
        'messages', (SELECT coalesce(jsonb_agg({s}.archived_row_v1(to_jsonb(m))
                                           ORDER BY m.seq), '[]')
                     FROM {s}.messages m WHERE m.run_id = p_run_id),
        'model_turns', (SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY t.step_no), '[]')
                        FROM {s}.model_turns t WHERE t.run_id = p_run_id),
        'tool_batches', (SELECT coalesce(jsonb_agg(to_jsonb(b) ORDER BY b.step_no), '[]')
                         FROM {s}.tool_batches b WHERE b.run_id = p_run_id),
        'tool_calls', (SELECT coalesce(jsonb_agg({s}.archived_row_v1(to_jsonb(c))
                                             ORDER BY c.id), '[]')
                       FROM {s}.tool_calls c WHERE c.run_id = p_run_id),
        'tool_results', (SELECT coalesce(jsonb_agg({s}.archived_row_v1(to_jsonb(x))
                                               ORDER BY x.tool_call_ref), '[]')
                         FROM {s}.tool_results x
                         WHERE x.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c
                                                   WHERE c.run_id = p_run_id)),
        'orphaned_results', (SELECT coalesce(jsonb_agg({s}.archived_row_v1(to_jsonb(o))
                                                   ORDER BY o.id), '[]')
                             FROM {s}.orphaned_results o
                             WHERE o.run_id = p_run_id
                                OR o.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c
                                                       WHERE c.run_id = p_run_id)),
        'submissions', (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.id), '[]')
                        FROM {s}.submissions x WHERE x.run_id = p_run_id),
        'approvals', (SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.id), '[]')
                      FROM {s}.approvals a WHERE a.run_id = p_run_id),
        'responses', (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.created_at), '[]')
                      FROM {s}.responses x WHERE x.run_id = p_run_id),
        'webhook_deliveries', (SELECT coalesce(jsonb_agg(to_jsonb(w) ORDER BY w.id), '[]')
                               FROM {s}.webhook_deliveries w WHERE w.run_id = p_run_id),
        'journal', (SELECT coalesce(jsonb_agg(to_jsonb(j) ORDER BY j.id), '[]')
                    FROM {s}.journal j WHERE j.run_id = p_run_id))
$$;
REVOKE ALL ON FUNCTION {s}.run_document_v1(uuid) FROM PUBLIC;


-- journal_partitions_v1: make the journal's partitions for the current span and the next
-- p_ahead spans that do not exist yet; returns how many it made. A span is one UTC day, or
-- the width the setting outbox.journal_partition_width gives (an interval from 1 second to
-- 1 day, e.g. ALTER DATABASE app SET outbox.journal_partition_width = '1 hour'; read from
-- the calling session). Spans are aligned on the width from the Unix epoch and named by
-- their start in UTC: journal_YYYYMMDD (a day), journal_YYYYMMDD_HHMI (whole minutes),
-- journal_YYYYMMDD_HHMISS. A change of width applies to the partitions made after it: the
-- first goes on where the newest existing partition ends (no overlap, no gap), and ends on
-- the next boundary of the new width. Run ahead by the relay's maintenance and by `outbox
-- retention run`, so a span's rows never land in the default partition; two callers at once
-- make each partition once. A span whose rows the default partition already caught
-- (maintenance did not run in time) gets no partition: its rows stay in the default,
-- pruned by row, and the next span is made as usual.
CREATE OR REPLACE FUNCTION {s}.journal_partitions_v1(p_ahead integer DEFAULT 2)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s' AS $$
DECLARE
    v_setting text := coalesce(nullif(current_setting('outbox.journal_partition_width', true), ''),
                               '1 day');
    v_width   interval;
    v_w       bigint;
    v_now     timestamptz := now();
    v_current timestamptz;
    v_until   timestamptz;
    v_from    timestamptz;
    v_to      timestamptz;
    v_name    text;
    v_made    integer := 0;
BEGIN
    BEGIN
        v_width := v_setting::interval;
    EXCEPTION WHEN OTHERS THEN
        v_width := NULL;
    END;
    v_w := extract(epoch FROM v_width)::bigint;
    IF v_width IS NULL OR v_w NOT BETWEEN 1 AND 86400 OR extract(epoch FROM v_width) <> v_w THEN
        RAISE EXCEPTION 'outbox.journal_partition_width must be a whole number of seconds from '
                        '1 second to 1 day, got %', quote_literal(v_setting)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'e.g. ALTER DATABASE <db> SET outbox.journal_partition_width = '
                         '''1 hour''; unset, a partition is one UTC day';
    END IF;
    -- One journal DDL at a time (prune_journal, another caller of this): when one runs,
    -- this round makes nothing and the next makes what is missing.
    IF NOT pg_try_advisory_xact_lock({s}.journal_ddl_lock_v1()) THEN
        RETURN 0;
    END IF;
    -- Partitions are aligned on the width from the Unix epoch (a day: UTC midnight); the
    -- first one made goes on where the newest one ends (no overlap, no gap), then realigns.
    v_current := to_timestamp(floor(extract(epoch FROM v_now) / v_w) * v_w);
    v_until := v_current + v_width * (greatest(p_ahead, 0) + 1);
    SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid),
                             'TO \(''([^'']+)''\)'))[1]::timestamptz)
    INTO v_from
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = '{s}.journal'::regclass AND c.relname <> 'journal_default';
    v_from := greatest(v_from, v_current);
    WHILE v_from < v_until LOOP
        v_to := to_timestamp(floor(extract(epoch FROM v_from) / v_w) * v_w) + v_width;
        v_name := 'journal_' || CASE
            WHEN v_w = 86400 AND v_to - v_from = v_width THEN to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD')
            WHEN v_w % 60 = 0 AND extract(second FROM v_from) = 0
                THEN to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MI')
            ELSE to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS') END;
        -- A span the default partition already caught rows of keeps them there (they are
        -- pruned by row): attaching it would have to move them, and nothing moves journal
        -- rows. The next span is made as usual.
        IF to_regclass('{s}.' || quote_ident(v_name)) IS NULL
           AND NOT EXISTS (SELECT 1 FROM {s}.journal_default d
                           WHERE d.at >= v_from AND d.at < v_to) THEN
            BEGIN
                -- Made apart and attached: ATTACH takes a SHARE UPDATE EXCLUSIVE lock on the
                -- journal, which the inserts of the hot path do not wait on.
                EXECUTE format('CREATE TABLE {s}.%I (LIKE {s}.journal INCLUDING DEFAULTS)',
                               v_name);
                EXECUTE format('ALTER TABLE {s}.journal ATTACH PARTITION {s}.%I '
                               'FOR VALUES FROM (%L) TO (%L)', v_name, v_from, v_to);
                EXECUTE format('CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON {s}.%I '
                               'FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_refuse_change()',
                               v_name);
                v_made := v_made + 1;
            EXCEPTION
                WHEN duplicate_table THEN NULL;  -- another maintenance task made it first
                WHEN check_violation THEN NULL;  -- the default caught a row of it meanwhile
                -- busy, or another task (of another width) made this span meanwhile: the
                -- next round goes on from the newest partition
                WHEN lock_not_available OR invalid_object_definition THEN EXIT;
            END;
        END IF;
        v_from := v_to;
    END LOOP;
    RETURN v_made;
END $$;
REVOKE ALL ON FUNCTION {s}.journal_partitions_v1(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.journal_partitions_v1(integer) TO outbox_relay;


-- archive_partitions_v1: make the archive's partitions for today and the next p_days_ahead
-- days (UTC days) that do not exist yet; returns how many it made. Run ahead by the relay's
-- maintenance (and by retain_v1 for today), so archiving never waits on DDL; two callers at
-- once make each partition once. Without an archiving policy it makes none. A partition takes row-level security with no policy: it is
-- read through archived_runs, whose policies apply.
CREATE OR REPLACE FUNCTION {s}.archive_partitions_v1(p_days_ahead integer DEFAULT 2)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
    v_day   date;
    v_name  text;
    v_made  integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {s}.retention_policies p WHERE p.mode = 'archive') THEN
        RETURN 0;  -- nothing is archived: no partition is needed
    END IF;
    FOR v_day IN SELECT (v_today + k) FROM generate_series(0, greatest(p_days_ahead, 0)) k LOOP
        v_name := 'archived_runs_' || to_char(v_day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass('{s}.' || quote_ident(v_name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE {s}.%I PARTITION OF {s}.archived_runs '
                           'FOR VALUES FROM (%L) TO (%L)', v_name,
                           v_day::timestamp AT TIME ZONE 'UTC',
                           (v_day + 1)::timestamp AT TIME ZONE 'UTC');
            EXECUTE format('ALTER TABLE {s}.%I ENABLE ROW LEVEL SECURITY, '
                           'FORCE ROW LEVEL SECURITY', v_name);
            v_made := v_made + 1;
        EXCEPTION WHEN duplicate_table THEN
            NULL;  -- another maintenance task made it first
        END;
    END LOOP;
    RETURN v_made;
END $$;
REVOKE ALL ON FUNCTION {s}.archive_partitions_v1(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.archive_partitions_v1(integer) TO outbox_relay;


-- prune_archive_v1: drop the archive's days older than the default policy's archive_keep,
-- a whole partition at a time (no row is deleted, nothing is left to vacuum); journals
-- archive.dropped per partition with its row count. Returns the partitions dropped. With no
-- archive_keep, the archive is kept forever.
CREATE OR REPLACE FUNCTION {s}.prune_archive_v1(p_actor text DEFAULT session_user)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_keep interval;
    v_part record;
    v_rows bigint;
BEGIN
    SELECT p.archive_keep INTO v_keep FROM {s}.retention_policies p WHERE p.tenant_id = '*';
    IF v_keep IS NULL THEN
        RETURN;
    END IF;
    FOR v_part IN
        SELECT c.relname, to_date(right(c.relname, 8), 'YYYYMMDD') AS day
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{s}.archived_runs'::regclass
          AND c.relname ~ '^archived_runs_[0-9]{8}$'
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
              <= now() - v_keep
        ORDER BY 2
    LOOP
        EXECUTE format('SELECT count(*) FROM {s}.%I', v_part.relname) INTO v_rows;
        EXECUTE format('DROP TABLE {s}.%I', v_part.relname);
        INSERT INTO {s}.journal (tenant_id, event, actor, detail)
        VALUES ('*', 'archive.dropped', p_actor,
                jsonb_build_object('partition', v_part.relname, 'day', v_part.day,
                                   'rows', v_rows, 'archive_keep', v_keep::text));
        RETURN NEXT v_part.relname;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION {s}.prune_archive_v1(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.prune_archive_v1(text) TO outbox_relay;


-- retain_v1: one chunk of retention: "move up to p_limit idle conversations out of the
-- hot tables".
--
--   SELECT * FROM outbox.retain_v1(200);   -- or: outbox retention run
--
-- p_after, the horizon (0036): candidates are read oldest first from there (threads
-- created at or after it); every row returned carries the horizon the next chunk of the
-- same round passes back: the creation time of the last candidate this chunk read. So a
-- round reads each old thread that is not idle (a run in flight, a message written since)
-- once, not once per chunk; the next round starts from the oldest again (NULL).
--
-- A conversation (a thread and everything under it: runs, messages, model turns, batches,
-- tool calls, results, orphaned results, submissions, approvals, responses, webhook
-- deliveries, the journal events of its runs) leaves when its tenant's policy says so and
-- thread_idle_v1 holds: archived (archived_runs, one document per run and one for the
-- thread) or deleted, as the policy's mode says. Journals thread.retained per thread.
-- Returns what it retained per tenant and mode; no row: nothing was due. Call it again
-- (with the horizon it returned) until it returns fewer than p_limit threads.
--
-- Locking: it waits on nobody. Threads are locked FOR UPDATE SKIP LOCKED (a start of a run
-- on a thread being retained waits for this chunk and then finds no thread), their runs in
-- id order, SKIP LOCKED (a thread with a run someone holds is left for a later chunk), and
-- idleness is checked again under the locks; anything else it would wait on past
-- lock_timeout makes the chunk give up (55P03) and leaves everything as it was.
-- The journal events of the retained runs and threads are deleted through the journal
-- guard's retention door: rows of runs or threads that no longer exist, in a transaction
-- that journaled thread.retained first. Each conversation's thread.retained (and
-- thread.erased) events stay, its account, until the journal's own pruning.
CREATE OR REPLACE FUNCTION {s}.retain_v1(p_limit integer DEFAULT 200,
                                         p_actor text DEFAULT session_user,
                                         p_after timestamptz DEFAULT NULL)
RETURNS TABLE (tenant_id text, mode text, threads integer, runs integer, horizon timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s' AS $$
DECLARE
    v_oldest  timestamptz;
    v_threads uuid[];
    v_locked  uuid[];
    v_runs    uuid[];
    v_archive uuid[];
    v_event   bigint;
    v_bodies  text[];
    v_horizon timestamptz;
    v_since   timestamptz;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'retain_v1 takes 1 to 10000 threads per chunk, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT now() - min(p.max_age) INTO v_oldest FROM {s}.retention_policies p;
    IF v_oldest IS NULL THEN
        RETURN;
    END IF;
    -- v_since: no event of a conversation is older than its thread, so the journal's days
    -- before the oldest candidate are not read for their events (0036).
    SELECT array_agg(c.id), max(c.created_at), min(c.created_at)
    INTO v_threads, v_horizon, v_since FROM (
        SELECT t.id, t.created_at FROM {s}.threads t
        WHERE t.created_at < v_oldest
          AND t.created_at >= coalesce(p_after, '-infinity')
          AND t.created_at < {s}.retention_cutoff_v1(t.tenant_id)
          AND {s}.thread_idle_v1(t.id, {s}.retention_cutoff_v1(t.tenant_id))
        ORDER BY t.created_at
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED) c;
    IF v_threads IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(l.id) INTO v_locked FROM (
        SELECT r.id FROM {s}.runs r WHERE r.thread_id = ANY (v_threads)
        ORDER BY r.id FOR UPDATE SKIP LOCKED) l;
    -- Under the locks, in a fresh snapshot: a run started or a message written between
    -- the choice and the lock keeps its thread.
    SELECT array_agg(t.id) INTO v_threads FROM {s}.threads t
    WHERE t.id = ANY (v_threads)
      AND {s}.thread_idle_v1(t.id, {s}.retention_cutoff_v1(t.tenant_id))
      AND NOT EXISTS (SELECT 1 FROM {s}.runs r
                      WHERE r.thread_id = t.id AND r.id <> ALL (coalesce(v_locked, '{}')));
    IF v_threads IS NULL THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(r.id), '{}') INTO v_runs
    FROM {s}.runs r WHERE r.thread_id = ANY (v_threads);
    SELECT coalesce(array_agg(t.id), '{}') INTO v_archive
    FROM {s}.threads t JOIN LATERAL (
        SELECT p.mode FROM {s}.retention_policies p
        WHERE p.tenant_id IN (t.tenant_id, '*') ORDER BY p.tenant_id = '*' LIMIT 1) p ON true
    WHERE t.id = ANY (v_threads) AND p.mode = 'archive';

    IF cardinality(v_archive) > 0 THEN
        PERFORM {s}.archive_partitions_v1(0);
        INSERT INTO {s}.archived_runs (tenant_id, thread_id, run_id, status, created_at,
                                       ended_at, correlation_id, document)
        SELECT r.tenant_id, r.thread_id, r.id, r.status, r.created_at,
               coalesce(r.ended_at, r.updated_at), r.correlation_id, {s}.run_document_v1(r.id)
        FROM {s}.runs r WHERE r.thread_id = ANY (v_archive);
        INSERT INTO {s}.archived_runs (tenant_id, thread_id, created_at, document)
        SELECT t.tenant_id, t.id, t.created_at, jsonb_build_object(
                   'thread', to_jsonb(t),
                   'messages', (SELECT coalesce(jsonb_agg({s}.archived_row_v1(to_jsonb(m))
                                                      ORDER BY m.seq), '[]')
                                FROM {s}.messages m
                                WHERE m.thread_id = t.id AND m.run_id IS NULL))
        FROM {s}.threads t WHERE t.id = ANY (v_archive);
    END IF;

    -- Journaled before anything goes: the accounting of every run retained, and the event
    -- whose id opens the journal guard's retention door for this transaction.
    WITH journaled AS (
        INSERT INTO {s}.journal (tenant_id, event, thread_id, actor, detail)
        SELECT t.tenant_id, 'thread.retained', t.id, p_actor,
               jsonb_build_object('mode', CASE WHEN t.id = ANY (v_archive) THEN 'archive'
                                               ELSE 'delete' END,
                                  'last_active_before', {s}.retention_cutoff_v1(t.tenant_id),
                                  'runs', (SELECT coalesce(jsonb_agg(r.id ORDER BY r.id), '[]')
                                           FROM {s}.runs r WHERE r.thread_id = t.id))
        FROM {s}.threads t WHERE t.id = ANY (v_threads)
        ORDER BY t.id
        RETURNING id
    )
    SELECT min(id) INTO v_event FROM journaled;

    RETURN QUERY
    SELECT t.tenant_id,
           CASE WHEN t.id = ANY (v_archive) THEN 'archive' ELSE 'delete' END,
           count(DISTINCT t.id)::integer, count(r.id)::integer, v_horizon
    FROM {s}.threads t LEFT JOIN {s}.runs r ON r.thread_id = t.id
    WHERE t.id = ANY (v_threads)
    GROUP BY 1, 2 ORDER BY 1, 2;

    -- The bodies these rows reference (0040): swept once the rows are gone, but those
    -- another conversation still references.
    SELECT array_agg(DISTINCT d) INTO v_bodies FROM (
        SELECT c.arguments_ref FROM {s}.tool_calls c
        WHERE c.run_id = ANY (v_runs) AND c.arguments_ref IS NOT NULL
        UNION ALL
        SELECT x.output_ref FROM {s}.tool_results x
        WHERE x.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs))
          AND x.output_ref IS NOT NULL
        UNION ALL
        SELECT o.output_ref FROM {s}.orphaned_results o
        WHERE (o.run_id = ANY (v_runs)
               OR o.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c
                                      WHERE c.run_id = ANY (v_runs)))
          AND o.output_ref IS NOT NULL
        UNION ALL
        SELECT m.content_ref FROM {s}.messages m
        WHERE m.thread_id = ANY (v_threads) AND m.content_ref IS NOT NULL) r(d);

    -- Children before parents, each by an indexed column; tool messages before the calls
    -- they answer, calls before the messages that asked for them.
    DELETE FROM {s}.webhook_deliveries w WHERE w.run_id = ANY (v_runs);
    DELETE FROM {s}.approvals a WHERE a.run_id = ANY (v_runs);
    DELETE FROM {s}.submissions x WHERE x.run_id = ANY (v_runs);
    DELETE FROM {s}.orphaned_results o
    WHERE o.run_id = ANY (v_runs)
       OR o.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs));
    DELETE FROM {s}.tool_results x
    WHERE x.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs));
    DELETE FROM {s}.messages m WHERE m.thread_id = ANY (v_threads) AND m.tool_call_ref IS NOT NULL;
    DELETE FROM {s}.model_turns t WHERE t.run_id = ANY (v_runs);
    DELETE FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs);
    DELETE FROM {s}.tool_batches b WHERE b.run_id = ANY (v_runs);
    DELETE FROM {s}.assistant_runs a WHERE a.run_id = ANY (v_runs);
    DELETE FROM {s}.responses x WHERE x.thread_id = ANY (v_threads);
    DELETE FROM {s}.messages m WHERE m.thread_id = ANY (v_threads);
    DELETE FROM {s}.outbox o WHERE o.run_id = ANY (v_runs);
    DELETE FROM {s}.runs r WHERE r.id = ANY (v_runs);
    DELETE FROM {s}.threads t WHERE t.id = ANY (v_threads);
    PERFORM set_config('outbox.journal_retain', v_event::text, true);
    DELETE FROM {s}.journal j WHERE j.run_id = ANY (v_runs) AND j.at >= v_since;
    DELETE FROM {s}.journal j
    WHERE j.thread_id = ANY (v_threads) AND j.run_id IS NULL AND j.at >= v_since
      AND j.event NOT IN ('thread.retained', 'thread.erased');
    PERFORM set_config('outbox.journal_retain', '', true);
    IF v_bodies IS NOT NULL THEN
        PERFORM {s}.sweep_payloads_v1(v_bodies, cardinality(v_bodies) * 64);
    END IF;
END $$;
REVOKE ALL ON FUNCTION {s}.retain_v1(integer, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.retain_v1(integer, text, timestamptz) TO outbox_relay;


-- erase_thread_v1: "remove this conversation's content" (a privacy request).
--
--   SELECT outbox.erase_thread_v1('tenant-a', '0b5e…'::uuid, 'dpo@acme');
--                                                   -- or: outbox threads erase ID
--
-- Cancels the thread's run in flight first (end_run_v1: no new claims, calls still running
-- finish and their results arrive without content, see orphaned_results_erased), then
-- removes the content: message texts, tool call arguments (arguments_hash stays), results'
-- outputs and error texts, orphaned results' likewise, response input items, the title;
-- and the same content in archived documents of the thread. Keeps every row, status,
-- count, timestamp and digest audits need, and the journal as it is (no messages,
-- arguments or results there; an error text a tool or model returned stays until pruned).
-- Marks the thread erased (erased_at) and deleted (no run starts on it again). Journals
-- thread.erased with the actor and what was removed, which it returns. A thread already
-- retained into the archive is erased there. Erasing an erased thread again removes what
-- arrived since. Runs as the schema owner (SECURITY DEFINER) and
-- refuses a tenant other than the session's scope. Locks the thread's runs in id order,
-- then the thread, as the relay does.
CREATE OR REPLACE FUNCTION {s}.erase_thread_v1(p_tenant_id text, p_thread_id uuid,
                                               p_actor text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_thread    {s}.threads;
    v_run       {s}.runs;
    v_runs      uuid[];
    v_cancelled jsonb := '[]';
    v_detail    jsonb;
    n_messages  bigint;
    n_calls     bigint;
    n_results   bigint;
    n_orphans   bigint;
    n_responses bigint;
    n_archived  bigint;
    v_bodies    text[];
    n_bodies    integer := 0;
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    PERFORM 1 FROM {s}.runs r WHERE r.thread_id = p_thread_id ORDER BY r.id FOR UPDATE;
    SELECT * INTO v_thread FROM {s}.threads t WHERE t.id = p_thread_id FOR UPDATE;
    IF (FOUND AND v_thread.tenant_id <> p_tenant_id)
       OR (NOT FOUND AND NOT EXISTS (SELECT 1 FROM {s}.archived_runs a
                                     WHERE a.thread_id = p_thread_id
                                       AND a.tenant_id = p_tenant_id)) THEN
        RAISE EXCEPTION 'thread % does not exist for tenant %', p_thread_id,
                        quote_literal(p_tenant_id)
            USING ERRCODE = 'no_data_found', HINT = 'check the thread id and the tenant';
    END IF;
    FOR v_run IN SELECT * FROM {s}.runs r
                 WHERE r.thread_id = p_thread_id AND {s}.run_active_v1(r.status)
                 ORDER BY r.id FOR UPDATE LOOP
        PERFORM {s}.end_run_v1(v_run.id, 'cancelled', 'cancelled',
                               'cancelled: its thread was erased',
                               coalesce(p_actor, session_user));
        v_cancelled := v_cancelled || to_jsonb(v_run.id);
    END LOOP;
    SELECT coalesce(array_agg(r.id), '{}') INTO v_runs
    FROM {s}.runs r WHERE r.thread_id = p_thread_id;

    -- A thread retained into the archive has no hot rows left: only its documents change.
    UPDATE {s}.threads SET title = NULL, erased_at = now(),
                           deleted_at = coalesce(deleted_at, now())
    WHERE id = p_thread_id;
    -- The bodies stored by reference (0040) that this thread references: its references
    -- go with its content, and each body goes too unless another thread references it.
    SELECT array_agg(DISTINCT d) INTO v_bodies FROM (
        SELECT c.arguments_ref FROM {s}.tool_calls c
        WHERE c.run_id = ANY (v_runs) AND c.arguments_ref IS NOT NULL
        UNION ALL
        SELECT x.output_ref FROM {s}.tool_results x
        WHERE x.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs))
          AND x.output_ref IS NOT NULL
        UNION ALL
        SELECT o.output_ref FROM {s}.orphaned_results o
        WHERE (o.run_id = ANY (v_runs)
               OR o.tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c
                                      WHERE c.run_id = ANY (v_runs)))
          AND o.output_ref IS NOT NULL
        UNION ALL
        SELECT m.content_ref FROM {s}.messages m
        WHERE m.thread_id = p_thread_id AND m.content_ref IS NOT NULL) r(d);
    UPDATE {s}.messages SET content = NULL, reasoning = NULL, content_ref = NULL
    WHERE thread_id = p_thread_id
      AND (content IS NOT NULL OR reasoning IS NOT NULL OR content_ref IS NOT NULL);
    GET DIAGNOSTICS n_messages = ROW_COUNT;
    UPDATE {s}.tool_calls SET arguments = NULL, arguments_raw = '', arguments_ref = NULL
    WHERE run_id = ANY (v_runs)
      AND (arguments IS NOT NULL OR arguments_raw <> '' OR arguments_ref IS NOT NULL);
    GET DIAGNOSTICS n_calls = ROW_COUNT;
    UPDATE {s}.tool_results
    SET output = NULL, output_ref = NULL,
        error = CASE WHEN error IS NOT NULL THEN 'erased' END
    WHERE tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs))
      AND (output IS NOT NULL OR output_ref IS NOT NULL
           OR error IS DISTINCT FROM CASE WHEN error IS NOT NULL THEN 'erased' END);
    GET DIAGNOSTICS n_results = ROW_COUNT;
    UPDATE {s}.orphaned_results
    SET output = NULL, output_ref = NULL,
        error = CASE WHEN error IS NOT NULL THEN 'erased' END
    WHERE (run_id = ANY (v_runs)
           OR tool_call_ref IN (SELECT c.id FROM {s}.tool_calls c WHERE c.run_id = ANY (v_runs)))
      AND (output IS NOT NULL OR output_ref IS NOT NULL
           OR coalesce(error, 'erased') <> 'erased');
    GET DIAGNOSTICS n_orphans = ROW_COUNT;
    IF v_bodies IS NOT NULL THEN
        n_bodies := {s}.sweep_payloads_v1(v_bodies, cardinality(v_bodies) * 64);
    END IF;
    UPDATE {s}.responses SET input = '[]'
    WHERE thread_id = p_thread_id AND input <> '[]';
    GET DIAGNOSTICS n_responses = ROW_COUNT;
    UPDATE {s}.archived_runs a SET document = {s}.erased_document_v1(a.document)
    WHERE a.thread_id = p_thread_id AND a.tenant_id = p_tenant_id;
    GET DIAGNOSTICS n_archived = ROW_COUNT;

    v_detail := jsonb_build_object(
        'thread_id', p_thread_id, 'cancelled_runs', v_cancelled, 'messages', n_messages,
        'tool_calls', n_calls, 'tool_results', n_results, 'orphaned_results', n_orphans,
        'responses', n_responses, 'archived_documents', n_archived,
        'payloads', n_bodies);
    INSERT INTO {s}.journal (tenant_id, event, thread_id, actor, detail)
    VALUES (p_tenant_id, 'thread.erased', p_thread_id, coalesce(p_actor, session_user),
            v_detail);
    RETURN v_detail;
END $$;
REVOKE ALL ON FUNCTION {s}.erase_thread_v1(text, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.erase_thread_v1(text, uuid, text)
    TO outbox_writer, outbox_api;


-- erased_document_v1: an archived document (run_document_v1, or a thread's) without its
-- content: what erase_thread_v1 removes from the hot tables, removed from the archive.
CREATE OR REPLACE FUNCTION {s}.erased_document_v1(p_document jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_document
        || jsonb_build_object(
            'messages', (SELECT coalesce(jsonb_agg(m || '{"content": null, "reasoning": null}'), '[]')
                         FROM jsonb_array_elements(coalesce(p_document -> 'messages', '[]')) m),
            'tool_calls', (SELECT coalesce(jsonb_agg(c || '{"arguments": null, "arguments_raw": ""}'), '[]')
                           FROM jsonb_array_elements(coalesce(p_document -> 'tool_calls', '[]')) c),
            'tool_results', (SELECT coalesce(jsonb_agg(x || jsonb_build_object(
                                 'output', NULL, 'error', CASE WHEN x ->> 'error' IS NOT NULL
                                                               THEN 'erased' END)), '[]')
                             FROM jsonb_array_elements(coalesce(p_document -> 'tool_results', '[]')) x),
            'orphaned_results', (SELECT coalesce(jsonb_agg(x || jsonb_build_object(
                                     'output', NULL, 'error', CASE WHEN x ->> 'error' IS NOT NULL
                                                                   THEN 'erased' END)), '[]')
                                 FROM jsonb_array_elements(coalesce(p_document -> 'orphaned_results', '[]')) x),
            'responses', (SELECT coalesce(jsonb_agg(x || '{"input": []}'), '[]')
                          FROM jsonb_array_elements(coalesce(p_document -> 'responses', '[]')) x))
        || CASE WHEN p_document ? 'thread'
                THEN jsonb_build_object('thread', (p_document -> 'thread') || '{"title": null}')
                ELSE '{}' END
$$;
REVOKE ALL ON FUNCTION {s}.erased_document_v1(jsonb) FROM PUBLIC;


-- run_span_events_v1: what the trace exporter (outbox/traces.py) builds a run's chat and
-- execute_tool spans from: each journal event of the runs that carries an attempt's span
-- as the relay timed it (model_turn.recorded, tool_result.stored, *.retry_scheduled,
-- *.quarantined, *.outcome_unknown, write.fenced), and each run's run.created (its absence
-- says the journal was pruned past the run's start: its attempts' spans are gone). Only
-- what a span carries leaves the journal (no payload reference); an error's text is in
-- "error", which the exporter puts in a span only with content capture on. Runs as the
-- schema owner (SECURITY DEFINER): outbox_relay, whose role the exporter uses, reads no
-- journal otherwise. p_since (the earliest creation of the runs) spares the journal's
-- partitions older than any of them: every event of a run is journaled after it began.
CREATE OR REPLACE FUNCTION {s}.run_span_events_v1(p_run_ids uuid[], p_since timestamptz)
RETURNS TABLE (run_id uuid, event text, at timestamptz, tool_call_ref bigint, attempt integer,
               detail jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.run_id, j.event, j.at, j.tool_call_ref, j.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'span', j.detail->'span', 'step_no', j.detail->'step_no',
               'input_tokens', j.detail->'input_tokens',
               'output_tokens', j.detail->'output_tokens',
               'status', j.detail->'status', 'error', j.detail->'error'))
    FROM {s}.journal j
    WHERE j.run_id = ANY(p_run_ids) AND j.at >= p_since
      AND (j.detail ? 'span' OR j.event = 'run.created')
    ORDER BY j.run_id, j.id
$$;
REVOKE ALL ON FUNCTION {s}.run_span_events_v1(uuid[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.run_span_events_v1(uuid[], timestamptz)
    TO outbox_relay, outbox_auditor;
