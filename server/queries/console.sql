-- name: run_state
-- The tenant and status of a run, and the trace context it continues (under row-level
-- security: none for another tenant's; as the pool's own login, for a platform operator,
-- every tenant's).
SELECT tenant_id, status, traceparent, tracestate FROM {s}.runs WHERE id = %(run_id)s

-- name: runs_page
-- One page of runs, newest first, optionally of one tenant, status and model, created
-- since a time, that called a tool, whose thread's metadata holds some keys and values.
-- Keyset-paginated: the page after the one that ended at (before_at, before_id) holds the
-- rows below that key, so a page costs its own rows, however deep (a rare tool or metadata
-- costs the runs read until a page is found). LIMIT NULL: every run that matches (the
-- count and its estimate). The last condition holds for every run: it is the predicate of
-- runs_tenant_created.
SELECT id, tenant_id, status, model, step_count, tokens_used, failure_reason, created_at,
       updated_at
FROM {s}.runs
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(model)s::text IS NULL OR model = %(model)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(tool)s::text IS NULL OR EXISTS (
          SELECT 1 FROM {s}.tool_calls tc WHERE tc.run_id = runs.id AND tc.tool_name = %(tool)s))
  AND (%(metadata)s::jsonb IS NULL OR EXISTS (
          SELECT 1 FROM {s}.threads t
          WHERE t.id = runs.thread_id AND t.metadata @> %(metadata)s::jsonb))
  AND (%(before_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
  AND created_at > '-infinity'
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: parked_calls
-- Tool calls parked for an operator, oldest first: quarantined (no worker claims them until
-- released) or outcome_unknown (the relay cannot tell whether the tool acted); of one
-- tenant, tool and status when given.
SELECT tc.id, tc.tenant_id, tc.run_id, tc.tool_call_id, tc.tool_name, tc.status, tc.attempts,
       tc.last_error, tc.updated_at
FROM {s}.tool_calls tc
WHERE tc.status IN ('quarantined', 'outcome_unknown')
  AND (%(tenant_id)s::text IS NULL OR tc.tenant_id = %(tenant_id)s)
  AND (%(tool)s::text IS NULL OR tc.tool_name = %(tool)s)
  AND (%(status)s::text IS NULL OR tc.status = %(status)s)
ORDER BY tc.id
LIMIT %(limit)s

-- name: call_tenant
-- The tenant of a tool call (under row-level security: none for another tenant's).
SELECT tenant_id FROM {s}.tool_calls WHERE id = %(id)s

-- name: parked_chunk
-- The next chunk of a bulk action on parked calls: the calls in %(wanted)s (quarantined for
-- a requeue or a release, outcome_unknown for a reconcile) and in the list's filters, among
-- the selected ones (NULL: all), above the last reference done, in order, so each is taken
-- once. LIMIT NULL and %(after)s 0: every one of them (the count to confirm).
SELECT tc.id FROM {s}.tool_calls tc
WHERE tc.status = %(wanted)s AND tc.id > %(after)s
  AND (%(status)s::text IS NULL OR tc.status = %(status)s)
  AND (%(ids)s::bigint[] IS NULL OR tc.id = ANY(%(ids)s))
  AND (%(tenant_id)s::text IS NULL OR tc.tenant_id = %(tenant_id)s)
  AND (%(tool)s::text IS NULL OR tc.tool_name = %(tool)s)
ORDER BY tc.id
LIMIT %(limit)s

-- name: approval_context
-- The turns that led to each of these calls: the last %(messages)s messages of the call's
-- thread up to the assistant message that asked for it (no system prompt, no deleted
-- message), each cut to %(chars)s characters, oldest first. Each thread is read through
-- messages_thread_seq_key from the asking message down, however long the thread.
SELECT tc.id AS tool_call_ref, ctx.seq, ctx.role, ctx.content
FROM {s}.tool_calls tc
JOIN {s}.messages asked ON asked.id = tc.message_id
CROSS JOIN LATERAL (
    SELECT m.seq, m.role,
           left({s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref), %(chars)s) AS content
    FROM {s}.messages m
    WHERE m.thread_id = asked.thread_id AND m.seq <= asked.seq
      AND m.role <> 'system' AND m.deleted_at IS NULL
    ORDER BY m.seq DESC
    LIMIT %(messages)s
) ctx
WHERE tc.id = ANY(%(refs)s)
ORDER BY tc.id, ctx.seq

-- name: stuck_runs
-- The runs that cannot move on and why (views.sql's stuck_runs), of one tenant or of every
-- tenant, stuck longest first.
SELECT run_id, tenant_id, status, reason, since, stuck_for, detail
FROM {s}.stuck_runs
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
ORDER BY since NULLS LAST
LIMIT %(limit)s

-- name: queue_health
-- The queue per tenant and kind of work (views.sql's queue_lag): due, delayed, in flight,
-- quarantined, expired leases and the oldest due row's lag.
SELECT tenant_id, kind, due, delayed, in_flight, quarantined, expired_leases, lag_s
FROM {s}.queue_lag
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
ORDER BY tenant_id, kind

-- name: tenant_budgets
-- The tenants' budgets and what their runs used of them.
SELECT tenant_id, max_tokens, tokens_used, max_cost, cost_used, updated_at
FROM {s}.tenant_budgets
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
ORDER BY tenant_id

-- name: active_runs_count
-- How many of these runs are active (a bulk cancel's count to confirm).
SELECT count(*) AS n FROM {s}.runs WHERE id = ANY(%(ids)s) AND status = ANY(%(active)s)

-- name: active_runs_of
-- The active runs among these ids, in the order of their ids (a chunk of a bulk cancel).
SELECT id, tenant_id, status FROM {s}.runs
WHERE id = ANY(%(ids)s) AND status = ANY(%(active)s)
ORDER BY id
