-- The model catalogue and the prompt budgets (outbox.context).

-- name: models
SELECT c.model, c.context_window, c.max_output_tokens, c.prompt_cache_key,
       p.input_per_mtok, p.cached_input_per_mtok, p.output_per_mtok, c.updated_by
FROM {s}.model_catalogue c
LEFT JOIN {s}.model_prices p ON p.model = c.model
ORDER BY c.model

-- name: set_model
INSERT INTO {s}.model_catalogue AS c (model, context_window, max_output_tokens,
                                       prompt_cache_key, updated_by)
VALUES (%(model)s, %(context_window)s, %(max_output)s, %(prompt_cache_key)s, %(actor)s)
ON CONFLICT (model) DO UPDATE
SET context_window = excluded.context_window, max_output_tokens = excluded.max_output_tokens,
    prompt_cache_key = excluded.prompt_cache_key,
    updated_by = excluded.updated_by, updated_at = now()
RETURNING model, context_window, max_output_tokens, prompt_cache_key, updated_by, updated_at

-- name: remove_model
DELETE FROM {s}.model_catalogue WHERE model = %(model)s RETURNING model

-- name: ensure_run_defaults
INSERT INTO {s}.run_defaults (id) VALUES (true) ON CONFLICT (id) DO NOTHING

-- name: set_platform_prompt_budget
UPDATE {s}.run_defaults SET max_prompt_tokens = %(tokens)s, updated_by = %(actor)s,
    updated_at = now()
RETURNING max_prompt_tokens

-- name: set_tenant_prompt_budget
INSERT INTO {s}.tenant_budgets AS b (tenant_id, tokens_used, max_prompt_tokens)
VALUES (%(tenant_id)s, 0, %(tokens)s)
ON CONFLICT (tenant_id) DO UPDATE
SET max_prompt_tokens = excluded.max_prompt_tokens, updated_at = now()
RETURNING tenant_id, max_prompt_tokens

-- name: clear_tenant_prompt_budget
WITH kept AS (
    UPDATE {s}.tenant_budgets SET max_prompt_tokens = NULL, updated_at = now()
    WHERE tenant_id = %(tenant_id)s AND (max_tokens IS NOT NULL OR max_cost IS NOT NULL)
    RETURNING tenant_id)
DELETE FROM {s}.tenant_budgets
WHERE tenant_id = %(tenant_id)s AND max_tokens IS NULL AND max_cost IS NULL

-- name: compactions
SELECT run_id, step_no, through_seq, tokens_before, tokens_after, input_tokens,
       output_tokens, summary, created_at
FROM {s}.compactions WHERE thread_id = %(thread_id)s ORDER BY through_seq, id

-- name: record_compactions
-- The summaries of the turns a completer records, once per (run, step): a turn attempted
-- again after a crash records the first one that reached the database.
INSERT INTO {s}.compactions (tenant_id, thread_id, run_id, step_no, through_seq, summary,
                             tokens_before, tokens_after, input_tokens, output_tokens)
SELECT c.tenant_id, c.thread_id, c.run_id, c.step_no, c.through_seq, c.summary,
       c.tokens_before, c.tokens_after, c.input_tokens, c.output_tokens
FROM jsonb_to_recordset(%(compactions)s) AS c(tenant_id text, thread_id uuid, run_id uuid,
     step_no integer, through_seq bigint, summary text, tokens_before integer,
     tokens_after integer, input_tokens integer, output_tokens integer)
ON CONFLICT ON CONSTRAINT compactions_one_per_step DO NOTHING
RETURNING tenant_id, thread_id, run_id, step_no, through_seq, tokens_before, tokens_after
