-- name: create_jobs
-- The raw baseline's queue: a job table with a partial index of ready rows, like ours.
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE {s}.jobs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status     text NOT NULL DEFAULT 'ready',
    payload    jsonb NOT NULL DEFAULT '{}'::jsonb,
    attempts   integer NOT NULL DEFAULT 0,
    locked_at  timestamptz,
    done_at    timestamptz
);
CREATE INDEX jobs_ready ON {s}.jobs (id) WHERE status = 'ready'

-- name: seed_jobs
-- n no-op jobs in one statement.
INSERT INTO {s}.jobs (payload)
SELECT jsonb_build_object('n', i) FROM generate_series(1, %(n)s) AS i

-- name: claim
-- The pattern's ceiling: lock up to n ready rows with SKIP LOCKED and mark them taken.
UPDATE {s}.jobs SET status = 'running', attempts = attempts + 1, locked_at = now()
WHERE id IN (
    SELECT id FROM {s}.jobs WHERE status = 'ready' ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, payload

-- name: complete
-- Complete a claimed batch with one statement.
UPDATE {s}.jobs SET status = 'done', done_at = now() WHERE id = ANY(%(ids)s)
