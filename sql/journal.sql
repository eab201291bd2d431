-- The journal: its partitions, the lock every change of them takes, and pruning it by age.
-- `{s}` is the schema.


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
-- The journal is partitioned by day, or by the width journal_partitions_v1 was given:
-- a partition wholly older than the cut-off (its upper bound at or before it) is dropped
-- whole (no row deleted, nothing left to vacuum); one that straddles the cut-off stays
-- whole until it is past it, so an event is kept at most a partition longer than the age. Rows
-- of the default partition (days journal_partitions_v1 had not made) and of
-- journal_upto_YYYYMMDD (every row older than the first day partition) are deleted by row through the journal guard's
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
