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
ON CONFLICT (run_id) DO NOTHING

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
-- Delete an assistant; the runs it started keep running, their link is cleared (0022).
DELETE FROM {s}.assistants WHERE id = %(id)s RETURNING id

-- name: update_thread_metadata
-- Replace a thread's metadata (row-level security: the tenant's threads only).
UPDATE {s}.threads SET metadata = %(metadata)s WHERE id = %(id)s AND deleted_at IS NULL
RETURNING id, title, metadata, created_at

-- name: lock_thread
-- Lock a thread that is not deleted (start_run_v1 locks it too: a delete and a start
-- cannot both win), with its active run if any.
SELECT t.id, a.id AS active_run_id, a.status AS active_status
FROM {s}.threads t
LEFT JOIN LATERAL (
    SELECT r.id, r.status FROM {s}.runs r
    WHERE r.thread_id = t.id AND {s}.run_active_v1(r.status)
) a ON true
WHERE t.id = %(id)s AND t.deleted_at IS NULL
FOR UPDATE OF t

-- name: delete_thread
-- Mark a thread deleted: hidden from the API from now on, every row kept.
UPDATE {s}.threads SET deleted_at = now() WHERE id = %(id)s RETURNING deleted_at
