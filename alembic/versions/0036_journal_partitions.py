"""The journal partitioned by day.

Revision ID: 0036
Revises: 0035
Create Date: 2026-11-27

``journal`` becomes a table partitioned by range of ``at``: a partition per UTC day
(``journal_YYYYMMDD``), made ahead by ``journal_partitions_v1``, and a default partition
that catches any row no day covers. The journal as it was becomes one partition,
``journal_upto_YYYYMMDD``, without a row copied. ``prune_journal`` drops whole days instead
of deleting rows. The SQL is ``0036_journal_partitions.sql`` beside this file, frozen. The
downgrade copies every row back into one plain table, as 0001 made it, with the guard,
``prune_journal``, ``run_timeline`` and ``retain_v1`` as 0034, 0014, 0034 and 0034 left
them. ``retain_v1`` also takes a horizon (``p_after``) and returns the next one, so the
chunks of one round of retention do not each read the old threads that are not idle again.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0036_journal_partitions.sql")

DOWNGRADE = """
DROP VIEW {s}.run_timeline;
DROP FUNCTION {s}.journal_partitions_v1(integer);
ALTER TABLE {s}.journal RENAME TO journal_0036;
ALTER TABLE {s}.journal_0036 RENAME CONSTRAINT journal_pkey TO journal_0036_pkey;
ALTER INDEX {s}.journal_run RENAME TO journal_0036_run;
ALTER INDEX {s}.journal_at RENAME TO journal_0036_at;
ALTER INDEX {s}.journal_thread_events RENAME TO journal_0036_thread_events;
ALTER SEQUENCE {s}.journal_id_seq RENAME TO journal_0036_id_seq;
CREATE TABLE {s}.journal (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    detail         jsonb NOT NULL DEFAULT '{}'::jsonb
);
INSERT INTO {s}.journal OVERRIDING SYSTEM VALUE SELECT * FROM {s}.journal_0036 ORDER BY id;
SELECT setval(pg_get_serial_sequence('{s}.journal', 'id'),
              greatest(s.last_value, (SELECT coalesce(max(id), 1) FROM {s}.journal)),
              s.is_called OR EXISTS (SELECT 1 FROM {s}.journal))
FROM {s}.journal_0036_id_seq s;
DROP TABLE {s}.journal_0036;
CREATE INDEX journal_run ON {s}.journal (run_id, id);
CREATE INDEX journal_at ON {s}.journal (at);
CREATE INDEX journal_thread_events ON {s}.journal (thread_id) WHERE run_id IS NULL;
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
    IF TG_OP = 'DELETE' AND v_flag ~ '^[0-9]{1,18}$' THEN
        SELECT (j.detail->>'before')::timestamptz INTO v_before FROM {s}.journal j
        WHERE j.id = v_flag::bigint AND j.event = 'journal.pruned' AND j.xmin::text = v_xact;
        IF v_before IS NOT NULL AND OLD.at < v_before THEN
            RETURN OLD;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' AND v_retain ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT 1 FROM {s}.journal j
                   WHERE j.id = v_retain::bigint AND j.event = 'thread.retained'
                     AND j.xmin::text = v_xact)
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
CREATE OR REPLACE FUNCTION {s}.prune_journal(older_than interval, actor text DEFAULT session_user)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed bigint;
    v_before timestamptz;
    v_event bigint;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune_journal needs a positive age, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_before := now() - older_than;
    SELECT count(*) INTO removed FROM {s}.journal WHERE at < v_before;
    INSERT INTO {s}.journal (tenant_id, event, actor, detail)
    VALUES ('*', 'journal.pruned', actor,
            jsonb_build_object('older_than', older_than::text, 'removed', removed,
                               'before', v_before))
    RETURNING id INTO v_event;
    PERFORM set_config('outbox.journal_prune', v_event::text, true);
    DELETE FROM {s}.journal WHERE at < v_before;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('outbox.journal_prune', '', true);
    RETURN removed;
END $$;
REVOKE ALL ON FUNCTION {s}.prune_journal(interval, text) FROM PUBLIC;
CREATE VIEW {s}.run_timeline AS
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
GRANT SELECT ON {s}.run_timeline TO outbox_auditor;
DROP FUNCTION {s}.retain_v1(integer, text, timestamptz);
CREATE FUNCTION {s}.retain_v1(p_limit integer DEFAULT 200,
                                         p_actor text DEFAULT session_user)
RETURNS TABLE (tenant_id text, mode text, threads integer, runs integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s' AS $$
DECLARE
    v_oldest  timestamptz;
    v_threads uuid[];
    v_locked  uuid[];
    v_runs    uuid[];
    v_archive uuid[];
    v_event   bigint;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'retain_v1 takes 1 to 10000 threads per chunk, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT now() - min(p.max_age) INTO v_oldest FROM {s}.retention_policies p;
    IF v_oldest IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(c.id) INTO v_threads FROM (
        SELECT t.id FROM {s}.threads t
        WHERE t.created_at < v_oldest
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
           count(DISTINCT t.id)::integer, count(r.id)::integer
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
    DELETE FROM {s}.journal j WHERE j.run_id = ANY (v_runs);
    DELETE FROM {s}.journal j
    WHERE j.thread_id = ANY (v_threads) AND j.run_id IS NULL
      AND j.event NOT IN ('thread.retained', 'thread.erased');
    PERFORM set_config('outbox.journal_retain', '', true);
END $$;
REVOKE ALL ON FUNCTION {s}.retain_v1(integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.retain_v1(integer, text) TO outbox_relay;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
