-- name: take_seqs
-- Reserve n consecutive message numbers on a thread; returns the first.
UPDATE {s}.threads SET next_seq = next_seq + %(n)s
WHERE id = %(thread_id)s
RETURNING next_seq - %(n)s AS first_seq

-- name: insert_message
-- Append one message to a thread at a reserved position (with the reasoning items a
-- client's history gave before it, if any).
INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id, tool_call_ref,
                          reasoning)
VALUES (%(tenant_id)s, %(thread_id)s, %(seq)s, %(role)s, %(content)s, %(run_id)s,
        %(tool_call_ref)s, %(reasoning)s)
RETURNING id

-- name: lock_run
-- Lock a run row: every write that moves a run forward goes through this lock.
SELECT * FROM {s}.runs WHERE id = %(run_id)s FOR UPDATE

-- name: insert_outbox
-- Enqueue one unit of work; a repeated dedup key is a no-op. A held row (a call waiting for
-- approval) is due at 'infinity' until its approval is decided (decide_approval_v1).
INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id, tool_call_ref,
                        tool_name, correlation_id, max_attempts, payload, available_at)
VALUES (%(tenant_id)s, %(kind)s, %(dedup_key)s, %(thread_id)s, %(run_id)s, %(batch_id)s,
        %(tool_call_ref)s, %(tool_name)s, %(correlation_id)s, %(max_attempts)s, %(payload)s,
        CASE WHEN %(held)s THEN 'infinity'::timestamptz ELSE now() END)
ON CONFLICT (dedup_key, tenant_id) DO NOTHING
RETURNING id

-- name: call_for_result
-- A tool call with its batch, locking the batch: results of one batch are recorded one at a
-- time, so exactly one of them sees the batch complete.
SELECT tc.id, tc.tenant_id, tc.run_id, tc.thread_id, tc.batch_id, tc.tool_call_id,
       tc.status AS call_status, b.status AS batch_status, r.correlation_id
FROM {s}.tool_calls tc
JOIN {s}.tool_batches b ON b.id = tc.batch_id
JOIN {s}.runs r ON r.id = tc.run_id
WHERE tc.id = %(tool_call_ref)s
FOR UPDATE OF b

-- name: record_tool_results
-- Record terminal results of tool calls (a JSON array; record_tool_results_v1 in
-- sql/results.sql): stored once each, counted against their batches, the delivery
-- of each batch they complete enqueued once, all journaled. One row per result, in order:
-- its outcome (stored, duplicate, orphaned) and the batch it completed.
SELECT ref, outcome, completed_batch
FROM {s}.record_tool_results_v1(%(results)s::jsonb, %(worker)s::text)

-- name: get_result
-- The stored result of a tool call.
SELECT r.tool_call_ref, r.tenant_id, r.run_id, r.batch_id, r.status,
       {s}.resolved_json_v1(r.output, r.tenant_id, r.output_ref) AS output, r.error,
       r.attempt, r.source, r.worker, r.created_at
FROM {s}.tool_results r WHERE r.tool_call_ref = %(tool_call_ref)s

-- name: batch_owners
-- The runs batches belong to (read without a lock: the runs are locked first).
SELECT id, run_id FROM {s}.tool_batches WHERE id = ANY(%(batch_ids)s)

-- name: lock_runs
-- Lock runs in id order: the one lock order of every writer path is runs, then batches.
SELECT * FROM {s}.runs WHERE id = ANY(%(run_ids)s) ORDER BY id FOR UPDATE

-- name: lock_free_runs
-- Lock those of these runs no other transaction holds, in id order; the ids it locked.
SELECT id FROM {s}.runs WHERE id = ANY(%(run_ids)s) ORDER BY id FOR UPDATE SKIP LOCKED

-- name: runs_that_exist
SELECT id FROM {s}.runs WHERE id = ANY(%(run_ids)s)

-- name: lock_batches
-- Lock batches in id order, after their runs.
SELECT * FROM {s}.tool_batches WHERE id = ANY(%(batch_ids)s) ORDER BY id FOR UPDATE

-- name: insert_submissions
-- The one submission of each batch's outputs; a repeat returns nothing for that batch.
INSERT INTO {s}.submissions (tenant_id, run_id, batch_id, outputs_count)
SELECT tenant_id, run_id, id, size FROM {s}.tool_batches WHERE id = ANY(%(batch_ids)s)
ORDER BY id
ON CONFLICT (batch_id, tenant_id) DO NOTHING
RETURNING batch_id

