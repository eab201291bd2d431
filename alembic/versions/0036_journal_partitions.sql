-- 0036: the journal partitioned by day. Frozen: what revision 0036 applies, forever.
--
-- * journal becomes a table partitioned by range of `at` (native declarative partitioning,
--   no extension): one partition per UTC day (journal_YYYYMMDD), or per the width the
--   setting outbox.journal_partition_width gives (1 second to 1 day; journal_YYYYMMDD_HHMI,
--   journal_YYYYMMDD_HHMISS), made ahead by journal_partitions_v1 (the relay's maintenance
--   and `outbox retention run` call it; a new width goes on where the newest partition
--   ends), and
--   a default partition (journal_default) that catches a row no day partition covers, so
--   an insert never fails.
-- * The journal as it was is kept, not copied: it becomes the partition journal_upto_YYYYMMDD
--   (every row up to the end of that day, its newest row's); an empty journal is dropped.
--   Its identity continues where it was.
-- * The primary key is (id, at): a partitioned table's unique constraints must hold the
--   partition key. Nothing references journal ids by foreign key; ids stay unique because
--   one identity hands them out.
-- * The guard (journal_refuse_change) stays on every partition: the row trigger is cloned
--   onto each, and every partition gets its own TRUNCATE trigger. prune_journal drops the
--   partitions wholly older than its cut-off (by their upper bound) (no row deleted, nothing to vacuum) and deletes by
--   row only in the default and upto partitions, which span more than a day: its door now
--   opens on those partitions only.
-- * run_timeline is made again: a view binds to the table it was made on.
-- * retain_v1 takes a horizon (p_after) and returns the next one: the chunks of a round of
--   retention no longer each read again the old threads that are not idle.

DO $$
DECLARE
    v_last date;
    v_next bigint;
BEGIN
    SELECT (max(at) AT TIME ZONE 'UTC')::date, coalesce(max(id), 0) + 1 INTO v_last, v_next
    FROM {s}.journal;
    SELECT greatest(v_next, CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END)
    INTO v_next FROM {s}.journal_id_seq s;

    ALTER TABLE {s}.journal RENAME TO journal_0035;
    DROP TRIGGER journal_no_update_delete ON {s}.journal_0035;
    DROP TRIGGER journal_no_truncate ON {s}.journal_0035;
    DROP POLICY tenant_isolation ON {s}.journal_0035;
    DROP POLICY all_tenants ON {s}.journal_0035;
    DROP POLICY audit_read ON {s}.journal_0035;
    ALTER TABLE {s}.journal_0035 NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;
    REVOKE ALL ON {s}.journal_0035 FROM outbox_writer, outbox_relay, outbox_auditor, outbox_api;
    ALTER TABLE {s}.journal_0035 DROP CONSTRAINT journal_pkey;
    ALTER TABLE {s}.journal_0035 ALTER COLUMN id DROP IDENTITY;
    ALTER INDEX {s}.journal_run RENAME TO journal_0035_run;
    ALTER INDEX {s}.journal_at RENAME TO journal_0035_at;
    ALTER INDEX {s}.journal_thread_events RENAME TO journal_0035_thread_events;

    CREATE TABLE {s}.journal (
        id             bigint GENERATED ALWAYS AS IDENTITY,
        at             timestamptz NOT NULL DEFAULT clock_timestamp(),
        tenant_id      text NOT NULL,
        event          text NOT NULL,
        thread_id      uuid,
        run_id         uuid,
        batch_id       bigint,
        tool_call_ref  bigint,
        tool_call_id   text,
        outbox_id      bigint,
        correlation_id text,
        attempt        integer,
        worker         text,
        actor          text,
        detail         jsonb NOT NULL DEFAULT '{}'::jsonb,
        CONSTRAINT journal_pkey PRIMARY KEY (id, at)
    ) PARTITION BY RANGE (at);
    EXECUTE format('ALTER TABLE {s}.journal ALTER COLUMN id RESTART WITH %s', v_next);
    CREATE INDEX journal_run ON {s}.journal (run_id, id);
    CREATE INDEX journal_at ON {s}.journal (at);
    CREATE INDEX journal_thread_events ON {s}.journal (thread_id) WHERE run_id IS NULL;
    -- Before the old table can go: a view is bound to the table it was made on.
    CREATE OR REPLACE VIEW {s}.run_timeline AS
    SELECT j.run_id,
           j.tenant_id,
           row_number() OVER w AS seq,
           j.at,
           j.event,
           j.batch_id,
           j.tool_call_ref,
           j.tool_call_id,
           j.outbox_id,
           j.attempt,
           j.worker,
           j.actor,
           coalesce(j.detail ->> 'error', j.detail ->> 'reason') AS error,
           extract(epoch FROM j.at - lag(j.at) OVER w) AS since_previous_s,
           j.correlation_id,
           j.detail,
           j.id AS journal_id
    FROM (SELECT e.* FROM {s}.journal e
          JOIN {s}.runs r ON r.id = e.run_id AND r.tenant_id = e.tenant_id
          UNION ALL
          SELECT e.* FROM {s}.archived_runs a
          CROSS JOIN LATERAL jsonb_populate_recordset(NULL::{s}.journal, a.document -> 'journal') e
          WHERE e.run_id = a.run_id AND e.tenant_id = a.tenant_id) j
    WINDOW w AS (PARTITION BY j.run_id ORDER BY j.at, j.id);

    IF v_last IS NULL THEN
        DROP TABLE {s}.journal_0035;
    ELSE
        EXECUTE format('ALTER TABLE {s}.journal_0035 RENAME TO %I',
                       'journal_upto_' || to_char(v_last, 'YYYYMMDD'));
        EXECUTE format('ALTER TABLE {s}.journal ATTACH PARTITION {s}.%I '
                       'FOR VALUES FROM (MINVALUE) TO (%L)',
                       'journal_upto_' || to_char(v_last, 'YYYYMMDD'),
                       (v_last + 1)::timestamp AT TIME ZONE 'UTC');
    END IF;
    CREATE TABLE {s}.journal_default PARTITION OF {s}.journal DEFAULT;
END $$;

COMMENT ON TABLE {s}.journal IS
    'append-only events for every state change; partitioned by day of `at` '
    '(journal_YYYYMMDD, made ahead by journal_partitions_v1; journal_default catches the '
    'rest; journal_upto_YYYYMMDD holds what was journaled before 0036); pruned by '
    'prune_journal a day at a time';

GRANT INSERT ON {s}.journal TO outbox_writer, outbox_relay;
GRANT SELECT ON {s}.journal TO outbox_auditor;
GRANT SELECT, INSERT ON {s}.journal TO outbox_api;
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.journal FROM PUBLIC;

ALTER TABLE {s}.journal ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.journal TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.journal TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.journal FOR SELECT TO outbox_auditor USING (true);

CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_flag text := current_setting('outbox.journal_prune', true);
    v_retain text := current_setting('outbox.journal_retain', true);
    v_xact text := (pg_current_xact_id()::text::bigint & 4294967295)::text;
    v_before timestamptz;
BEGIN
    IF TG_OP = 'DELETE' AND v_flag ~ '^[0-9]{1,18}$'
       AND (TG_TABLE_NAME = 'journal_default' OR TG_TABLE_NAME ~ '^journal_upto_[0-9]{8}$') THEN
        SELECT (j.detail->>'before')::timestamptz INTO v_before FROM {s}.journal j
        WHERE j.id = v_flag::bigint AND j.at >= now() AND j.event = 'journal.pruned'
          AND j.xmin::text = v_xact;
        IF v_before IS NOT NULL AND OLD.at < v_before THEN
            RETURN OLD;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' AND v_retain ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT 1 FROM {s}.journal j
                   WHERE j.id = v_retain::bigint AND j.at >= now()
                     AND j.event = 'thread.retained' AND j.xmin::text = v_xact)
       AND (CASE WHEN OLD.run_id IS NOT NULL
                 THEN NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.id = OLD.run_id)
                 ELSE OLD.thread_id IS NOT NULL
                      AND OLD.event NOT IN ('thread.retained', 'thread.erased')
                      AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = OLD.thread_id)
            END) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;
