-- Reads of `outbox serve`. Every one runs as outbox_api inside a transaction scoped to the
-- API key's tenant, so row-level security shows that tenant's rows only; state changes go
-- through the library (outbox.writer, outbox.lifecycle, outbox.assistants), never here.

-- name: act_as_api
-- For the rest of this transaction, act as the role outbox_api (row-level security applies).
SET LOCAL ROLE outbox_api

-- name: act_for_tenant
-- act_as_api and tenancy's scope in one statement: for the rest of this transaction, act
-- as the role outbox_api for one tenant (set_config('role', ..., true) is SET LOCAL ROLE).
-- The server ends the session if the transaction then waits on its client longer than
-- idle_ms (a server process paused mid-request: its locks go with it). SET LOCAL, as every
-- setting here: nothing outlives the transaction, through a pooler too.
SELECT set_config('role', 'outbox_api', true), set_config('outbox.tenant_id', %(tenant_id)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true)

-- name: act_for_tenant_unanswered
-- act_for_tenant, and this transaction commits without waiting for its WAL flush
-- (SET LOCAL synchronous_commit = off): only for a transaction no answer is made from
-- (a waiting responses.create: its client is answered from the relay's later, durable
-- commit; docs/serve.md, "Durability of a waiting create").
SELECT set_config('role', 'outbox_api', true), set_config('outbox.tenant_id', %(tenant_id)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true),
       set_config('synchronous_commit', 'off', true)

-- name: act_for_key
-- act_for_tenant for the tenant an API key (by its SHA-256) acts for, and that tenant
-- (NULL for an unknown or revoked key: the caller rolls back and refuses the request): the
-- key's lookup and the transaction's scope in one round trip. The lookup runs first (the
-- subquery in FROM) through api_key_tenant_v1, which outbox_api may call.
SELECT k.tenant_id, set_config('role', 'outbox_api', true),
       set_config('outbox.tenant_id', coalesce(k.tenant_id, ''), true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true)
FROM (SELECT {s}.api_key_tenant_v1(%(key_hash)s) AS tenant_id) k

-- name: act_for_key_unanswered
-- act_for_key, and this transaction commits without waiting for its WAL flush (as
-- act_for_tenant_unanswered).
SELECT k.tenant_id, set_config('role', 'outbox_api', true),
       set_config('outbox.tenant_id', coalesce(k.tenant_id, ''), true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true),
       set_config('synchronous_commit', 'off', true)
FROM (SELECT {s}.api_key_tenant_v1(%(key_hash)s) AS tenant_id) k

-- name: durable_reads
-- The last statement of a transaction whose answer goes out at its commit: while the WAL
-- is not flushed as far as it is written, a commit made without waiting for its flush (a
-- waiting responses.create's) may be visible here and not yet durable. Then this writes a
-- logical-decoding message (a few bytes of WAL, decoded by nobody unless asked for), which
-- gives the transaction an id and WAL of its own, so its commit waits for the flush of
-- everything before it: nothing it read can be lost in a crash. Otherwise, or when the
-- transaction wrote already (its commit waits for that flush anyway), it does nothing.
SELECT CASE WHEN pg_current_xact_id_if_assigned() IS NULL
             AND pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()
            THEN pg_logical_emit_message(true, 'outbox.durable', '') END

-- name: thread
-- One thread, unless deleted.
SELECT id, title, metadata, created_at FROM {s}.threads
WHERE id = %(thread_id)s AND deleted_at IS NULL

-- name: messages
-- A thread's user and assistant messages with text, in order, from a position on (not
-- the deleted ones).
SELECT m.id, m.seq, m.role, m.content, m.run_id, m.created_at, ar.assistant_id
FROM {s}.messages m
LEFT JOIN {s}.assistant_runs ar ON ar.run_id = m.run_id
WHERE m.thread_id = %(thread_id)s AND m.role IN ('user', 'assistant')
  AND m.content IS NOT NULL AND m.content <> '' AND m.deleted_at IS NULL
  AND (%(after_seq)s::int IS NULL OR m.seq > %(after_seq)s)
  AND (%(before_seq)s::int IS NULL OR m.seq < %(before_seq)s)
