"""Two holes closed: runs waiting on a quarantined row are reported; journal deletes are journaled.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24

``stuck_runs`` gains the reason ``parked_call``: a queued, running or waiting run one of
whose outbox rows is quarantined; it stayed ``in_progress`` and no view reported it. The
journal's guard accepted any DELETE in a transaction whose ``outbox.journal_prune`` setting
held its own transaction id, which the journal's owner could set by hand: deletion is now
accepted only for rows older than the cut-off of a ``journal.pruned`` event written earlier
in the same transaction, which ``prune_journal`` now writes before it deletes.

The SQL is ``0014_parked_runs_and_journal_guard.sql`` beside this file, frozen; the
downgrade restores the definitions of 0010 (``stuck_runs``) and 0002 (guard and prune).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0014_parked_runs_and_journal_guard.sql")

STUCK_RUNS_0010 = """
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
--   inserted by hand or by an ORM without the writer API or start_run_v1.
-- stuck_for says for how long; filter on it to ignore the last few seconds.
CREATE OR REPLACE VIEW {s}.stuck_runs AS
SELECT r.id AS run_id, r.tenant_id, r.thread_id, r.status, 'undelivered_batch' AS reason,
       b.id AS batch_id, NULL::bigint AS outbox_id, b.completed_at AS since,
       now() - b.completed_at AS stuck_for,
       format('batch %s (step %s) has all %s results since %s; no delivery is queued',
              b.id, b.step_no, b.size, b.completed_at) AS detail
FROM {s}.runs r
JOIN {s}.tool_batches b ON b.run_id = r.id AND b.status = 'complete'
WHERE r.status IN ('queued', 'in_progress', 'requires_action')
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
                  WHERE b.run_id = r.id AND b.status = 'complete');
"""

GUARD_0002 = """
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND current_setting('outbox.journal_prune', true) = pg_current_xact_id()::text THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;

CREATE OR REPLACE FUNCTION {s}.prune_journal(older_than interval, actor text DEFAULT session_user)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed bigint;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune_journal needs a positive age, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('outbox.journal_prune', pg_current_xact_id()::text, true);
    DELETE FROM {s}.journal WHERE at < now() - older_than;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('outbox.journal_prune', '', true);
    INSERT INTO {s}.journal (tenant_id, event, actor, detail)
    VALUES ('*', 'journal.pruned', actor,
            jsonb_build_object('older_than', older_than::text, 'removed', removed,
                               'before', now() - older_than));
    RETURN removed;
END $$;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(STUCK_RUNS_0010)
    run_sql(GUARD_0002)
