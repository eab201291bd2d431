-- The action layer's statements (outbox/policy.py, outbox/approvals.py): risk policies,
-- kill switches, paused tenants and approvals. Each runs in the caller's transaction.

-- name: policies
-- Every risk policy: the default ('*') and each tenant's own rows.
SELECT tenant_id, risk_tier, action, approvers,
       extract(epoch FROM approval_timeout)::float8 AS approval_timeout_s,
       updated_by, updated_at
FROM {s}.risk_policies
ORDER BY tenant_id = '*' DESC, tenant_id,
         array_position(ARRAY['low', 'medium', 'high'], risk_tier)

-- name: set_policy
-- Set what a tenant's (or the default's) calls of one risk tier do.
INSERT INTO {s}.risk_policies AS p (tenant_id, risk_tier, action, approvers, approval_timeout,
                                    updated_by)
VALUES (%(tenant_id)s, %(risk_tier)s, %(action)s, %(approvers)s,
        make_interval(secs => %(approval_timeout_s)s), %(actor)s)
ON CONFLICT (tenant_id, risk_tier) DO UPDATE
SET action = excluded.action, approvers = excluded.approvers,
    approval_timeout = excluded.approval_timeout, updated_by = excluded.updated_by,
    updated_at = now()
RETURNING tenant_id, risk_tier, action, approvers,
          extract(epoch FROM approval_timeout)::float8 AS approval_timeout_s, updated_by,
          updated_at

-- name: clear_policy
-- Remove a tenant's own rule for a tier: the default ('*') applies again.
DELETE FROM {s}.risk_policies WHERE tenant_id = %(tenant_id)s AND risk_tier = %(risk_tier)s
RETURNING tenant_id, risk_tier

-- name: tool_visible
-- Whether a tool of this name is registered for the tenant or for every tenant.
SELECT EXISTS (SELECT 1 FROM {s}.tools
               WHERE name = %(name)s
                 AND (tenant_id IN (%(tenant_id)s, '*') OR %(tenant_id)s = '*')) AS found

-- name: switch_off
-- Turn a tool off for one tenant or for every tenant ('*'). Turning it off again keeps the
-- first record of who did it.
INSERT INTO {s}.tool_switches (tenant_id, tool_name, switched_by, reason)
VALUES (%(tenant_id)s, %(name)s, %(actor)s, %(reason)s)
ON CONFLICT (tool_name, tenant_id) DO NOTHING
RETURNING tenant_id, tool_name, switched_by, reason, switched_at

-- name: switch_on
-- Turn a tool back on for the scope it was turned off in.
DELETE FROM {s}.tool_switches WHERE tenant_id = %(tenant_id)s AND tool_name = %(name)s
RETURNING tenant_id, tool_name

-- name: enable_versions
-- Versions registered disabled (--disabled) in this scope become usable.
UPDATE {s}.tools SET enabled = true
WHERE name = %(name)s AND tenant_id = %(tenant_id)s AND NOT enabled
RETURNING version

-- name: switches
-- Every tool switched off.
SELECT tenant_id, tool_name, switched_by, reason, switched_at
FROM {s}.tool_switches ORDER BY tool_name, tenant_id

-- name: pause
-- Pause a tenant: the relay claims none of its rows until it is resumed.
INSERT INTO {s}.tenant_pauses (tenant_id, paused_by, reason)
VALUES (%(tenant_id)s, %(actor)s, %(reason)s)
ON CONFLICT (tenant_id) DO NOTHING
RETURNING tenant_id, paused_by, reason, paused_at

-- name: resume
DELETE FROM {s}.tenant_pauses WHERE tenant_id = %(tenant_id)s
RETURNING tenant_id, paused_by, paused_at

-- name: pauses
SELECT tenant_id, paused_by, reason, paused_at FROM {s}.tenant_pauses ORDER BY tenant_id

-- name: approvals
-- Approvals of one status (or every status), oldest first, with the call's arguments.
SELECT a.id, a.tenant_id, a.run_id, a.thread_id, a.batch_id, a.tool_call_ref, a.tool_call_id,
       a.tool_name, {s}.resolved_json_v1(tc.arguments, tc.tenant_id, tc.arguments_ref) AS arguments,
       a.arguments_digest, a.rule, a.approvers, a.deadline,
       a.status, a.decided_by, a.decided_at, a.reason, a.created_at
