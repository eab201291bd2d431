-- The relay's queue: the load of each lane with a limit, which the claim passes over lanes
-- at their limit by. `{s}` is the schema.


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