-- name: answer_calls
-- Append a tool message for every call of these batches that has none yet, in the order the
-- model asked for them, all in one statement (each thread's message numbers are reserved
-- here too). A message holds the canonical text of the call's result: a JSON string as
-- itself, any other output as its JSON text, an error as {"error": ...}. A call without a
-- result is answered with what is known, never more: "not executed" only when no attempt
-- of it was ever made; "outcome unknown" when one may have reached the tool (an attempt was
-- claimed or dispatched: it may be executing still, or have taken effect); "no output"
-- for a client call (the backend may or may not have run it). The text is built from the
-- stored result, capped when it was stored, without a trip through the client.
WITH answers AS (
    SELECT tc.tenant_id, tc.thread_id, tc.run_id, tc.batch_id, tc.position, tc.id AS ref,
           CASE WHEN r.status = 'ok' AND jsonb_typeof(r.output) = 'string'
                    THEN r.output #>> '{}'
                WHEN r.status = 'ok' THEN coalesce(r.output::text, 'null')
                WHEN r.status = 'error' THEN jsonb_build_object('error', r.error)::text
                WHEN tc.executor = 'client' THEN jsonb_build_object(
                    'error', 'no output: ' || %(why)s::text
                             || ' before an output of this call was submitted')::text
                WHEN tc.attempts > 0 OR tc.dispatched_attempt IS NOT NULL
                     OR EXISTS (SELECT 1 FROM {s}.outbox o
                                WHERE o.dedup_key = {s}.tool_call_key_v1(tc.id) AND o.attempts > 0
                                OFFSET 0)
                    THEN jsonb_build_object(
                    'error', 'outcome unknown: ' || %(why)s::text
                             || ' while an attempt of this call may have been under way; it'
                             || ' may have taken effect, and a result that arrives later is'
                             || ' kept out of this conversation')::text
                ELSE jsonb_build_object('error', 'not executed: ' || %(why)s::text)::text
           END AS content
    FROM {s}.tool_calls tc
    -- OFFSET 0 keeps each lookup below a probe of a unique index per call, whatever the
    -- statistics say: a scan of results or messages would grow with the whole history.
    LEFT JOIN LATERAL (
        SELECT x.status, x.error,
               {s}.resolved_json_v1(x.output, x.tenant_id, x.output_ref) AS output
        FROM {s}.tool_results x WHERE x.tool_call_ref = tc.id OFFSET 0
    ) r ON true
    WHERE tc.batch_id = ANY(%(batch_ids)s::bigint[])
      AND NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.tool_call_ref = tc.id OFFSET 0)
), numbered AS (
    SELECT a.*, count(*) OVER (PARTITION BY a.thread_id) AS n,
           row_number() OVER (PARTITION BY a.thread_id ORDER BY a.batch_id, a.position) AS k
    FROM answers a
), seqs AS (
    UPDATE {s}.threads t SET next_seq = t.next_seq + w.n
    FROM (SELECT DISTINCT thread_id, n FROM numbered) w
    WHERE t.id = w.thread_id
    RETURNING t.id, t.next_seq - w.n AS first_seq
)
INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id, tool_call_ref)
SELECT m.tenant_id, m.thread_id, s.first_seq + m.k - 1, 'tool', m.content, m.run_id, m.ref
FROM numbered m JOIN seqs s ON s.id = m.thread_id
ORDER BY m.thread_id, m.k

-- name: mark_delivered
-- Close batches whose outputs entered the history, and journal each delivery.
WITH delivered AS (
    UPDATE {s}.tool_batches SET status = 'delivered', delivered_at = now()
    WHERE id = ANY(%(batch_ids)s)
    RETURNING id, tenant_id, thread_id, run_id, size
)
INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, correlation_id, detail)
SELECT d.tenant_id, 'batch.delivered', d.thread_id, d.run_id, d.id, r.correlation_id,
       jsonb_build_object('outputs', d.size)
FROM delivered d JOIN {s}.runs r ON r.id = d.run_id
ORDER BY d.id

-- name: next_model_turns
-- Enqueue each run's next model turn (once, by dedup key) and put the runs in progress
-- (the caller holds the run locks and checked no limit stops them).
WITH next AS (
    SELECT * FROM unnest(%(run_ids)s::uuid[], %(steps)s::int[]) AS n(run_id, step_no)
), queued AS (
    INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, correlation_id,
                            payload)
    SELECT r.tenant_id, 'model_turn', {s}.model_turn_key_v1(r.id, n.step_no), r.thread_id,
           r.id, r.correlation_id, jsonb_build_object('step_no', n.step_no)
    FROM next n JOIN {s}.runs r ON r.id = n.run_id
    ORDER BY r.id
    ON CONFLICT (dedup_key, tenant_id) DO NOTHING
)
UPDATE {s}.runs r
SET status = 'in_progress', failure_reason = NULL, action_deadline = NULL, ended_at = NULL,
    updated_at = now()
FROM next n
WHERE r.id = n.run_id
RETURNING r.id, r.status

-- name: runs_tools
-- What planning runs' tool calls needs of them: the tools each may call and their pinned
-- versions (set when it started; a version once pinned never changes, and a tool added
-- by lifecycle.retarget_run is pinned then).
SELECT id, tool_names, tool_pins FROM {s}.runs WHERE id = ANY(%(run_ids)s)

-- name: record_model_turns
-- Record model turns with their planned calls, in order (record_model_turns_v1,
-- turns.sql: each table written once for all the turns). Both come as one JSON array
-- each, the nth call list the nth turn's: a jsonb[] parameter cost the relay 82 µs of CPU
-- a turn to send (each element quoted into the array's text), a JSON array 8 µs.
SELECT * FROM {s}.record_model_turns_v1(%(turns)s, %(calls)s)
