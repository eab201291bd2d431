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
