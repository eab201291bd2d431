"""Retention by policy, an archive partitioned by day, erasure of a thread's content.

Revision ID: 0034
Revises: 0030
Create Date: 2026-11-27

``retention_policies`` (per tenant, ``'*'`` the default) and ``archived_runs`` (partitioned
by day of archiving); ``retain_v1`` moves idle conversations out of the hot tables in
bounded chunks, through a second door of the journal's guard; ``archive_partitions_v1``
and ``prune_archive_v1`` keep the archive's days; ``erase_thread_v1`` removes a thread's
content (``threads.erased_at``, and the trigger ``orphaned_results_erased`` for results
that arrive later); ``run_timeline`` answers for archived runs; indexes on the referencing
columns deletions check. The SQL is ``0034_retention.sql`` beside this file, frozen. The
downgrade makes the journal's guard and ``run_timeline`` again as 0014 and 0008 made them,
then drops what 0034 added (the archive with it).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0034_retention.sql")

GUARD_0014 = """
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_flag text := current_setting('outbox.journal_prune', true);
    v_before timestamptz;
BEGIN
    IF TG_OP = 'DELETE' AND v_flag ~ '^[0-9]{1,18}$' THEN
        SELECT (j.detail->>'before')::timestamptz INTO v_before FROM {s}.journal j
        WHERE j.id = v_flag::bigint AND j.event = 'journal.pruned'
          AND j.xmin::text = (pg_current_xact_id()::text::bigint & 4294967295)::text;
        IF v_before IS NOT NULL AND OLD.at < v_before THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;
"""

RUN_TIMELINE_0008 = """
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
FROM {s}.journal j
JOIN {s}.runs r ON r.id = j.run_id AND r.tenant_id = j.tenant_id
WINDOW w AS (PARTITION BY j.run_id ORDER BY j.at, j.id);
"""

DOWNGRADE = """
DROP TRIGGER orphaned_results_erased ON {s}.orphaned_results;
DROP FUNCTION {s}.orphaned_results_erased();
DROP FUNCTION {s}.erase_thread_v1(text, uuid, text);
DROP FUNCTION {s}.erased_document_v1(jsonb);
DROP FUNCTION {s}.retain_v1(integer, text);
DROP FUNCTION {s}.prune_archive_v1(text);
DROP FUNCTION {s}.archive_partitions_v1(integer);
DROP FUNCTION {s}.run_document_v1(uuid);
DROP FUNCTION {s}.thread_idle_v1(uuid, timestamptz);
DROP FUNCTION {s}.retention_cutoff_v1(text);
DROP TABLE {s}.archived_runs;
DROP TABLE {s}.retention_policies;
DROP INDEX {s}.journal_thread_events, {s}.responses_previous, {s}.submissions_run,
    {s}.orphaned_results_call, {s}.orphaned_results_run, {s}.tool_results_batch,
    {s}.model_turns_message, {s}.tool_batches_message, {s}.tool_calls_message,
    {s}.messages_run, {s}.runs_thread, {s}.threads_created;
ALTER TABLE {s}.threads DROP COLUMN erased_at;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(GUARD_0014)
    run_sql(RUN_TIMELINE_0008)
    run_sql(DOWNGRADE)
