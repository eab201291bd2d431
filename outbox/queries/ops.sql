-- name: queue_by_kind
-- Queue depth per kind: due, delayed, held (calls waiting for approval: due at
-- 'infinity'), in flight, quarantined, and the oldest due row's lag.
SELECT kind,
       count(*) FILTER (WHERE status = 'ready' AND available_at <= now()) AS ready,
       count(*) FILTER (WHERE status = 'ready' AND available_at > now()
                        AND available_at <> 'infinity') AS delayed,
       count(*) FILTER (WHERE status = 'ready' AND available_at = 'infinity') AS held,
       count(*) FILTER (WHERE status = 'leased') AS in_flight,
       count(*) FILTER (WHERE status = 'quarantined') AS quarantined,
       coalesce(round(extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'ready' AND available_at <= now())), 3), 0)::float AS lag_s
FROM {s}.outbox
GROUP BY kind
ORDER BY kind

-- name: queue_by_tool
-- Queue depth of tool-call rows per tool.
SELECT tc.tool_name AS tool,
       count(*) FILTER (WHERE o.status = 'ready' AND o.available_at <= now()) AS ready,
       count(*) FILTER (WHERE o.status = 'ready' AND o.available_at > now()
                        AND o.available_at <> 'infinity') AS delayed,
       count(*) FILTER (WHERE o.status = 'ready' AND o.available_at = 'infinity') AS held,
       count(*) FILTER (WHERE o.status = 'leased') AS in_flight,
       count(*) FILTER (WHERE o.status = 'quarantined') AS quarantined
FROM {s}.outbox o
JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
GROUP BY tc.tool_name
ORDER BY tc.tool_name

-- name: transaction_holders
-- Sessions of this database whose transaction holds rows of the schema's tables for at
-- least older_than_s (a lock on one of them stronger than a plain read's: FOR UPDATE, or a
-- write), or that another session waits on: those others wait on first, then the oldest.
-- A transaction that only reads (a pg_dump) holds no row back and is left out, unless
-- somebody waits on it. pg_locks shows every session; pg_stat_activity hides the state,
-- times and query of another role's session from a user without pg_read_all_stats
-- (``visible`` false).
WITH touching AS (
    SELECT l.pid, array_agg(DISTINCT c.relname::text ORDER BY c.relname::text) AS tables,
           bool_or(l.mode <> 'AccessShareLock') AS holds_rows
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    WHERE l.granted AND l.database = (SELECT oid FROM pg_database
                                      WHERE datname = current_database())
      AND c.relnamespace = '{s}'::regnamespace AND c.relkind IN ('r', 'p')
    GROUP BY l.pid
), waiting AS (
    SELECT b.pid, count(*) AS n
    FROM pg_stat_activity a, unnest(pg_blocking_pids(a.pid)) AS b(pid)
    WHERE a.datname = current_database()
    GROUP BY b.pid
)
SELECT a.pid, a.usename::text AS user_name, a.application_name, a.state,
       round(extract(epoch FROM now() - a.xact_start), 1)::float AS open_s,
       round(extract(epoch FROM now() - a.state_change), 1)::float AS in_state_s,
       coalesce(w.n, 0)::int AS waiting, t.tables, left(a.query, 100) AS last_query,
       a.xact_start IS NOT NULL AS visible
FROM touching t
JOIN pg_stat_activity a ON a.pid = t.pid
LEFT JOIN waiting w ON w.pid = t.pid
WHERE t.pid <> pg_backend_pid()
  AND (w.n > 0
       OR t.holds_rows AND (a.xact_start IS NULL
                            OR a.xact_start <= now() - make_interval(secs => %(older_than_s)s)))
ORDER BY coalesce(w.n, 0) DESC, a.xact_start NULLS LAST, a.pid

-- name: claim_to_start
-- How long due rows waited before a worker claimed them, over a recent window: rows still in
-- the hot table (claimed_at - available_at) and events the relay journaled with lag_s.
WITH samples AS (
    SELECT extract(epoch FROM claimed_at - available_at)::float AS s
    FROM {s}.outbox
    WHERE claimed_at > now() - make_interval(mins => %(window_min)s)
      AND claimed_at >= available_at
    UNION ALL
    SELECT (detail ->> 'lag_s')::float
    FROM {s}.journal
    WHERE at > now() - make_interval(mins => %(window_min)s) AND detail ? 'lag_s'
)
SELECT count(*) AS samples,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY s)::numeric, 3)::float AS p50_s,
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY s)::numeric, 3)::float AS p99_s
FROM samples

-- name: list_runs
-- Runs, newest first, optionally filtered by status, tenant and creation time. The last
-- condition holds for every run: it is the predicate of runs_tenant_status, which
-- serves only the statements that state it.
SELECT id, tenant_id, status, model, step_count, tokens_used, failure_reason, last_error,
       created_at, updated_at
FROM {s}.runs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND created_at > '-infinity'
ORDER BY created_at DESC, id
LIMIT %(limit)s

-- name: runs_by_prefix
-- Runs whose id starts with a prefix (at most two: enough to tell an ambiguous prefix).
SELECT * FROM {s}.runs WHERE id::text LIKE %(prefix)s || '%%' ORDER BY id LIMIT 2

-- name: run_timeline
-- A run's journal events in order (the run_timeline view of sql/views.sql).
SELECT seq, at, event, batch_id, tool_call_ref, tool_call_id, outbox_id, attempt, worker,
       actor, error, since_previous_s::float AS since_previous_s, detail, journal_id
FROM {s}.run_timeline
WHERE run_id = %(run_id)s
ORDER BY seq