CREATE TRIGGER journal_no_update_delete BEFORE UPDATE OR DELETE ON {s}.journal
    FOR EACH ROW EXECUTE FUNCTION {s}.journal_refuse_change();
CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON {s}.journal
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_refuse_change();
DO $$
DECLARE
    v_part regclass;
BEGIN
    FOR v_part IN SELECT i.inhrelid::regclass FROM pg_inherits i
                  WHERE i.inhparent = '{s}.journal'::regclass LOOP
        EXECUTE format('CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_refuse_change()', v_part);
    END LOOP;
END $$;

CREATE FUNCTION {s}.journal_partitions_v1(p_ahead integer DEFAULT 2)
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

SELECT {s}.journal_partitions_v1(2);

-- retain_v1 with a horizon (p_after, and the horizon column it returns): a round of
-- retention reads each old thread that is not idle once, not once per chunk.
DROP FUNCTION {s}.retain_v1(integer, text);
CREATE FUNCTION {s}.retain_v1(p_limit integer DEFAULT 200,
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
                   'messages', (SELECT coalesce(jsonb_agg(to_jsonb(m) ORDER BY m.seq), '[]')
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
END $$;
REVOKE ALL ON FUNCTION {s}.retain_v1(integer, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.retain_v1(integer, text, timestamptz) TO outbox_relay;
