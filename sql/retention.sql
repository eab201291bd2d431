-- Retention: idle conversations leave the hot tables (archived or deleted) by policy, the
-- archive's partitions and their pruning, and the erasure of a conversation's content.
-- `{s}` is the schema. Applied after runs.sql and payloads.sql: a plain SQL function is
-- checked against what it calls (run_ended_v1, resolved_text_v1) when it is created.


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


-- archived_row_v1: a row of a conversation as the archive keeps it (run_document_v1,
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
-- p_after, the horizon: candidates are read oldest first from there (threads
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
    -- before the oldest candidate are not read for their events.
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

    -- The bodies these rows reference: swept once the rows are gone, but those
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
    DELETE FROM {s}.compactions k WHERE k.run_id = ANY (v_runs);
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
    -- The bodies stored by reference that this thread references: its references
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
    -- A summary of the thread is its content too: the model sees the erased thread whole.
    DELETE FROM {s}.compactions k WHERE k.thread_id = p_thread_id;
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
