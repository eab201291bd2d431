-- 0016: the action layer (issue 17): risk policies, approvals, kill switches that act,
-- tenants paused between steps. Frozen: what revision 0016 applies, forever.

-- What a tenant's calls of each risk tier do: run (allow), wait for a decision (approve)
-- or never run (deny). Tenant '*' is the default of every tenant without a row of its own.
CREATE TABLE {s}.risk_policies (
    tenant_id        text NOT NULL CHECK (tenant_id <> ''),
    risk_tier        text NOT NULL CHECK (risk_tier IN ('low', 'medium', 'high')),
    action           text NOT NULL CHECK (action IN ('allow', 'approve', 'deny')),
    approvers        text[] NOT NULL DEFAULT '{}',
    approval_timeout interval NOT NULL DEFAULT interval '24 hours'
                     CHECK (approval_timeout > interval '0'),
    updated_by       text NOT NULL DEFAULT session_user,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, risk_tier)
);
COMMENT ON TABLE {s}.risk_policies IS
    'per tenant and risk tier, what a tool call does when it is recorded: allow, approve '
    '(wait for a decision of one of approvers, empty: any operator, within approval_timeout) '
    'or deny; tenant ''*'' is the default';
INSERT INTO {s}.risk_policies (tenant_id, risk_tier, action, updated_by) VALUES
    ('*', 'low', 'allow', 'migration 0016'),
    ('*', 'medium', 'allow', 'migration 0016'),
    ('*', 'high', 'approve', 'migration 0016');

-- A tool may require approval whatever its tier's policy says.
ALTER TABLE {s}.tools ADD COLUMN requires_approval boolean NOT NULL DEFAULT false;

-- A call waiting for a decision.
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_status_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_status_check CHECK (status IN
    ('pending', 'running', 'succeeded', 'failed', 'outcome_unknown', 'quarantined',
     'cancelled', 'awaiting_approval'));

-- One approval per call, bound to the digest of its exact arguments. Its outbox row waits
-- with available_at = 'infinity' until the approval is decided; the decision (approve,
-- deny, or the deadline) makes it due once, and the relay runs it or answers it with the
-- denial, never both and never twice.
CREATE TABLE {s}.approvals (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        text NOT NULL,
    run_id           uuid NOT NULL,
    thread_id        uuid NOT NULL,
    batch_id         bigint NOT NULL,
    tool_call_ref    bigint NOT NULL,
    tool_call_id     text NOT NULL,
    tool_name        text NOT NULL,
    arguments_digest text NOT NULL,
    rule             text NOT NULL,
    approvers        text[] NOT NULL DEFAULT '{}',
    deadline         timestamptz NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    decided_by       text,
    decided_at       timestamptz,
    reason           text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT approvals_one_per_call UNIQUE (tool_call_ref),
    CONSTRAINT approvals_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    CONSTRAINT approvals_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
        REFERENCES {s}.tool_calls (id, tenant_id),
    CONSTRAINT approvals_decided_when_not_pending CHECK
        ((status = 'pending') = (decided_at IS NULL))
);
COMMENT ON TABLE {s}.approvals IS
    'a tool call that waits for a decision: bound to the digest of its arguments, decided '
    'once (approved, denied, or expired at its deadline)';
