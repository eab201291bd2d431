-- Queries of `outbox demo` (demo/demo.py): what its backend polls and what its report
-- counts. Read-only except through the writer API, which the demo calls like a backend.

-- name: relay_claimers
-- How many relay processes have their claim loop connected to this database.
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'outbox-relay-claim';

-- name: waiting_runs
-- Runs waiting for client-executed tool outputs (what the simulated backend answers).
SELECT id, tenant_id, thread_id FROM {s}.runs
WHERE status = 'requires_action'
ORDER BY created_at;

-- name: run_progress
-- How many runs exist and how many have ended.
SELECT count(*) AS total,
       count(*) FILTER (WHERE {s}.run_ended_v1(status)) AS ended
FROM {s}.runs;

-- name: done_calls_sample
-- Tool calls that already have their result: targets for duplicate callbacks.
SELECT tc.id, tc.tenant_id FROM {s}.tool_calls tc
JOIN {s}.tool_results r ON r.tool_call_ref = tc.id
ORDER BY random() LIMIT %(n)s;

-- name: delivered_batches_sample
-- Batches whose outputs were already submitted: targets for duplicate delivery polls.
SELECT id FROM {s}.tool_batches WHERE status = 'delivered' ORDER BY random() LIMIT %(n)s;

-- name: run_statuses
-- Runs by status.
SELECT status, count(*) AS n FROM {s}.runs GROUP BY status;

-- name: turn_latencies
-- Seconds from a user turn (run created) to its run's completion.
SELECT extract(epoch FROM ended_at - created_at)::float8 AS seconds
FROM {s}.runs WHERE status = 'completed' AND ended_at IS NOT NULL;

-- name: tool_calls_by_tool
-- Tool-call intents by tool.
SELECT tool_name, count(*) AS n FROM {s}.tool_calls GROUP BY tool_name ORDER BY tool_name;

-- name: parked_calls
-- Calls parked for an operator (quarantined or outcome unknown), with the reason.
SELECT tool_name, status, coalesce(last_error, '') AS reason FROM {s}.tool_calls
WHERE status IN ('quarantined', 'outcome_unknown')
ORDER BY id;

-- name: orphaned_results
-- Results kept out of every history (late, fenced, or for an ended run), by reason.
SELECT reason, count(*) AS n FROM {s}.orphaned_results GROUP BY reason;

-- name: threads_with_runs
-- Every thread with how many runs it has (a double-submitted turn must make one).
SELECT t.id, t.tenant_id, count(r.id) AS runs
FROM {s}.threads t LEFT JOIN {s}.runs r ON r.thread_id = t.id
GROUP BY t.id, t.tenant_id;
