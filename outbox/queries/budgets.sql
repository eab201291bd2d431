-- Prices, tenants' budgets and the platform's limits (outbox/budgets.py).

-- name: prices
SELECT model, input_per_mtok, cached_input_per_mtok, output_per_mtok, updated_by, updated_at
FROM {s}.model_prices ORDER BY model

-- name: set_price
INSERT INTO {s}.model_prices AS p (model, input_per_mtok, cached_input_per_mtok,
                                   output_per_mtok, updated_by)
VALUES (%(model)s, %(input)s, %(cached_input)s, %(output)s, %(actor)s)
ON CONFLICT (model) DO UPDATE
SET input_per_mtok = excluded.input_per_mtok,
    cached_input_per_mtok = excluded.cached_input_per_mtok,
    output_per_mtok = excluded.output_per_mtok, updated_by = excluded.updated_by,
    updated_at = now()
RETURNING model, input_per_mtok, cached_input_per_mtok, output_per_mtok, updated_by, updated_at

-- name: remove_price
DELETE FROM {s}.model_prices WHERE model = %(model)s RETURNING model

-- name: platform_limits
SELECT max_steps, updated_by, updated_at FROM {s}.platform_limits

-- name: set_platform_limits
INSERT INTO {s}.platform_limits AS l (id, max_steps, updated_by)
VALUES (true, %(max_steps)s, %(actor)s)
ON CONFLICT (id) DO UPDATE
SET max_steps = excluded.max_steps, updated_by = excluded.updated_by, updated_at = now()
RETURNING max_steps, updated_by, updated_at

-- name: run_defaults
-- The defaults of new runs (start_run_v1 takes each one its caller leaves out).
SELECT max_steps, loop_limit, action_timeout_s, updated_by, updated_at FROM {s}.run_defaults

-- name: ensure_run_defaults
-- The row of the defaults, made again with the table's defaults if someone removed it.
INSERT INTO {s}.run_defaults (id) VALUES (true) ON CONFLICT (id) DO NOTHING

-- name: set_run_defaults
-- Change the defaults given (NULL: unchanged) for runs started from now on.
UPDATE {s}.run_defaults
SET max_steps = coalesce(%(max_steps)s::integer, max_steps),
    loop_limit = coalesce(%(loop_limit)s::integer, loop_limit),
    action_timeout_s = coalesce(%(action_timeout_s)s::float8, action_timeout_s),
    updated_by = %(actor)s, updated_at = now()
RETURNING max_steps, loop_limit, action_timeout_s, updated_by, updated_at

-- name: tenant_budgets
-- Tenants' budgets and what they have used (tenants without a budget have no row).
SELECT tenant_id, max_tokens, tokens_used, max_cost, cost_used FROM {s}.tenant_budgets
WHERE tenant_id = ANY(%(tenant_ids)s)

-- name: set_tenant_budget
-- Set (or change) a tenant's budget in tokens and in money (NULL: no limit of that kind).
INSERT INTO {s}.tenant_budgets (tenant_id, max_tokens, max_cost)
VALUES (%(tenant_id)s, %(max_tokens)s, %(max_cost)s)
ON CONFLICT (tenant_id) DO UPDATE
SET max_tokens = excluded.max_tokens, max_cost = excluded.max_cost, updated_at = now()
RETURNING tenant_id, max_tokens, tokens_used, max_cost, cost_used

-- name: platform_max_steps
-- The platform's step ceiling over every run (NULL: none).
SELECT (SELECT max_steps FROM {s}.platform_limits) AS max_steps
