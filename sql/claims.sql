-- The relay's queue: the load of each lane with a limit, which the claim passes over lanes
-- at their limit by, and the drop of a leased row whose run is over. `{s}` is the schema.
-- Applied after runs.sql: a plain SQL function is checked against what it calls
-- (run_over_v1) when it is created.


-- lane_loads_v1: every lane with a limit (outbox.lanes: a tool or a tenant) and what it has
-- in flight now (its leased rows, counted through the lease indexes). The one count of a
-- lane's load: the relay's claim passes over lanes at their limit by it, and `outbox
-- limits` shows it. Plain SQL and STABLE, so the planner inlines it into the claim. Runs
-- with the caller's rights: the relay's role and the owner see every tenant's rows.
CREATE OR REPLACE FUNCTION {s}.lane_loads_v1()
RETURNS TABLE (scope text, name text, max_concurrency integer, rate double precision,
               tokens double precision, refilled_at timestamptz, claimed_at timestamptz,
               updated_at timestamptz, in_flight bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.scope, l.name, l.max_concurrency, l.rate, l.tokens, l.refilled_at, l.claimed_at,
           l.updated_at,
           CASE l.scope
               WHEN 'tenant' THEN (SELECT count(*) FROM {s}.outbox o
                                   WHERE o.status = 'leased' AND o.tenant_id = l.name)
               ELSE (SELECT count(*) FROM {s}.outbox o
                     WHERE o.status = 'leased' AND o.tool_name = l.name)
           END
    FROM {s}.lanes l
$$;
REVOKE ALL ON FUNCTION {s}.lane_loads_v1() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.lane_loads_v1() TO outbox_relay;


-- drop_if_run_over_v1: "this leased row's run is over: drop it instead". The relay's
-- retry_later_many and quarantine (relay/queries/relay.sql) call it before they put a row back
-- or park it, so a row whose run is over (run_over_v1) is never started again nor parked
-- for an operator. Only for the lease's holder (p_worker at p_attempt: the fence). The row
-- leaves the queue; its call keeps the attempt and says why ('its run is over: ' ||
-- p_not_done || '; ' || p_error), so its tool message says what is known (outcome
-- unknown); the drop is journaled as <kind>.dropped with reason run_over and instead_of
-- p_instead_of. Returns true when it dropped the row, false (nothing done) when the row is
-- not this holder's or its run is not over. Runs with the caller's rights.
CREATE OR REPLACE FUNCTION {s}.drop_if_run_over_v1(p_id bigint, p_worker text,
                                                    p_attempt integer, p_instead_of text,
                                                    p_not_done text, p_error text)
RETURNS boolean LANGUAGE sql AS $$
    WITH dropped AS (
        DELETE FROM {s}.outbox o
        WHERE o.id = p_id AND o.lease_owner = p_worker AND o.attempts = p_attempt
          AND EXISTS (SELECT 1 FROM {s}.runs r
                      WHERE r.id = o.run_id
                        AND {s}.run_over_v1(r.status, r.action_deadline))
        RETURNING o.*
    ), noted AS (
        UPDATE {s}.tool_calls tc
        SET status = CASE WHEN tc.status IN ('succeeded', 'failed') THEN tc.status
                          ELSE 'cancelled' END,
            attempts = greatest(tc.attempts, d.attempts),
            last_error = 'its run is over: ' || p_not_done || '; ' || p_error,
            updated_at = now()
        FROM dropped d
        WHERE tc.id = d.tool_call_ref
    ), journaled AS (
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                                 outbox_id, correlation_id, attempt, worker, detail)
        SELECT tenant_id, kind || '.dropped', thread_id, run_id, batch_id, tool_call_ref, id,
               correlation_id, attempts, p_worker,
               jsonb_build_object('reason', 'run_over', 'instead_of', p_instead_of,
                                  'error', p_error)
        FROM dropped
    )
    SELECT EXISTS (SELECT 1 FROM dropped)
$$;
REVOKE ALL ON FUNCTION {s}.drop_if_run_over_v1(bigint, text, integer, text, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.drop_if_run_over_v1(bigint, text, integer, text, text, text)
    TO outbox_relay;
