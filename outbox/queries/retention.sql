-- Retention and erasure: the statements outbox.retention runs (the work is done by the SQL
-- functions of sql/retention.sql: retain_v1, archive_partitions_v1, prune_archive_v1,
-- erase_thread_v1; and journal_partitions_v1 of sql/journal.sql).

-- name: policies
-- Every retention policy, the default ('*') first.
SELECT tenant_id, extract(epoch FROM max_age)::float8 AS max_age_s, mode,
       extract(epoch FROM archive_keep)::float8 AS archive_keep_s, updated_by, updated_at
FROM {s}.retention_policies
ORDER BY tenant_id <> '*', tenant_id;

-- name: set_policy
-- Create or replace a tenant's policy (the default: '*').
INSERT INTO {s}.retention_policies AS p (tenant_id, max_age, mode, archive_keep, updated_by)
VALUES (%(tenant_id)s, make_interval(secs => %(max_age_s)s), %(mode)s,
        make_interval(secs => %(archive_keep_s)s), %(actor)s)
ON CONFLICT (tenant_id) DO UPDATE
SET max_age = EXCLUDED.max_age, mode = EXCLUDED.mode, archive_keep = EXCLUDED.archive_keep,
    updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING tenant_id, extract(epoch FROM max_age)::float8 AS max_age_s, mode,
          extract(epoch FROM archive_keep)::float8 AS archive_keep_s, updated_by, updated_at;

-- name: remove_policy
-- Remove a tenant's policy; returns it when there was one.
DELETE FROM {s}.retention_policies WHERE tenant_id = %(tenant_id)s RETURNING tenant_id;

-- name: retain
-- One chunk of retention (retain_v1) from a horizon (NULL: the oldest): what it retained
-- per tenant and mode, and the horizon of the next chunk of the round.
SELECT tenant_id, mode, threads, runs, horizon
FROM {s}.retain_v1(%(limit)s, %(actor)s, %(after)s::timestamptz);

-- name: archive_partitions
-- Make the archive's partitions for today and the days ahead; how many were made.
SELECT {s}.archive_partitions_v1(%(days_ahead)s) AS made;

-- name: sweep_payloads
-- Bodies stored by reference that nothing references any more: up to 1000 looked
-- at, from a random digest on.
SELECT {s}.sweep_payloads_v1(NULL, 1000) AS swept;

-- name: journal_partitions
-- Make the journal's day partitions for today and the days ahead; how many were made.
SELECT {s}.journal_partitions_v1(%(days_ahead)s) AS made;

-- name: prune_archive
-- Drop the archive's days past its keep; the partitions dropped.
SELECT partition FROM {s}.prune_archive_v1(%(actor)s) AS partition;

-- name: erase_thread
-- Erase a thread's content (erase_thread_v1); what was removed.
SELECT {s}.erase_thread_v1(%(tenant_id)s, %(thread_id)s, %(actor)s) AS detail;

-- name: thread_tenant
-- The tenant of a thread, hot or archived (an operator erases without naming it).
SELECT tenant_id FROM {s}.threads WHERE id = %(thread_id)s
UNION ALL
(SELECT tenant_id FROM {s}.archived_runs WHERE thread_id = %(thread_id)s LIMIT 1)
LIMIT 1;

-- name: backlog
-- Threads due to leave the hot tables now, per tenant (what retention run would take).
SELECT t.tenant_id, count(*) AS threads
FROM {s}.threads t
WHERE t.created_at < {s}.retention_cutoff_v1(t.tenant_id)
  AND {s}.thread_idle_v1(t.id, {s}.retention_cutoff_v1(t.tenant_id))
GROUP BY t.tenant_id ORDER BY t.tenant_id;
