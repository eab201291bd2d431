-- name: get
-- A lane's limits, if it has any.
SELECT scope, name, max_concurrency, rate, updated_at FROM {s}.lanes
WHERE scope = %(scope)s AND name = %(name)s

-- name: set
-- Set a lane's limits. A new or changed rate starts with a full bucket: max(1, rate).
INSERT INTO {s}.lanes AS l (scope, name, max_concurrency, rate, tokens)
VALUES (%(scope)s, %(name)s, %(max_concurrency)s, %(rate)s,
        coalesce(greatest(1, %(rate)s::float8), 0))
ON CONFLICT (scope, name) DO UPDATE
SET max_concurrency = excluded.max_concurrency, rate = excluded.rate,
    tokens = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.tokens
                  ELSE excluded.tokens END,
    refilled_at = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.refilled_at
                       ELSE now() END,
    updated_at = now()
RETURNING scope, name, max_concurrency, rate, updated_at

-- name: clear
-- Remove a lane's limits: its work is claimed as if it had never had any.
DELETE FROM {s}.lanes WHERE scope = %(scope)s AND name = %(name)s RETURNING scope, name

-- name: in_flight
-- Every lane with a limit and what it has in flight now (leased rows), for operators.
SELECT l.scope, l.name, l.max_concurrency, l.rate, l.in_flight, l.claimed_at, l.updated_at
FROM {s}.lane_loads_v1() l
ORDER BY l.scope, l.name
