-- 0037: the invoke_agent span of a run cancelled by its backend or an operator.
-- Frozen: what revision 0037 applies, forever.
--
-- * runs.agent_span_due: true from the commit of cancel_run_v1 until a relay takes it. A
--   cancel happens in the canceller's transaction (a backend, `outbox serve`, `outbox runs
--   cancel`), which may still roll back and which runs in no relay; so the relay's sweep
--   takes the runs it marked once committed (FOR UPDATE SKIP LOCKED: one relay each) and
--   records their invoke_agent span, with the ids its turns and calls were parented on,
--   from the run's creation to its ended_at (relay.spans.run_cancelled). A relay with
--   tracing off clears the mark and records nothing. The partial index holds only the
--   marked runs: a handful between two sweeps.
-- * runs.cancelled_by: who cancelled the run (cancel_run_v1's actor), which the span names;
--   the relay may not read the journal that also says it.
-- * cancel_run_v1 sets both, in the statement after end_run_v1.

ALTER TABLE {s}.runs
    ADD COLUMN agent_span_due boolean NOT NULL DEFAULT false,
    ADD COLUMN cancelled_by text;
COMMENT ON COLUMN {s}.runs.agent_span_due IS
    'cancelled by a backend or an operator, and no relay has yet recorded its invoke_agent '
    'span (the relay''s sweep takes it)';
COMMENT ON COLUMN {s}.runs.cancelled_by IS
    'who cancelled the run (the actor given to cancel_run_v1, else the session user)';
CREATE INDEX runs_agent_span_due ON {s}.runs (ended_at) WHERE agent_span_due;


-- cancel_run_v1: "stop this run".
--
--   SELECT status FROM outbox.cancel_run_v1('tenant-a', '9f1c…'::uuid, p_actor => 'ops@acme');
--
-- Returns the run's row, now cancelled. No new claims; calls in flight finish and their
-- results land in orphaned_results; every call of an undelivered batch gets a tool message
-- at once, so the thread is replayable and a new run may start on it (see end_run_v1).
-- The run is marked agent_span_due (and cancelled_by): a relay records its invoke_agent
-- span once this commits. A run that does not exist for the tenant raises P0002; one that already ended
-- raises OB005. Runs as the schema owner (SECURITY DEFINER: ending a run removes outbox
-- rows, which outbox_writer may not delete) and refuses a tenant other than the session's
-- scope.
CREATE OR REPLACE FUNCTION {s}.cancel_run_v1(
    p_tenant_id text, p_run_id uuid, p_actor text DEFAULT NULL
) RETURNS {s}.runs
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run {s}.runs;
BEGIN
    PERFORM {s}.enter_tenant_v1(p_tenant_id);
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND OR v_run.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'run % does not exist for tenant %', p_run_id, quote_literal(p_tenant_id)
            USING ERRCODE = 'no_data_found', HINT = 'check the run id and the tenant';
    END IF;
    IF {s}.run_ended_v1(v_run.status) THEN
        RAISE EXCEPTION 'run % is already %: there is nothing to cancel', p_run_id, v_run.status
            USING ERRCODE = 'OB005', HINT = 'start a new run on the thread if more work is needed';
    END IF;
    PERFORM {s}.end_run_v1(p_run_id, 'cancelled', 'cancelled', 'cancelled by request',
                           coalesce(p_actor, session_user));
    UPDATE {s}.runs
    SET agent_span_due = true, cancelled_by = coalesce(p_actor, session_user)
    WHERE id = p_run_id
    RETURNING * INTO v_run;
    RETURN v_run;
END $$;
