-- The trace exporter (outbox/traces.py): the statements it builds a batch of runs' spans
-- with. It runs as outbox_relay; the journal is read through run_span_events_v1 only.

-- name: take_due
-- Ended runs whose spans are not exported yet (runs.agent_span_due, set by the runs_span_due
-- trigger when a run ends, 0042), oldest end first; each locked by one exporter (SKIP
-- LOCKED) until its transaction clears the mark, after the export.
SELECT id, thread_id, tenant_id, model, traceparent, tracestate, status, cancelled_by,
       created_at, extract(epoch FROM created_at)::float8 AS created_s,
       extract(epoch FROM ended_at)::float8 AS ended_s
FROM {s}.runs
WHERE agent_span_due AND ended_at IS NOT NULL
ORDER BY ended_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

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
-- The model turns the attempts recorded: their response ids (and what the model said).
SELECT mt.run_id, mt.step_no, mt.response_id,
       CASE WHEN %(content)s THEN m.content END AS content
FROM {s}.model_turns mt
LEFT JOIN {s}.messages m ON m.id = mt.message_id AND %(content)s
WHERE mt.run_id = ANY(%(run_ids)s);

-- name: clear
UPDATE {s}.runs SET agent_span_due = false WHERE id = ANY(%(run_ids)s);

-- name: lag
-- How many ended runs wait for their spans, and how long the oldest has.
SELECT count(*) AS due, extract(epoch FROM now() - min(ended_at))::float8 AS lag_s
FROM {s}.runs WHERE agent_span_due AND ended_at IS NOT NULL;
