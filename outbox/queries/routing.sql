-- Model fallbacks, circuits and routing rules, as operators set them (outbox/routing.py,
-- `outbox models`).

-- name: set_fallback
-- Set (or replace) a model's fallback.
INSERT INTO {s}.model_fallbacks (model, to_model, to_base_url, to_api, after_attempts)
VALUES (%(model)s, %(to_model)s, %(to_base_url)s, %(to_api)s, %(after_attempts)s)
ON CONFLICT (model) DO UPDATE
SET to_model = EXCLUDED.to_model, to_base_url = EXCLUDED.to_base_url,
    to_api = EXCLUDED.to_api, after_attempts = EXCLUDED.after_attempts,
    updated_by = SESSION_USER, updated_at = now()
RETURNING *

-- name: remove_fallback
-- A model without a fallback again.
DELETE FROM {s}.model_fallbacks WHERE model = %(model)s RETURNING model

-- name: fallbacks
-- Every model's fallback.
SELECT * FROM {s}.model_fallbacks ORDER BY model

-- name: circuits
-- Every base URL's circuit; wait_s: seconds until an open one may be probed.
SELECT base_url, state, failures, first_failure_at, opened_at, probe_at, open_after, window_s,
       cool_down_s, probe_timeout_s, updated_at,
       CASE WHEN state = 'open'
            THEN greatest(0, extract(epoch FROM opened_at
                                     + make_interval(secs => cool_down_s) - now()))::float8
       END AS wait_s
FROM {s}.model_circuits ORDER BY base_url

-- name: set_circuit
-- A base URL's circuit settings (NULL: kept, or the default); close: closed now.
INSERT INTO {s}.model_circuits AS c (base_url, open_after, window_s, cool_down_s,
                                     probe_timeout_s)
VALUES (%(base_url)s, coalesce(%(open_after)s::integer, 5), coalesce(%(window_s)s::float8, 10),
        coalesce(%(cool_down_s)s::float8, 5), coalesce(%(probe_timeout_s)s::float8, 150))
ON CONFLICT (base_url) DO UPDATE
SET open_after = coalesce(%(open_after)s::integer, c.open_after),
    window_s = coalesce(%(window_s)s::float8, c.window_s),
    cool_down_s = coalesce(%(cool_down_s)s::float8, c.cool_down_s),
    probe_timeout_s = coalesce(%(probe_timeout_s)s::float8, c.probe_timeout_s),
    state = CASE WHEN %(close)s THEN 'closed' ELSE c.state END,
    failures = CASE WHEN %(close)s THEN 0 ELSE c.failures END,
    first_failure_at = CASE WHEN %(close)s THEN NULL ELSE c.first_failure_at END,
    probe_at = CASE WHEN %(close)s THEN NULL ELSE c.probe_at END,
    updated_at = now()
RETURNING *

-- name: add_routes
-- A tenant's next version of routing rules.
INSERT INTO {s}.model_routes (tenant_id, version, rules)
SELECT %(tenant_id)s, coalesce(max(version), 0) + 1, %(rules)s
FROM {s}.model_routes WHERE tenant_id = %(tenant_id)s
RETURNING *

-- name: routes
-- Each tenant's newest rules, or every version of one tenant's.
SELECT tenant_id, version, rules, created_by, created_at FROM {s}.model_routes mr
WHERE CASE WHEN %(tenant_id)s::text IS NULL
           THEN version = (SELECT max(m2.version) FROM {s}.model_routes m2
                           WHERE m2.tenant_id = mr.tenant_id)
           ELSE tenant_id = %(tenant_id)s END
ORDER BY tenant_id, version
