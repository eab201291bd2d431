-- 0014: two holes closed (issue 17): a run waiting on a quarantined row is reported by
-- stuck_runs (reason parked_call), and the journal cannot be deleted from by setting the
-- prune flag by hand: only after a journal.pruned event of the same transaction.
-- Frozen: what revision 0014 applies, forever.

-- stuck_runs: "Which runs are not moving, and why?"
-- reason = 'undelivered_batch': a batch of an active run has every result (status
--   'complete') but no delivery is queued, so nothing will submit its outputs (the classic
--   stall at requires_action);
-- reason = 'lease_expired': a worker holds a lease on the run's work past its expiry (the
--   worker died or stalled; the relay's rescue sweep should take it back);
-- reason = 'past_deadline': the run waits for client outputs (requires_action) past its
--   action deadline (the sweep expires it once no call of it is being executed; outputs
--   submitted meanwhile are refused);
-- reason = 'no_work_queued': the run is queued or in progress but nothing is queued for it
--   (no outbox row, no complete batch), so nothing will ever move it: typically a run
--   inserted by hand or by an ORM without the writer API or start_run_v1;
-- reason = 'parked_call': a row of an active run is quarantined (an operator must requeue,
--   reconcile or release it, or cancel the run): the run waits for it and nothing else will
--   move it.
-- stuck_for says for how long; filter on it to ignore the last few seconds.
CREATE OR REPLACE VIEW {s}.stuck_runs AS
SELECT r.id AS run_id, r.tenant_id, r.thread_id, r.status, 'undelivered_batch' AS reason,
       b.id AS batch_id, NULL::bigint AS outbox_id, b.completed_at AS since,
       now() - b.completed_at AS stuck_for,
       format('batch %s (step %s) has all %s results since %s; no delivery is queued',
              b.id, b.step_no, b.size, b.completed_at) AS detail
FROM {s}.runs r
JOIN {s}.tool_batches b ON b.run_id = r.id AND b.status = 'complete'
WHERE r.status IN ('queued', 'in_progress', 'requires_action')
  AND NOT EXISTS (SELECT 1 FROM {s}.outbox o
                  WHERE o.kind = 'deliver_batch' AND o.batch_id = b.id)
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'lease_expired',
       o.batch_id, o.id, o.lease_expires_at, now() - o.lease_expires_at,
       format('%s row %s leased by %s (attempt %s) expired at %s',
              o.kind, o.id, o.lease_owner, o.attempts, o.lease_expires_at)
FROM {s}.outbox o
JOIN {s}.runs r ON r.id = o.run_id
WHERE o.status = 'leased' AND o.lease_expires_at < now()
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'past_deadline',
       NULL, NULL, r.action_deadline, now() - r.action_deadline,
       format('waiting for client outputs since %s; the deadline was %s',
              r.updated_at, r.action_deadline)
FROM {s}.runs r
WHERE r.status = 'requires_action' AND r.action_deadline < now()
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'no_work_queued',
       NULL, NULL, r.updated_at, now() - r.updated_at,
       format('the run is %s and nothing is queued for it since %s (no outbox row): was it '
              'inserted without the writer API or start_run_v1?', r.status, r.updated_at)
FROM {s}.runs r
WHERE r.status IN ('queued', 'in_progress')
  AND NOT EXISTS (SELECT 1 FROM {s}.outbox o WHERE o.run_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM {s}.tool_batches b
                  WHERE b.run_id = r.id AND b.status = 'complete')
UNION ALL
SELECT r.id, r.tenant_id, r.thread_id, r.status, 'parked_call',
       o.batch_id, o.id, coalesce(tc.updated_at, o.available_at),
       now() - coalesce(tc.updated_at, o.available_at),
       format('%s row %s (%s) is quarantined: %s; requeue, reconcile or release it, or '
              'cancel the run', o.kind, o.id, coalesce(tc.tool_name, 'no tool'),
              left(coalesce(o.last_error, 'no error recorded'), 200))
FROM {s}.outbox o
JOIN {s}.runs r ON r.id = o.run_id
LEFT JOIN {s}.tool_calls tc ON tc.id = o.tool_call_ref
WHERE o.status = 'quarantined' AND r.status IN ('queued', 'in_progress', 'requires_action');


-- The journal's guard: UPDATE and TRUNCATE are refused, and so is every DELETE but one of
-- rows older than the cut-off of a journal.pruned event written earlier in the same
-- transaction (the event's id in outbox.journal_prune). prune_journal writes that event
-- before it deletes, so no deletion goes unjournaled: a hand-set flag with no such event,
-- or an event of another transaction, opens nothing.
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_flag text := current_setting('outbox.journal_prune', true);
    v_before timestamptz;
BEGIN
    IF TG_OP = 'DELETE' AND v_flag ~ '^[0-9]{1,18}$' THEN
        SELECT (j.detail->>'before')::timestamptz INTO v_before FROM {s}.journal j
        WHERE j.id = v_flag::bigint AND j.event = 'journal.pruned'
          AND j.xmin::text = (pg_current_xact_id()::text::bigint & 4294967295)::text;
        IF v_before IS NOT NULL AND OLD.at < v_before THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;

-- Delete journal events older than older_than, journaled first (journal.pruned, with the
-- cut-off and the count). Runs with its owner's rights; only the owner (and superusers)
-- may execute it.
CREATE OR REPLACE FUNCTION {s}.prune_journal(older_than interval, actor text DEFAULT session_user)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed bigint;
    v_before timestamptz;
    v_event bigint;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune_journal needs a positive age, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_before := now() - older_than;
    SELECT count(*) INTO removed FROM {s}.journal WHERE at < v_before;
    INSERT INTO {s}.journal (tenant_id, event, actor, detail)
    VALUES ('*', 'journal.pruned', actor,
            jsonb_build_object('older_than', older_than::text, 'removed', removed,
                               'before', v_before))
    RETURNING id INTO v_event;
    PERFORM set_config('outbox.journal_prune', v_event::text, true);
    DELETE FROM {s}.journal WHERE at < v_before;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('outbox.journal_prune', '', true);
    RETURN removed;
END $$;