-- name: lock_call
-- A tool call with its batch and run states, locked for an operator action.
SELECT tc.*, b.status AS batch_status, r.status AS run_status, r.correlation_id
FROM {s}.tool_calls tc
JOIN {s}.tool_batches b ON b.id = tc.batch_id
JOIN {s}.runs r ON r.id = tc.run_id
WHERE tc.id = %(id)s
FOR UPDATE OF tc

-- name: lock_outbox
-- An outbox row, locked for an operator action. Whether it is delayed is read on the clock
-- once the row is locked, not at the start of the transaction: a row another operator made
-- due while this one waited for its lock (due at their transaction's start, later than this
-- one's) is due, not delayed, so it is not requeued a second time.
SELECT o.*, o.available_at > clock_timestamp() AS delayed, r.status AS run_status
FROM {s}.outbox o
LEFT JOIN {s}.runs r ON r.id = o.run_id
WHERE o.id = %(id)s
FOR UPDATE OF o

-- name: lock_outbox_of_call
-- The outbox row that executes a tool call, if one is queued, locked (delayed: as in
-- lock_outbox).
SELECT o.*, o.available_at > clock_timestamp() AS delayed, r.status AS run_status
FROM {s}.outbox o
LEFT JOIN {s}.runs r ON r.id = o.run_id
WHERE o.kind = 'tool_call' AND o.tool_call_ref = %(tool_call_ref)s
FOR UPDATE OF o

-- name: select_requeue
-- Candidates of a bulk requeue: queued rows in a state (quarantined or delayed), optionally
-- of one tool and last claimed (or created) since a time.
SELECT o.id
FROM {s}.outbox o
LEFT JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
WHERE CASE %(state)s
          WHEN 'quarantined' THEN o.status = 'quarantined'
          -- 'infinity': a call waiting for approval (outbox.approvals), not a delay.
          WHEN 'delayed' THEN o.status = 'ready' AND o.available_at > now()
                              AND o.available_at <> 'infinity'
      END
  AND (%(tool)s::text IS NULL OR tc.tool_name = %(tool)s)
  AND (%(since)s::timestamptz IS NULL OR coalesce(o.claimed_at, o.created_at) >= %(since)s)
ORDER BY o.id

-- name: make_ready
-- Put a row back in the queue, due now. Attempts stay counted (the fencing token is never
-- handed out twice) and at least one more failure is allowed.
UPDATE {s}.outbox
SET status = 'ready', available_at = now(), lease_owner = NULL, lease_expires_at = NULL,
    max_attempts = greatest(max_attempts, failures + 1),
    lost_leases = 0
WHERE id = %(id)s
RETURNING *

-- name: park
-- Quarantine a queued row with the operator's reason.
UPDATE {s}.outbox
SET status = 'quarantined', last_error = %(error)s
WHERE id = %(id)s AND status = 'ready'
RETURNING *

-- name: forget
-- Remove a row whose work an operator settled (its history stays in the journal).
DELETE FROM {s}.outbox WHERE id = %(id)s RETURNING id

-- name: requeue_call
-- Queue a tool call whose outbox row is gone, continuing its attempt count.
INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                        tool_call_ref, tool_name, correlation_id, attempts, max_attempts)
SELECT tc.tenant_id, 'tool_call', {s}.tool_call_key_v1(tc.id), tc.thread_id, tc.run_id,
       tc.batch_id, tc.id, tc.tool_name, r.correlation_id, tc.attempts,
       greatest(coalesce(t.max_attempts, 5), tc.attempts + 1)
FROM {s}.tool_calls tc
JOIN {s}.runs r ON r.id = tc.run_id
LEFT JOIN {s}.tools t ON t.name = tc.tool_name AND t.version = tc.tool_version
                     AND t.tenant_id IN (tc.tenant_id, '*')
WHERE tc.id = %(tool_call_ref)s
ORDER BY t.tenant_id = '*'
LIMIT 1
RETURNING *

-- name: set_call_status
-- An operator moved a tool call: new status and note; ``clear_dispatch`` forgets that an
-- earlier attempt may have reached the tool (only when the operator says it did not).
UPDATE {s}.tool_calls
SET status = %(status)s, last_error = %(note)s, updated_at = now(),
    dispatched_attempt = CASE WHEN %(clear_dispatch)s THEN NULL ELSE dispatched_attempt END
WHERE id = %(id)s
RETURNING *

-- name: journal_tail
-- The newest journal events (optionally of one run: its tenant's events under its id; see
-- run_timeline in sql/views.sql), oldest first.
SELECT * FROM (
    SELECT id, at, tenant_id, event, run_id, batch_id, tool_call_ref, tool_call_id,
           outbox_id, attempt, worker, actor, detail
    FROM {s}.journal
    WHERE %(run_id)s::uuid IS NULL OR (run_id = %(run_id)s AND tenant_id =
        (SELECT r.tenant_id FROM {s}.runs r WHERE r.id = %(run_id)s))
    ORDER BY id DESC
    LIMIT %(limit)s
) newest
ORDER BY id

-- name: journal_after
-- Journal events from an id on (optionally of one run), for following the journal. Ids
-- commit out of order, so the caller re-reads a window below its last id and skips those
-- it has seen.
SELECT id, at, tenant_id, event, run_id, batch_id, tool_call_ref, tool_call_id,
       outbox_id, attempt, worker, actor, detail
FROM {s}.journal
WHERE id > %(after_id)s AND (%(run_id)s::uuid IS NULL OR (run_id = %(run_id)s AND tenant_id =
    (SELECT r.tenant_id FROM {s}.runs r WHERE r.id = %(run_id)s)))
ORDER BY id
LIMIT %(limit)s

-- name: prune_journal
-- Delete journal events older than an age, through the owner-only SQL function.
SELECT {s}.prune_journal(make_interval(secs => %(older_than_s)s), %(actor)s) AS removed