CREATE INDEX approvals_pending ON {s}.approvals (deadline) WHERE status = 'pending';
CREATE INDEX approvals_run ON {s}.approvals (run_id);
ALTER TABLE {s}.approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.approvals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.approvals TO PUBLIC
    USING (tenant_id = current_setting('outbox.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('outbox.tenant_id', true));
CREATE POLICY all_tenants ON {s}.approvals TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.approvals FOR SELECT TO outbox_auditor USING (true);

-- Kill switches: a tool off for one tenant or for every tenant ('*'). Calls not yet
-- dispatched get a "tool disabled" error result instead of running.
CREATE TABLE {s}.tool_switches (
    tenant_id   text NOT NULL CHECK (tenant_id <> ''),
    tool_name   text NOT NULL,
    switched_by text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    switched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tool_name, tenant_id)
);
COMMENT ON TABLE {s}.tool_switches IS
    'tools switched off, for one tenant or every tenant (''*''): calls not yet dispatched '
    'are answered "tool disabled" instead of running';

-- A paused tenant: the relay claims none of its rows, so its runs hold between steps.
CREATE TABLE {s}.tenant_pauses (
    tenant_id text PRIMARY KEY CHECK (tenant_id <> ''),
    paused_by text NOT NULL,
    reason    text NOT NULL DEFAULT '',
    paused_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE {s}.tenant_pauses IS
    'tenants whose work the relay does not claim: effects in flight finish, nothing new starts';

GRANT SELECT ON {s}.risk_policies, {s}.tool_switches, {s}.tenant_pauses
    TO outbox_writer, outbox_relay, outbox_auditor;
-- A tenant's session sees its own rules and the shared ones ('*'), as with tools; only
-- the owner (the operator's CLI) changes them.
ALTER TABLE {s}.risk_policies ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.risk_policies FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.risk_policies TO PUBLIC
    USING (tenant_id IN (current_setting('outbox.tenant_id', true), '*'))
    WITH CHECK (tenant_id = current_setting('outbox.tenant_id', true));
CREATE POLICY all_tenants ON {s}.risk_policies TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.risk_policies FOR SELECT TO outbox_auditor USING (true);
ALTER TABLE {s}.tool_switches ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.tool_switches FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.tool_switches TO PUBLIC
    USING (tenant_id IN (current_setting('outbox.tenant_id', true), '*'))
    WITH CHECK (tenant_id = current_setting('outbox.tenant_id', true));
CREATE POLICY all_tenants ON {s}.tool_switches TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.tool_switches FOR SELECT TO outbox_auditor USING (true);
ALTER TABLE {s}.tenant_pauses ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.tenant_pauses FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.tenant_pauses TO PUBLIC
    USING (tenant_id = current_setting('outbox.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('outbox.tenant_id', true));
CREATE POLICY all_tenants ON {s}.tenant_pauses TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.tenant_pauses FOR SELECT TO outbox_auditor USING (true);
GRANT SELECT, INSERT ON {s}.approvals TO outbox_writer;
GRANT SELECT, INSERT, UPDATE ON {s}.approvals TO outbox_relay;
GRANT SELECT ON {s}.approvals TO outbox_auditor;

-- decide_approval_v1: approve or deny a tool call that waits for approval.
--
-- Answers: "a reviewer looked at this call's arguments and decided".
--
--   SELECT * FROM outbox.decide_approval_v1('tenant-a', 42, 'approve', 'alice');
--   SELECT * FROM outbox.decide_approval_v1('tenant-a', 42, 'deny', 'alice',
--       'refunds over 500 EUR need a manager', 'sha256:…');
--
-- Returns the approval as decided. Guarantees:
--   * decided once: a second decision, whatever it is, is refused (55000) naming the first;
--     an approval never turns into two executions (the call has one outbox row, made due
--     here once);
--   * bound to the arguments: p_digest, when given, must be the digest the approval was
--     requested for (the reviewer saw those arguments), else 22023 and nothing changes;
--   * only a listed approver decides when the policy lists approvers (OB006 otherwise);
--   * past the deadline, or once the run ended, nothing is decided (55000): the relay's
--     sweep denies the call;
--   * journaled as approval.approved or approval.denied with the decider as actor.
-- The relay claims the call within its poll interval (an UPDATE sends no NOTIFY).
-- Runs as the schema owner (SECURITY DEFINER); it acts only for the tenant the transaction
-- is scoped to (outbox.enter_tenant_v1): an unscoped session is refused (42501).
CREATE OR REPLACE FUNCTION {s}.decide_approval_v1(
    p_tenant_id text, p_approval_id bigint, p_decision text, p_decider text,
    p_reason text DEFAULT '', p_digest text DEFAULT NULL
) RETURNS SETOF {s}.approvals
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_scope    text := nullif(current_setting('outbox.tenant_id', true), '');
    v_approval {s}.approvals;
    v_run      {s}.runs;
BEGIN
    IF v_scope IS NULL THEN
        RAISE EXCEPTION 'decide_approval_v1 acts for the tenant this transaction is scoped to, and it has none'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('call outbox.enter_tenant_v1(%L) first in this transaction',
                                p_tenant_id);
    END IF;
    IF v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_decision IS NULL OR p_decision NOT IN ('approve', 'deny') THEN
        RAISE EXCEPTION 'the decision must be ''approve'' or ''deny'', got %', p_decision
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(p_decider, '') = '' THEN
        RAISE EXCEPTION 'a decision needs the decider''s identity'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_approval FROM {s}.approvals WHERE id = p_approval_id;
    IF NOT FOUND OR v_approval.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'approval % does not exist for tenant %', p_approval_id, p_tenant_id
            USING ERRCODE = 'no_data_found', HINT = 'outbox approvals list shows the pending ones';
    END IF;
    -- The run first, then the approval: the lock order of every writer path.
    SELECT * INTO v_run FROM {s}.runs WHERE id = v_approval.run_id FOR UPDATE;
    SELECT * INTO v_approval FROM {s}.approvals WHERE id = p_approval_id FOR UPDATE;
    IF v_run.status IN ('completed', 'failed', 'cancelled', 'expired') THEN
        RAISE EXCEPTION 'approval % is for run %, which is %: nothing to decide',
            p_approval_id, v_run.id, v_run.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_approval.status <> 'pending' THEN
        RAISE EXCEPTION 'approval % was already decided: % by % at %', p_approval_id,
            v_approval.status, v_approval.decided_by, v_approval.decided_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF p_digest IS NOT NULL AND p_digest <> v_approval.arguments_digest THEN
        RAISE EXCEPTION 'approval % is for arguments with digest %, not %', p_approval_id,
            v_approval.arguments_digest, p_digest
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'show the approval again and decide on the arguments it holds';
    END IF;
    IF cardinality(v_approval.approvers) > 0 AND NOT p_decider = ANY(v_approval.approvers) THEN
        RAISE EXCEPTION '% may not decide approval %: its approvers are %', p_decider,
            p_approval_id, v_approval.approvers
            USING ERRCODE = 'OB006', HINT = 'ask one of the approvers the policy lists';
    END IF;
    IF v_approval.deadline <= now() THEN
        RAISE EXCEPTION 'approval % passed its deadline at %: the call will be denied',
            p_approval_id, v_approval.deadline
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE {s}.approvals
    SET status = CASE p_decision WHEN 'approve' THEN 'approved' ELSE 'denied' END,
        decided_by = p_decider, decided_at = now(), reason = nullif(p_reason, '')
    WHERE id = p_approval_id
    RETURNING * INTO v_approval;
    UPDATE {s}.tool_calls SET status = 'pending', updated_at = now()
    WHERE id = v_approval.tool_call_ref AND status = 'awaiting_approval';
    -- The call's row becomes due: the relay runs it, or answers it with the denial.
    UPDATE {s}.outbox SET available_at = now()
    WHERE tool_call_ref = v_approval.tool_call_ref AND kind = 'tool_call'
      AND status = 'ready' AND available_at = 'infinity';
    INSERT INTO {s}.journal (tenant_id, thread_id, run_id, batch_id, tool_call_ref,
                             tool_call_id, correlation_id, event, actor, detail)
    VALUES (v_approval.tenant_id, v_approval.thread_id, v_approval.run_id,
            v_approval.batch_id, v_approval.tool_call_ref, v_approval.tool_call_id,
            v_run.correlation_id, 'approval.' || v_approval.status, p_decider,
            jsonb_build_object('approval_id', v_approval.id, 'tool', v_approval.tool_name,
                               'arguments_digest', v_approval.arguments_digest,
                               'reason', v_approval.reason, 'rule', v_approval.rule));
    RETURN NEXT v_approval;
END $$;
REVOKE ALL ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.decide_approval_v1(text, bigint, text, text, text, text)
    TO outbox_writer;

-- A call waiting for approval is closed like a pending one when its run ends: its tool
-- message says it was not executed (the relay's sweep then expires the approval).
-- end_run_v1: end a run (failed, cancelled or expired) and keep its thread replayable.
--
-- The one implementation of ending a run: the Python writer (writer.end_run: the relay's
-- step cap, budget, loop and expiry) and cancel_run_v1 call it. Every batch whose outputs
-- did not reach the history is closed and each of its calls gets a tool message at once
-- (its result, or an error that claims no more than is known, as answer_calls); rows nobody
-- holds a lease on leave the outbox (no new claims); work in flight finishes and its
-- results land in orphaned_results. Journals batch.closed per batch and run.<status>.
-- Locks the run, then its batches. Not for backends (EXECUTE: the relay role).
CREATE OR REPLACE FUNCTION {s}.end_run_v1(
    p_run_id uuid, p_status text, p_reason text, p_error text DEFAULT NULL,
    p_actor text DEFAULT NULL
) RETURNS {s}.runs
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run     {s}.runs;
    v_batch   {s}.tool_batches;
    v_why     text := format('the run was %s (%s)', p_status, p_reason);
    v_closed  integer := 0;
    v_answers integer;
    v_dropped jsonb;
BEGIN
    IF p_status NOT IN ('failed', 'cancelled', 'expired') THEN
        RAISE EXCEPTION 'a run ends failed, cancelled or expired, not %', quote_nullable(p_status)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_batch IN SELECT * FROM {s}.tool_batches
                   WHERE run_id = p_run_id AND status IN ('open', 'complete')
                   ORDER BY id FOR UPDATE LOOP
        UPDATE {s}.tool_batches
        SET status = CASE WHEN p_status = 'expired' THEN 'expired' ELSE 'cancelled' END
        WHERE id = v_batch.id;
        UPDATE {s}.tool_calls SET status = 'cancelled', updated_at = now()
        WHERE batch_id = v_batch.id
          AND status IN ('pending', 'quarantined', 'awaiting_approval');
        -- A tool message for every call of the batch that has none, in call order (the
        -- statement of answer_calls in outbox/queries/writer.sql, for one batch).
        WITH answers AS (
            SELECT tc.tenant_id, tc.thread_id, tc.run_id, tc.position, tc.id AS ref,
                   CASE WHEN r.status = 'ok' AND jsonb_typeof(r.output) = 'string'
                            THEN r.output #>> '{}'
                        WHEN r.status = 'ok' THEN coalesce(r.output::text, 'null')
                        WHEN r.status = 'error' THEN jsonb_build_object('error', r.error)::text
                        WHEN tc.executor = 'client' THEN jsonb_build_object(
                            'error', 'no output: ' || v_why
                                     || ' before an output of this call was submitted')::text
                        WHEN tc.attempts > 0 OR tc.dispatched_attempt IS NOT NULL
                             OR EXISTS (SELECT 1 FROM {s}.outbox o
                                        WHERE o.dedup_key = 'tool_call:' || tc.id
                                          AND o.attempts > 0
                                        OFFSET 0)
                            THEN jsonb_build_object(
                            'error', 'outcome unknown: ' || v_why
                                     || ' while an attempt of this call may have been under'
                                     || ' way; it may have taken effect, and a result that'
                                     || ' arrives later is kept out of this conversation')::text
                        ELSE jsonb_build_object('error', 'not executed: ' || v_why)::text
                   END AS content
            FROM {s}.tool_calls tc
            LEFT JOIN {s}.tool_results r ON r.tool_call_ref = tc.id
            WHERE tc.batch_id = v_batch.id
              AND NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.tool_call_ref = tc.id)
        ), numbered AS (
            SELECT a.*, count(*) OVER () AS n, row_number() OVER (ORDER BY a.position) AS k
            FROM answers a
        ), seqs AS (
            UPDATE {s}.threads t SET next_seq = t.next_seq + w.n
            FROM (SELECT DISTINCT n FROM numbered) w
            WHERE t.id = v_batch.thread_id
            RETURNING t.next_seq - w.n AS first_seq
        )
        INSERT INTO {s}.messages (tenant_id, thread_id, seq, role, content, run_id, tool_call_ref)
        SELECT m.tenant_id, m.thread_id, s.first_seq + m.k - 1, 'tool', m.content, m.run_id, m.ref
        FROM numbered m CROSS JOIN seqs s
        ORDER BY m.k;
        GET DIAGNOSTICS v_answers = ROW_COUNT;
        v_closed := v_closed + v_answers;
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, correlation_id,
                                 detail)
        VALUES (v_batch.tenant_id, 'batch.closed', v_batch.thread_id, p_run_id, v_batch.id,
                v_run.correlation_id,
                jsonb_build_object('status', CASE WHEN p_status = 'expired' THEN 'expired'
                                                  ELSE 'cancelled' END,
                                   'answered_calls', v_answers, 'why', v_why));
    END LOOP;
    WITH dropped AS (
        DELETE FROM {s}.outbox WHERE run_id = p_run_id AND status IN ('ready', 'quarantined')
        RETURNING kind
    )
    SELECT coalesce(jsonb_agg(kind), '[]') INTO v_dropped FROM dropped;
    UPDATE {s}.runs
    SET status = p_status, failure_reason = p_reason,
        last_error = coalesce(p_error, last_error), action_deadline = NULL, ended_at = now(),
        updated_at = now()
    WHERE id = p_run_id
    RETURNING * INTO v_run;
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, actor, detail)
    VALUES (v_run.tenant_id, 'run.' || p_status, v_run.thread_id, p_run_id, v_run.correlation_id,
            p_actor, jsonb_build_object('reason', p_reason, 'error', p_error,
                                        'closed_calls', v_closed, 'dropped_rows', v_dropped));
    RETURN v_run;
END $$;
REVOKE ALL ON FUNCTION {s}.end_run_v1(uuid, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.end_run_v1(uuid, text, text, text, text) TO outbox_relay;
