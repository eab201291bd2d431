-- name: insert_assistant
-- Store an assistant.
INSERT INTO {s}.assistants (tenant_id, name, description, model, instructions, tools, metadata)
VALUES (%(tenant_id)s, %(name)s, %(description)s, %(model)s, %(instructions)s, %(tools)s,
        %(metadata)s)
RETURNING *

-- name: get_assistant
-- One assistant (row-level security hides other tenants').
SELECT * FROM {s}.assistants WHERE id = %(id)s

-- name: list_assistants
-- Assistants in creation order (oldest first; the caller reverses for newest first).
SELECT * FROM {s}.assistants ORDER BY created_at, id

-- name: link_run
-- Keep a run's assistant, declared tools and metadata beside it (once per run).
INSERT INTO {s}.assistant_runs (run_id, tenant_id, assistant_id, tools, metadata)
VALUES (%(run_id)s, %(tenant_id)s, %(assistant_id)s, %(tools)s, %(metadata)s)
ON CONFLICT (run_id, tenant_id) DO NOTHING

-- name: update_assistant
-- Change the fields given (a NULL parameter keeps the field; metadata replaces the whole
-- map, as OpenAI's modify did).
UPDATE {s}.assistants SET
    name = CASE WHEN %(set_name)s THEN %(name)s ELSE name END,
    description = CASE WHEN %(set_description)s THEN %(description)s ELSE description END,
    model = coalesce(%(model)s, model),
    instructions = CASE WHEN %(set_instructions)s THEN %(instructions)s ELSE instructions END,
    tools = coalesce(%(tools)s, tools),
    metadata = coalesce(%(metadata)s, metadata)
WHERE id = %(id)s
RETURNING *

-- name: delete_assistant
-- Delete an assistant; the runs it started keep running, their link is cleared.
DELETE FROM {s}.assistants WHERE id = %(id)s RETURNING id

-- name: update_thread_metadata
-- Replace a thread's metadata (row-level security: the tenant's threads only).
UPDATE {s}.threads SET metadata = %(metadata)s WHERE id = %(id)s AND deleted_at IS NULL
RETURNING id, title, metadata, created_at

-- name: lock_thread
-- Lock a thread that is not deleted. start_run_v1 locks it too, so a delete and a start
-- cannot both win; the active run is read by the next statement, whose snapshot is taken
-- after the lock is held (one statement would not see a run committed while it waited).
SELECT t.id FROM {s}.threads t
WHERE t.id = %(id)s AND t.deleted_at IS NULL
FOR UPDATE

-- name: active_run
-- The thread's active run, if any (read under the thread's lock).
SELECT r.id, r.status FROM {s}.runs r
WHERE r.thread_id = %(id)s AND {s}.run_active_v1(r.status)

-- name: delete_thread
-- Mark a thread deleted: hidden from the API from now on, every row kept.
UPDATE {s}.threads SET deleted_at = now() WHERE id = %(id)s RETURNING deleted_at

-- name: message_to_delete
-- A message of a thread that is not deleted, with what decides whether it may be deleted:
-- its role, whether it is a tool result, and whether it carries tool calls (a model turn's
-- calls carry its run: found by the run's index).
SELECT m.id, m.seq, m.role, m.run_id, m.content, m.tool_call_ref,
       EXISTS (SELECT 1 FROM {s}.tool_calls tc
               WHERE tc.message_id = m.id
                 AND (CASE WHEN m.run_id IS NULL THEN tc.thread_id = m.thread_id
                           ELSE tc.run_id = m.run_id END)) AS carries_calls
FROM {s}.messages m
WHERE m.id = %(message_id)s AND m.thread_id = %(thread_id)s AND m.deleted_at IS NULL

-- name: delete_message
-- Mark a message deleted: hidden from the API and from every later replay, kept here.
UPDATE {s}.messages SET deleted_at = now()
WHERE id = %(message_id)s AND thread_id = %(thread_id)s AND deleted_at IS NULL
RETURNING deleted_at
