-- DBA views over the outbox schema: plain SQL answers to the questions asked at 3 a.m.
--
-- {s} stands for the schema (default "outbox"). This file is every view as the newest
-- migration leaves it (tests/migration/test_history.py checks it). A migration that
-- creates or changes a view carries a frozen copy of it: to change a view, edit it here and add a migration carrying the new definition (the views are
-- written as CREATE OR REPLACE VIEW for that reason).
-- The views run with their owner's rights: the role outbox_auditor may read them (and the
-- journal) without any right on the tables underneath, and sees every tenant.
-- Every view carries tenant_id: filter on it to audit one tenant.


-- run_timeline: "What happened in this run, in order, and how long did each step wait?"
-- One row per journal event of a run (time, event, batch, tool call, attempt, worker,
-- actor, error), numbered within the run, with the seconds since the run's previous event.
-- Only events of the run's own tenant: the journal has no foreign keys (it outlives what
-- it describes), so an event a writer of another tenant filed under this run's id stays
-- in the journal, under that tenant, and out of this timeline. A run retained into the
-- archive (retain_v1) answers from its archived document.
--   SELECT * FROM {s}.run_timeline WHERE run_id = '...' ORDER BY seq;
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
--   inserted by hand or by an ORM without the writer API or start_run_v1;
-- reason = 'parked_call': a row of an active run is quarantined (an operator must requeue,
--   reconcile or release it, or cancel the run): the run waits for it and nothing else will
--   move it.
-- stuck_for says for how long; filter on it to ignore the last few seconds.
CREATE OR REPLACE VIEW {s}.stuck_runs AS
SELECT r.id AS run_id, r.tenant_id, r.thread_id, r.status, 'undelivered_batch' AS reason,
       b.id AS batch_id, NULL::bigint AS outbox_id, b.completed_at AS since,
       now() - b.completed_at AS stuck_for,
       format('batch %s (step %s) has all %s results since %s; no delivery is queued',
              b.id, b.step_no, b.size, b.completed_at) AS detail
FROM {s}.runs r
JOIN {s}.tool_batches b ON b.run_id = r.id AND b.status = 'complete'
WHERE {s}.run_active_v1(r.status)
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
                  WHERE b.run_id = r.id AND b.status = 'complete')
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'parked_call',
       o.batch_id, o.id, coalesce(tc.updated_at, o.available_at),
       now() - coalesce(tc.updated_at, o.available_at),
       format('%s row %s (%s) is quarantined: %s; requeue, reconcile or release it, or '
              'cancel the run', o.kind, o.id, coalesce(tc.tool_name, 'no tool'),
              left(coalesce(o.last_error, 'no error recorded'), 200))
FROM {s}.outbox o
JOIN {s}.runs r ON r.id = o.run_id
LEFT JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
WHERE o.status = 'quarantined' AND {s}.run_active_v1(r.status);


-- duplicate_executions: "Did any side effect happen more than once?"
-- kind = 'idempotency_key': one tool call (one idempotency key) with more than one
--   execution on record (its result plus results that arrived again: fenced, duplicate or
--   late attempts kept in orphaned_results). Harmless for tools that honour the key;
--   a real duplicate for tools that do not.
-- kind = 'fingerprint': the same tool with the same canonical arguments (arguments_hash)
--   executed by more than one tool call of a tenant under different keys, e.g. a turn
--   submitted twice or a model that asked twice: "two identical tickets".
-- Calls refused at validation never ran and are not counted.
CREATE OR REPLACE VIEW {s}.duplicate_executions AS
WITH executions AS (
    SELECT tool_call_ref, created_at FROM {s}.tool_results
    WHERE source NOT IN ('validation', 'system')
    UNION ALL
    SELECT tool_call_ref, created_at FROM {s}.orphaned_results
    WHERE tool_call_ref IS NOT NULL
), per_call AS (
    SELECT tc.id, tc.tenant_id, tc.run_id, tc.tool_name, tc.arguments_hash,
           tc.idempotency_key, count(*) AS executions, min(e.created_at) AS first_at,
           max(e.created_at) AS last_at
    FROM executions e
    JOIN {s}.tool_calls tc ON tc.id = e.tool_call_ref
    GROUP BY tc.id, tc.tenant_id, tc.run_id, tc.tool_name, tc.arguments_hash, tc.idempotency_key
)
SELECT 'idempotency_key' AS kind, tenant_id, tool_name, arguments_hash, idempotency_key,
       executions, ARRAY[id] AS tool_call_refs, ARRAY[run_id] AS run_ids, first_at, last_at
FROM per_call
WHERE executions > 1
UNION ALL
SELECT 'fingerprint', tenant_id, tool_name, arguments_hash, NULL,
       sum(executions)::bigint, array_agg(id ORDER BY id), array_agg(DISTINCT run_id),
       min(first_at), max(last_at)