ORDER BY m.seq

-- name: active_run
-- The thread's active run, if any.
SELECT id, status FROM {s}.runs
WHERE thread_id = %(thread_id)s AND {s}.run_active_v1(status)

-- name: run
-- A run of a thread as the Assistants protocol shows it: the run, its assistant and
-- declared tools, its token usage.
SELECT r.*, ar.assistant_id, ar.tools AS declared_tools, ar.metadata AS api_metadata,
       (r.action_deadline < now()) AS deadline_passed,
       coalesce(u.input_tokens, 0) AS input_tokens, coalesce(u.output_tokens, 0) AS output_tokens
FROM {s}.runs r
LEFT JOIN {s}.assistant_runs ar ON ar.run_id = r.id
LEFT JOIN LATERAL (
    SELECT sum(mt.input_tokens) AS input_tokens, sum(mt.output_tokens) AS output_tokens
    FROM {s}.model_turns mt WHERE mt.run_id = r.id
) u ON true
WHERE r.id = %(run_id)s AND (%(thread_id)s::uuid IS NULL OR r.thread_id = %(thread_id)s)
  AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = r.thread_id AND t.deleted_at IS NOT NULL)

-- name: runs_of_thread
-- The ids of a thread's runs in creation order.
SELECT id, created_at FROM {s}.runs WHERE thread_id = %(thread_id)s ORDER BY created_at, id

-- name: lock_run
-- Lock a run before answering it (the run lock comes first in every writer path); a run
-- of a deleted thread is not found.
SELECT r.status, r.failure_reason, (r.action_deadline < now()) AS deadline_passed
FROM {s}.runs r WHERE r.id = %(run_id)s AND r.thread_id = %(thread_id)s
  AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = r.thread_id AND t.deleted_at IS NOT NULL)
FOR UPDATE OF r

-- name: steps
-- A run's model turns with their tool calls and results, in step order.
SELECT mt.id, mt.step_no, mt.message_id, mt.created_at, mt.input_tokens, mt.output_tokens,
       m.content, b.id AS batch_id, b.status AS batch_status,
       coalesce(calls.items, '[]'::jsonb) AS calls
FROM {s}.model_turns mt
JOIN {s}.messages m ON m.id = mt.message_id
LEFT JOIN {s}.tool_batches b ON b.run_id = mt.run_id AND b.step_no = mt.step_no
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'id', tc.tool_call_id, 'name', tc.tool_name, 'arguments', {s}.resolved_text_v1(tc.arguments_raw, tc.tenant_id, tc.arguments_ref),
               'status', tc.status,
               'output', {s}.resolved_text_v1(answer.content, answer.tenant_id,
                                              answer.content_ref))
           ORDER BY tc.position) AS items
    FROM {s}.tool_calls tc
    LEFT JOIN {s}.messages answer ON answer.tool_call_ref = tc.id
    WHERE tc.batch_id = b.id
) calls ON true
WHERE mt.run_id = %(run_id)s
ORDER BY mt.step_no

-- name: run_events
-- A run's status and its journal events after an id, read in one snapshot, with that
-- snapshot's oldest running transaction (xmin) and next transaction id (xmax). Journal ids
-- commit out of order; server/events.py uses the two to emit an event only once no
-- transaction that could still commit a smaller id is running. A run's events are never
-- older than the run (journaled in its transaction or later): the bound on `at` lets the
-- journal's days before the run go unread.
SELECT r.status,
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS snapshot_xmin,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS snapshot_xmax,
       coalesce((
           SELECT jsonb_agg(to_jsonb(e) ORDER BY e.id) FROM (
               SELECT j.id, j.at, j.event, j.thread_id, j.run_id, j.batch_id,
                      j.tool_call_ref, j.tool_call_id, j.correlation_id, j.attempt, j.worker,
                      j.actor, j.detail
               FROM {s}.journal j
               WHERE j.run_id = r.id AND j.tenant_id = r.tenant_id AND j.id > %(after_id)s
                 AND j.at >= r.created_at  -- no journal day before the run's is read
               ORDER BY j.id
               LIMIT %(limit)s
           ) e
       ), '[]'::jsonb) AS events
