-- A thread as stored, for replay (outbox/history.py).

-- name: get_thread
-- One thread.
SELECT * FROM {s}.threads WHERE id = %(thread_id)s

-- name: thread_messages
-- A thread's messages in order, each tool message with the call it answers; a deleted
-- message (a plain one, never a call or a result) is not replayed.
SELECT m.seq, m.role, {s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref) AS content,
       m.id, tc.tool_call_id AS answers_call, m.reasoning
FROM {s}.messages m
LEFT JOIN {s}.tool_calls tc ON tc.id = m.tool_call_ref
WHERE m.thread_id = %(thread_id)s AND m.deleted_at IS NULL
ORDER BY m.seq

-- name: thread_calls
-- Every tool call asked for in a thread, by assistant message and position.
SELECT message_id, tool_call_id, tool_name,
       {s}.resolved_text_v1(arguments_raw, tenant_id, arguments_ref) AS arguments_raw
FROM {s}.tool_calls
WHERE thread_id = %(thread_id)s
ORDER BY message_id, position