FROM {s}.approvals a
JOIN {s}.tool_calls tc ON tc.id = a.tool_call_ref
WHERE (%(status)s::text IS NULL OR a.status = %(status)s)
  AND (%(tenant_id)s::text IS NULL OR a.tenant_id = %(tenant_id)s)
ORDER BY a.id
LIMIT %(limit)s

-- name: approval
SELECT a.id, a.tenant_id, a.run_id, a.thread_id, a.batch_id, a.tool_call_ref, a.tool_call_id,
       a.tool_name, {s}.resolved_json_v1(tc.arguments, tc.tenant_id, tc.arguments_ref) AS arguments,
       a.arguments_digest, a.rule, a.approvers, a.deadline,
       a.status, a.decided_by, a.decided_at, a.reason, a.created_at
FROM {s}.approvals a
JOIN {s}.tool_calls tc ON tc.id = a.tool_call_ref
WHERE a.id = %(id)s

-- name: decide
SELECT * FROM {s}.decide_approval_v1(%(tenant_id)s, %(id)s, %(decision)s, %(actor)s,
                                     %(reason)s, %(digest)s)

-- name: expire_approvals
-- Deny what nobody decided in time: pending approvals past their deadline, and those of
-- runs that ended meanwhile. The call's row becomes due and the relay answers it with the
-- denial (a run that ended drops it). Skips approvals a decision holds right now.
WITH due AS (
    SELECT a.id, {s}.run_ended_v1(r.status) AS run_ended
    FROM {s}.approvals a
    JOIN {s}.runs r ON r.id = a.run_id
    WHERE a.status = 'pending' AND (a.deadline <= now() OR {s}.run_ended_v1(r.status))
    ORDER BY a.deadline
    LIMIT %(limit)s
    FOR UPDATE OF a SKIP LOCKED
), expired AS (
    UPDATE {s}.approvals a
    SET status = 'expired', decided_by = 'deadline', decided_at = now(),
        reason = CASE WHEN due.run_ended THEN 'the run ended before a decision'
                      ELSE 'no decision before the deadline' END
    FROM due WHERE a.id = due.id
    RETURNING a.*
), waiting_calls AS (
    UPDATE {s}.tool_calls tc SET status = 'pending', updated_at = now()
    FROM expired e WHERE tc.id = e.tool_call_ref AND tc.status = 'awaiting_approval'
), released AS (
    UPDATE {s}.outbox o SET available_at = now()
    FROM expired e
    WHERE o.tool_call_ref = e.tool_call_ref AND o.kind = 'tool_call' AND o.status = 'ready'
      AND o.available_at = 'infinity'
), journaled AS (
    INSERT INTO {s}.journal (tenant_id, thread_id, run_id, batch_id, tool_call_ref,
                             tool_call_id, correlation_id, worker, event, actor, detail)
    SELECT e.tenant_id, e.thread_id, e.run_id, e.batch_id, e.tool_call_ref, e.tool_call_id,
           r.correlation_id, %(worker)s, 'approval.expired', 'deadline',
           jsonb_build_object('approval_id', e.id, 'tool', e.tool_name,
                              'deadline', e.deadline, 'reason', e.reason, 'rule', e.rule)
    FROM expired e JOIN {s}.runs r ON r.id = e.run_id
)
SELECT e.id, e.tenant_id, e.thread_id, e.run_id, e.batch_id, e.tool_call_ref, e.tool_call_id,
       e.tool_name, e.reason, r.correlation_id
FROM expired e JOIN {s}.runs r ON r.id = e.run_id

-- name: approvals_of_run
-- A run's calls waiting for a reviewer.
SELECT a.id, a.tool_call_id, a.tool_name, {s}.resolved_json_v1(tc.arguments, tc.tenant_id, tc.arguments_ref) AS arguments,
       a.arguments_digest, a.rule,
       a.approvers, a.deadline
FROM {s}.approvals a
JOIN {s}.tool_calls tc ON tc.id = a.tool_call_ref
WHERE a.run_id = %(run_id)s AND a.status = 'pending'
ORDER BY a.id