FROM {s}.runs r WHERE r.id = %(run_id)s
  AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = r.thread_id AND t.deleted_at IS NOT NULL)

-- name: message
-- One message of a thread, by id, unless it or its thread is deleted.
SELECT m.id, m.seq, m.role, {s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref) AS content,
       m.run_id, m.created_at, ar.assistant_id
FROM {s}.messages m
LEFT JOIN {s}.assistant_runs ar ON ar.run_id = m.run_id
WHERE m.id = %(message_id)s AND m.thread_id = %(thread_id)s AND m.deleted_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = m.thread_id AND t.deleted_at IS NOT NULL)

-- name: responses_shown
-- Responses that are not deleted (as outbox.responses.get_response reads them), a row each
-- with what it shows, in one statement (requests waiting on their responses read them so,
-- all those one commit woke at once: server.reads): its run as `run` reads it (JSON),
-- where its output ends (the next response of the same run: its position and when it
-- began; NULL for the run's last), the run's assistant messages with text in that
-- stretch, and its client function calls made from the response's beginning to that end,
-- in order.
WITH resp AS (
    SELECT * FROM {s}.responses r
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.deleted_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM {s}.threads t
                      WHERE t.id = r.thread_id AND t.deleted_at IS NOT NULL)
)
SELECT resp.*, next.until_seq,
       (SELECT to_jsonb(run) FROM (
            SELECT r.*, (r.action_deadline < now()) AS deadline_passed,
                   coalesce(u.input_tokens, 0) AS input_tokens,
                   coalesce(u.output_tokens, 0) AS output_tokens
            FROM {s}.runs r
            LEFT JOIN LATERAL (
                SELECT sum(mt.input_tokens) AS input_tokens,
                       sum(mt.output_tokens) AS output_tokens
                FROM {s}.model_turns mt WHERE mt.run_id = r.id
            ) u ON true
            WHERE r.id = resp.run_id) run) AS run,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'content', m.content)
                                  ORDER BY m.seq), '[]'::jsonb)
        FROM {s}.messages m
        WHERE m.thread_id = resp.thread_id AND m.run_id = resp.run_id AND m.role = 'assistant'
          AND m.content IS NOT NULL AND m.content <> '' AND m.seq >= resp.output_from_seq
          AND (next.until_seq IS NULL OR m.seq < next.until_seq)
       ) AS texts,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', tc.id, 'tool_call_id', tc.tool_call_id,
                                                     'tool_name', tc.tool_name,
                                                     'arguments_raw', {s}.resolved_text_v1(tc.arguments_raw, tc.tenant_id, tc.arguments_ref))
                                  ORDER BY tc.id), '[]'::jsonb)
        FROM {s}.tool_calls tc
        WHERE tc.run_id = resp.run_id AND tc.executor = 'client'
          AND tc.created_at >= resp.created_at
          AND (next.ended_before IS NULL OR tc.created_at < next.ended_before)
       ) AS calls
FROM resp
CROSS JOIN LATERAL (
    SELECT min(n.output_from_seq) AS until_seq, min(n.created_at) AS ended_before
    FROM {s}.responses n
    WHERE n.run_id = resp.run_id AND n.output_from_seq > resp.output_from_seq
) next

