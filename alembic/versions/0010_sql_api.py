"""A SQL API for backends without Python; stuck_runs reports runs nothing will move.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23

Beside ``submit_tool_outputs_v1`` (0003): ``create_thread_v1``, ``start_run_v1`` (the
idempotency key, the active-run, tool and budget checks, the first model turn queued, the
journal) and ``cancel_run_v1``, callable as ``outbox_writer`` under the tenant's
row-level security, plus ``end_run_v1`` (ending a run: the one implementation that the
Python writer and ``cancel_run_v1`` call) and two helpers. The Python writer API calls
these same functions, so a run starts and ends one way whatever the caller's language.

``stuck_runs`` gains the reason ``no_work_queued``: a queued or running run with no
outbox row, e.g. one an ORM inserted without the writer API.

The SQL is ``0010_sql_api.sql`` beside this file, frozen. Numbered 0010 (after 0008) so
that 0009 stays free for work in flight elsewhere; when both land, 0010 revises 0009.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0010_sql_api.sql")

STUCK_RUNS_0002 = """
-- stuck_runs: "Which runs are not moving, and why?"
-- reason = 'undelivered_batch': a batch of an active run has every result (status
--   'complete') but no delivery is queued, so nothing will submit its outputs (the classic
--   stall at requires_action);
-- reason = 'lease_expired': a worker holds a lease on the run's work past its expiry (the
--   worker died or stalled; the relay's rescue sweep should take it back);
-- reason = 'past_deadline': the run waits for client outputs (requires_action) past its
--   action deadline.
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
WHERE r.status = 'requires_action' AND r.action_deadline < now();
"""

DOWNGRADE = """
DROP FUNCTION {s}.cancel_run_v1(text, uuid, text);
DROP FUNCTION {s}.end_run_v1(uuid, text, text, text, text);
DROP FUNCTION {s}.start_run_v1(text, uuid, text, text, text[], text, text, text, text, integer,
                               bigint, integer, double precision, text);
DROP FUNCTION {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]);
DROP FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb);
DROP FUNCTION {s}.enter_tenant_v1(text);
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(STUCK_RUNS_0002)  # CREATE OR REPLACE keeps the view's grants
    run_sql(DOWNGRADE)