FROM per_call
GROUP BY tenant_id, tool_name, arguments_hash
HAVING count(*) > 1;


-- orphaned_results_report: "Which results arrived too late to be used, and for what?"
-- Every orphaned result with its call, batch and run: the reason it was kept out of the
-- conversation (batch_closed, run_ended, deadline_passed, duplicate, fenced) and the state
-- it arrived into.
CREATE OR REPLACE VIEW {s}.orphaned_results_report AS
SELECT o.id AS orphan_id,
       o.tenant_id,
       o.run_id,
       r.status AS run_status,
       o.batch_id,
       b.status AS batch_status,
       o.tool_call_ref,
       o.tool_call_id,
       tc.tool_name,
       o.reason,
       o.source,
       o.status,
       o.error,
       o.attempt,
       o.created_at,
       o.created_at - b.completed_at AS after_batch_closed
FROM {s}.orphaned_results o
LEFT JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
LEFT JOIN {s}.tool_batches b ON b.id = o.batch_id
LEFT JOIN {s}.runs r ON r.id = o.run_id;


-- tool_stats: "Which tools fail, and how slow are they?" (calls made in the last 24 hours)
-- Per tenant and tool: calls, finished, ok, errors, the error rate over finished calls,
-- calls parked for an operator (outcome_unknown, quarantined), and the latency from intent
-- to result (queue wait, retries and execution): p50, p95, p99 and max, in seconds.
CREATE OR REPLACE VIEW {s}.tool_stats AS
SELECT tc.tenant_id,
       tc.tool_name,
       count(*) AS calls,
       count(r.tool_call_ref) AS finished,
       count(*) FILTER (WHERE r.status = 'ok') AS ok,
       count(*) FILTER (WHERE r.status = 'error') AS errors,
       round(count(*) FILTER (WHERE r.status = 'error')::numeric
             / nullif(count(r.tool_call_ref), 0), 4) AS error_rate,
       count(*) FILTER (WHERE tc.status IN ('outcome_unknown', 'quarantined')) AS parked,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.created_at - tc.created_at))::numeric, 3) AS p50_s,
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM r.created_at - tc.created_at))::numeric, 3) AS p95_s,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM r.created_at - tc.created_at))::numeric, 3) AS p99_s,
       round(max(extract(epoch FROM r.created_at - tc.created_at)), 3) AS max_s
FROM {s}.tool_calls tc
LEFT JOIN {s}.tool_results r ON r.tool_call_ref = tc.id AND r.source <> 'validation'
WHERE tc.created_at > now() - interval '24 hours'
  AND tc.executor <> 'none'
GROUP BY tc.tenant_id, tc.tool_name;


-- queue_lag: "Is the relay keeping up?"
-- Per tenant and kind of work: rows due now, rows delayed (backoff), rows in flight, rows
-- quarantined, expired leases, and the lag of the oldest due row (how long the oldest
-- ready row has waited past its available_at), in seconds.
CREATE OR REPLACE VIEW {s}.queue_lag AS
SELECT tenant_id,
       kind,
       count(*) FILTER (WHERE status = 'ready' AND available_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'ready' AND available_at > now()) AS delayed,
       count(*) FILTER (WHERE status = 'leased') AS in_flight,
       count(*) FILTER (WHERE status = 'quarantined') AS quarantined,
       count(*) FILTER (WHERE status = 'leased' AND lease_expires_at < now()) AS expired_leases,
       min(available_at) FILTER (WHERE status = 'ready' AND available_at <= now())
           AS oldest_due_at,
       coalesce(round(extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'ready' AND available_at <= now())), 3), 0) AS lag_s
FROM {s}.outbox
GROUP BY tenant_id, kind;


-- journal_payloads: "What body does this journal event name?" The journal names a
-- large argument (tool_call.intended) or result (tool_result.stored) by its reference,
-- detail.payload = {"digest", "bytes"}, never by its body; this view joins the body while
-- it is stored (present = false: the conversation was erased or retained since). Bodies
-- are content: no outbox role is granted this view, the schema owner reads it.
--   SELECT event, bytes, left(body, 200) FROM {s}.journal_payloads WHERE run_id = '...';
CREATE OR REPLACE VIEW {s}.journal_payloads AS
SELECT j.id AS journal_id,
       j.tenant_id,
       j.at,
       j.event,
       j.thread_id,
       j.run_id,
       j.tool_call_ref,
       j.tool_call_id,
       j.detail -> 'payload' ->> 'digest' AS digest,
       (j.detail -> 'payload' ->> 'bytes')::integer AS bytes,
       p.body IS NOT NULL AS present,
       p.body
FROM {s}.journal j
LEFT JOIN {s}.payloads p
       ON p.digest = j.detail -> 'payload' ->> 'digest' AND p.tenant_id = j.tenant_id
WHERE j.detail ? 'payload';
