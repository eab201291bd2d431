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
-- Every tool call asked for in a thread, by assistant message and position. Through the
-- thread's messages: tool_calls has no index led by thread_id (tool_calls_message_fk keeps
-- a call in its message's thread), and a search by it alone reads every call stored.
SELECT c.message_id, c.tool_call_id, c.tool_name,
       {s}.resolved_text_v1(c.arguments_raw, c.tenant_id, c.arguments_ref) AS arguments_raw
FROM {s}.messages m JOIN {s}.tool_calls c ON c.message_id = m.id
WHERE m.thread_id = %(thread_id)s
ORDER BY c.message_id, c.position