-- name: stored_messages
-- The tenant's user and assistant messages of these ids (row-level security: no other
-- tenant's), unless they or their thread are deleted: items a Responses input names.
SELECT m.id, m.thread_id, m.role, m.content
FROM {s}.messages m
JOIN {s}.threads t ON t.id = m.thread_id AND t.deleted_at IS NULL
WHERE m.id = ANY(%(ids)s::bigint[]) AND m.role IN ('user', 'assistant')
  AND m.content IS NOT NULL AND m.content <> '' AND m.deleted_at IS NULL

-- name: stored_calls
-- The tenant's function calls of these ids that its callers saw (client calls, and calls
-- of an imported history): the ``fc_<id>`` items of responses.
SELECT tc.id, tc.thread_id, tc.tool_call_id, tc.tool_name, {s}.resolved_text_v1(tc.arguments_raw, tc.tenant_id, tc.arguments_ref) AS arguments_raw
FROM {s}.tool_calls tc
JOIN {s}.runs r ON r.id = tc.run_id
JOIN {s}.threads t ON t.id = tc.thread_id AND t.deleted_at IS NULL
WHERE tc.id = ANY(%(ids)s::bigint[])
  AND (tc.executor = 'client' OR (tc.executor = 'none' AND r.model = 'import'))

-- name: history_messages
-- A thread's messages in order, each tool message with the call it answers and whether
-- the caller saw that call (a client call or an imported one; the relay's registry calls
-- never show in a response).
SELECT m.id, m.role, {s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref) AS content,
       tc.tool_call_id AS answers_call,
       (tc.executor = 'client' OR (tc.executor = 'none' AND r.model = 'import')) AS shown
FROM {s}.messages m
LEFT JOIN {s}.tool_calls tc ON tc.id = m.tool_call_ref
LEFT JOIN {s}.runs r ON r.id = tc.run_id
WHERE m.thread_id = %(thread_id)s AND m.deleted_at IS NULL
  AND m.role IN ('user', 'assistant', 'tool')
ORDER BY m.seq

-- name: history_calls
-- A thread's function calls its callers saw, by assistant message and position.
SELECT tc.message_id, tc.tool_call_id, tc.tool_name, {s}.resolved_text_v1(tc.arguments_raw, tc.tenant_id, tc.arguments_ref) AS arguments_raw
FROM {s}.tool_calls tc
JOIN {s}.runs r ON r.id = tc.run_id
WHERE tc.thread_id = %(thread_id)s
  AND (tc.executor = 'client' OR (tc.executor = 'none' AND r.model = 'import'))
ORDER BY tc.message_id, tc.position

-- name: run_by_idempotency_key
-- The run a tenant's Idempotency-Key made, with the digest of the request that made it
-- (journaled as run.requested in the run's own transaction; NULL for older runs).
SELECT r.id, r.thread_id,
       (SELECT j.detail->>'digest' FROM {s}.journal j
        WHERE j.run_id = r.id AND j.event = 'run.requested' AND j.at >= r.created_at
        ORDER BY j.id LIMIT 1) AS digest
FROM {s}.runs r
WHERE r.tenant_id = %(tenant_id)s AND r.idempotency_key = %(key)s

-- name: request_by_idempotency_key
-- What a tenant's Idempotency-Key made on an endpoint that starts no run of its own (a
-- response, a message): the request.keyed event journaled with it, under the key's own
-- uuid in run_id (server/idempotency.py says why), so the lookup uses journal_run.
SELECT j.thread_id, j.detail->>'digest' AS digest, j.detail->>'object_id' AS object_id
FROM {s}.journal j
WHERE j.run_id = %(key_id)s AND j.event = 'request.keyed' AND j.tenant_id = %(tenant_id)s
ORDER BY j.id LIMIT 1

-- name: hold_idempotency_key
-- Twins (the same tenant and key at the same moment) take turns until the first commits:
-- the second then finds what the first made instead of racing it to a unique index.
SELECT pg_advisory_xact_lock(hashtextextended(%(tenant_id)s || chr(1) || %(key)s, 29))
