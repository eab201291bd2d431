-- The trace exporter (outbox/trace_export.py): the statements it builds a batch of runs' spans
-- with. It runs as outbox_relay; the journal is read through run_span_events_v1 only.

-- name: take_due
-- Ended runs whose spans are not exported yet (runs.agent_span_due, set by the runs_span_due
-- trigger when a run ends), oldest end first, that no other exporter holds: each
-- leased to this one (spans_taken_until) in a short transaction, so that no row lock is
-- held while it exports (a completer writing a late result of the run would wait for it).
-- A lease that runs out (an exporter died, or its export outlasted it) lets another take
-- the run: at least once.
WITH due AS (
    SELECT id FROM {s}.runs
    WHERE agent_span_due AND ended_at IS NOT NULL
      AND (spans_taken_until IS NULL OR spans_taken_until < now())
    ORDER BY ended_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {s}.runs r SET spans_taken_until = now() + make_interval(secs => %(lease_s)s)
FROM due WHERE r.id = due.id
RETURNING r.id, r.thread_id, r.tenant_id, r.model, r.traceparent, r.tracestate, r.status,
          r.cancelled_by, r.created_at, r.spans_taken_until,
          extract(epoch FROM r.created_at)::float8 AS created_s,
          extract(epoch FROM r.ended_at)::float8 AS ended_s;

-- name: events
SELECT run_id, event, tool_call_ref, attempt, detail
FROM {s}.run_span_events_v1(%(run_ids)s, %(since)s);

-- name: calls
-- The tool calls the attempts were of, with the approval each waited for (if any).
SELECT tc.id, tc.tool_call_id, tc.tool_name, tc.idempotency_mode, tc.idempotency_key,
       CASE WHEN %(content)s THEN tc.arguments END AS arguments,
       CASE WHEN %(content)s THEN (SELECT tr.output FROM {s}.tool_results tr
                                   WHERE tr.tool_call_ref = tc.id) END AS output,
       CASE WHEN %(content)s THEN (SELECT tr.error FROM {s}.tool_results tr
                                   WHERE tr.tool_call_ref = tc.id) END AS error,
       a.decided_by AS approved_by,
       extract(epoch FROM a.decided_at - a.created_at)::float8 AS approval_wait_s
FROM {s}.tool_calls tc
LEFT JOIN {s}.approvals a ON a.tool_call_ref = tc.id AND a.status = 'approved'
WHERE tc.id = ANY(%(refs)s);

-- name: turns
-- The model turns the attempts recorded: their response ids, the model that answered
-- (and what it said), and the compaction a turn made before its request (outbox/context.py):
-- the last message its summary stands for and the request's estimated tokens before and
-- after (NULL: the turn did not compact).
SELECT mt.run_id, mt.step_no, mt.response_id, mt.model,
       CASE WHEN %(content)s THEN m.content END AS content,
       k.through_seq, k.tokens_before, k.tokens_after
FROM {s}.model_turns mt
LEFT JOIN {s}.messages m ON m.id = mt.message_id AND %(content)s
LEFT JOIN {s}.compactions k ON k.run_id = mt.run_id AND k.step_no = mt.step_no
WHERE mt.run_id = ANY(%(run_ids)s);

-- name: clear
-- After the export: the marks of the runs this exporter still holds (a run that ended
-- again meanwhile lost its lease in the trigger, and stays due).
UPDATE {s}.runs r SET agent_span_due = false, spans_taken_until = NULL
FROM unnest(%(run_ids)s::uuid[], %(leases)s::timestamptz[]) AS t(id, lease)
WHERE r.id = t.id AND r.spans_taken_until = t.lease;

-- name: release
-- An export that failed: the runs this exporter still holds are free to take at once.
UPDATE {s}.runs r SET spans_taken_until = NULL
FROM unnest(%(run_ids)s::uuid[], %(leases)s::timestamptz[]) AS t(id, lease)
WHERE r.id = t.id AND r.spans_taken_until = t.lease;

-- name: lag
-- How many ended runs wait for their spans, and how long the oldest has.
SELECT count(*) AS due, extract(epoch FROM now() - min(ended_at))::float8 AS lag_s
FROM {s}.runs WHERE agent_span_due AND ended_at IS NOT NULL;
