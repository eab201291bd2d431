-- Approvals: a reviewer's decision on a tool call that waits for one. `{s}` is the schema.


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
    v_approval {s}.approvals;
    v_run      {s}.runs;
BEGIN
    PERFORM {s}.require_tenant_scope_v1(p_tenant_id, 'decide_approval_v1');
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
    IF {s}.run_ended_v1(v_run.status) THEN
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
    TO outbox_writer, outbox_api;  -- outbox_api: the requests of `outbox serve`
