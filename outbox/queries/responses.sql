-- name: insert_response
-- A new response: a stretch of a run, with its request's input items; journaled as
-- response.created by the same statement. Without an output_from_seq its output starts
-- at the thread's next position now.
WITH response AS (
    INSERT INTO {s}.responses (tenant_id, run_id, thread_id, previous_response_id,
                               in_conversation, output_from_seq, input, model, instructions,
                               tools, metadata, background, model_options)
    VALUES (%(tenant_id)s, %(run_id)s, %(thread_id)s, %(previous_response_id)s,
            %(in_conversation)s,
            coalesce(%(output_from_seq)s::integer,
                     (SELECT t.next_seq FROM {s}.threads t WHERE t.id = %(thread_id)s)),
            %(input)s, %(model)s, %(instructions)s,
            %(tools)s, %(metadata)s, %(background)s, %(model_options)s)
    RETURNING *
), told AS (
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, detail)
    SELECT tenant_id, 'response.created', thread_id, run_id,
           jsonb_build_object('response_id', id::text,
                              'previous_response_id', previous_response_id::text)
    FROM response
)
SELECT * FROM response

-- name: get_response
-- One response that is not deleted (row-level security hides other tenants').
SELECT * FROM {s}.responses r
WHERE r.id = %(id)s AND r.deleted_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = r.thread_id AND t.deleted_at IS NOT NULL)

-- name: delete_response
-- Mark a response deleted: hidden from the API from now on, kept here.
UPDATE {s}.responses SET deleted_at = now() WHERE id = %(id)s AND deleted_at IS NULL
RETURNING id

-- name: run_status
-- A response's run: its status, and whether it is active.
SELECT status, {s}.run_active_v1(status) AS active FROM {s}.runs WHERE id = %(run_id)s

-- name: latest_of_thread
-- The newest response of a thread, if any, deleted or not: a conversation's history goes
-- on from its newest response, whose messages stay in it when it is deleted.
SELECT * FROM {s}.responses WHERE thread_id = %(thread_id)s
ORDER BY created_at DESC, output_from_seq DESC LIMIT 1

-- name: output_until
-- Where the next response of the same run begins (NULL: this one is the run's last).
SELECT min(output_from_seq) AS seq FROM {s}.responses
WHERE run_id = %(run_id)s AND output_from_seq > %(from_seq)s

-- name: thread_position
-- The position the thread's next message will take.
SELECT next_seq FROM {s}.threads WHERE id = %(thread_id)s
