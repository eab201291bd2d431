CREATE TABLE {s}.model_catalogue (
    model             text PRIMARY KEY CHECK (length(model) BETWEEN 1 AND 200),
    context_window    integer NOT NULL CHECK (context_window > 0),
    max_output_tokens integer NOT NULL CHECK (max_output_tokens > 0),
    updated_by        text NOT NULL DEFAULT SESSION_USER,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT model_catalogue_output_within_window CHECK (max_output_tokens < context_window)
);
COMMENT ON TABLE {s}.model_catalogue IS
    'what each model can take: its context window and the most output tokens it answers, '
    'in tokens; a run''s prompt budget is the window minus the output unless the run, its '
    'tenant or the platform names one';

ALTER TABLE {s}.run_defaults ADD COLUMN max_prompt_tokens integer
    CHECK (max_prompt_tokens > 0);
COMMENT ON COLUMN {s}.run_defaults.max_prompt_tokens IS
    'the prompt budget of a run that names none and whose tenant names none (NULL: the '
    'model''s window minus its output)';
ALTER TABLE {s}.tenant_budgets ADD COLUMN max_prompt_tokens integer
    CHECK (max_prompt_tokens > 0),
    DROP CONSTRAINT tenant_budgets_limit_something,
    ADD CONSTRAINT tenant_budgets_limit_something
        CHECK (max_tokens IS NOT NULL OR max_cost IS NOT NULL OR max_prompt_tokens IS NOT NULL);
COMMENT ON COLUMN {s}.tenant_budgets.max_prompt_tokens IS
    'the prompt budget of the tenant''s runs that name none (NULL: the platform''s)';

CREATE TABLE {s}.compactions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id         text NOT NULL,
    thread_id         uuid NOT NULL,
    run_id            uuid NOT NULL,
    step_no           integer NOT NULL,
    through_seq       bigint NOT NULL,
    summary           text NOT NULL,
    tokens_before     integer NOT NULL,
    tokens_after      integer NOT NULL,
    input_tokens      integer NOT NULL DEFAULT 0,
    output_tokens     integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT compactions_one_per_step UNIQUE (run_id, step_no),
    CONSTRAINT compactions_run_fk FOREIGN KEY (run_id, thread_id, tenant_id)
        REFERENCES {s}.runs (id, thread_id, tenant_id) ON DELETE CASCADE
);
CREATE INDEX compactions_thread ON {s}.compactions (thread_id, through_seq);
COMMENT ON TABLE {s}.compactions IS
    'summaries of a thread''s oldest messages (seq up to through_seq) that the model sees '
    'in their place; the messages themselves stay in the thread. One per (run, step): the '
    'turn that compacted records it with itself';

GRANT SELECT ON {s}.model_catalogue TO outbox_writer, outbox_relay, outbox_auditor, outbox_api;
GRANT SELECT, INSERT ON {s}.compactions TO outbox_relay;
GRANT SELECT ON {s}.compactions TO outbox_writer, outbox_api;

ALTER TABLE {s}.compactions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.compactions;
CREATE POLICY tenant_isolation ON {s}.compactions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.compactions;
CREATE POLICY all_tenants ON {s}.compactions TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.compactions;
CREATE POLICY audit_read ON {s}.compactions FOR SELECT TO outbox_auditor USING (true);

-- Retention deletes a run's summaries with its turns; erasing a thread deletes its summaries.
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
