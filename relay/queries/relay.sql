-- name: claim
-- Claim up to n due rows in one statement, fairly across tenants and within the limits of
-- their lanes (docs/relay.md, "Limits and fair claims"):
--
-- * tenants: walk the tenants with due rows (one probe of outbox_ready_tenant each) and
--   lock each one's oldest due rows with SKIP LOCKED, an equal share of n apiece; the
--   claim takes them round-robin (every tenant's first row, then every second...), so one
--   tenant's backlog never makes another's row wait for more than one claim;
-- * lanes: a tool or tenant with a row in `lanes` has a limit. Lanes already at it (by
--   this statement's snapshot) are listed first and their rows passed over, so they never
--   take the places of other work. The row of a lane the claim takes from is locked SKIP
--   LOCKED (a lane another claim holds now is left to the next claim), and what the lane
--   has in flight is counted with an index lookup. That count is only trusted when the
--   lane row's last writer is visible to this statement's snapshot: every claim that takes
--   work of a lane rewrites its row, so a claim committed after this statement began shows
--   as an invisible writer, and the lane waits for the next claim rather than count short;
-- * this relay's own cap per tenant (relay.capacity, `--tenant-share`): a tenant holding
--   `held` rows of this relay takes at most tenant_cap - held in its share, and others'
--   unused shares are filled only as far as no tenant could pass the cap;
-- * lease the chosen rows from the database clock, bump the attempt (the fencing token),
--   take the rate tokens they used, and return each with what its executor needs. Every
--   other lookup goes through a primary key;
-- * but a chosen tool call whose run is over (run_over_v1: ended, or in requires_action
--   past its deadline, whether or not a sweep expired it yet) is never started: it leaves
--   the queue here, journaled tool_call.dropped, and is not returned.
WITH RECURSIVE loads AS (
    -- Every lane with a limit: what it has in flight (leased rows, one index lookup) and
    -- the rate tokens it holds now, by this statement's snapshot.
    SELECT l.scope, l.name, l.max_concurrency, l.rate, l.in_flight,
           least(greatest(1, l.rate),
                 l.tokens + l.rate * extract(epoch FROM now() - l.refilled_at)) AS tokens
    FROM {s}.lane_loads_v1() l
), full_lanes AS (
    -- Lanes at their limit: their rows are passed over below, so a tool at its limit never
    -- takes the places of its tenant's other work in a claim.
    SELECT scope, name FROM loads WHERE max_concurrency <= in_flight OR tokens < 1
), tenants AS (
    (SELECT o.tenant_id FROM {s}.outbox o
     WHERE o.status = 'ready' AND o.available_at <= now() AND o.kind = ANY(%(kinds)s)
     ORDER BY o.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant_id FROM {s}.outbox o
            WHERE o.status = 'ready' AND o.tenant_id > t.tenant_id
              AND o.available_at <= now() AND o.kind = ANY(%(kinds)s)
            ORDER BY o.tenant_id LIMIT 1)
    FROM tenants t WHERE t.tenant_id IS NOT NULL
), share AS (
    -- Tenants at this relay's cap take no share: the others split the places.
    SELECT ceil(%(limit)s::float8 / greatest(1, count(*)))::int AS n
    FROM tenants
    WHERE tenant_id IS NOT NULL
      AND coalesce((%(held)s::jsonb ->> tenant_id)::int, 0) < %(tenant_cap)s
), shared AS (
    SELECT c.id, c.tenant_id, c.tool_name, c.available_at, c.kind, c.run_id FROM tenants t
    CROSS JOIN LATERAL (
        SELECT o.id, o.tenant_id, o.tool_name, o.available_at, o.kind, o.run_id
        FROM {s}.outbox o
        WHERE o.status = 'ready' AND o.tenant_id = t.tenant_id
          AND o.available_at <= now() AND o.kind = ANY(%(kinds)s)
          AND (o.tool_name IS NULL
               OR NOT EXISTS (SELECT 1 FROM full_lanes f
                              WHERE f.scope = 'tool' AND f.name = o.tool_name))
        ORDER BY o.available_at, o.id
        LIMIT least((SELECT n FROM share),
                    greatest(0, %(tenant_cap)s
                                - coalesce((%(held)s::jsonb ->> t.tenant_id)::int, 0)))
        FOR UPDATE OF o SKIP LOCKED
    ) c
    WHERE t.tenant_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM full_lanes f
                      WHERE f.scope = 'tenant' AND f.name = t.tenant_id)
      AND NOT EXISTS (SELECT 1 FROM {s}.tenant_pauses p WHERE p.tenant_id = t.tenant_id)
), topped_room AS (
    -- How many more rows fit without taking any tenant with due rows past this relay's
    -- cap, however they fall (rows held here + rows shared above, the fullest tenant).
    SELECT greatest(0, %(tenant_cap)s - coalesce(max(
               coalesce((%(held)s::jsonb ->> t.tenant_id)::int, 0) + coalesce(g.n, 0)), 0))
           AS n
    FROM tenants t
    LEFT JOIN (SELECT tenant_id, count(*) AS n FROM shared GROUP BY tenant_id) g
           ON g.tenant_id = t.tenant_id
    WHERE t.tenant_id IS NOT NULL
), topped AS (
    -- Tenants with less than their share leave room: the oldest other due rows fill it.
    SELECT o.id, o.tenant_id, o.tool_name, o.available_at, o.kind, o.run_id
    FROM {s}.outbox o
    WHERE o.status = 'ready' AND o.available_at <= now() AND o.kind = ANY(%(kinds)s)
      AND o.id <> ALL(ARRAY(SELECT id FROM shared))
      AND NOT EXISTS (SELECT 1 FROM full_lanes f
                      WHERE (f.scope = 'tenant' AND f.name = o.tenant_id)
                         OR (f.scope = 'tool' AND f.name = o.tool_name))
      AND NOT EXISTS (SELECT 1 FROM {s}.tenant_pauses p WHERE p.tenant_id = o.tenant_id)
    ORDER BY o.available_at, o.id
    LIMIT least(greatest(0, %(limit)s - (SELECT count(*) FROM shared)),
                (SELECT n FROM topped_room))
    FOR UPDATE OF o SKIP LOCKED
), candidates AS (
    -- turn: a row's place among its tenant's (its tenant's first row, second row...).
    SELECT c.id, c.tenant_id, c.tool_name, c.available_at, c.kind, c.run_id, c.stage,
           row_number() OVER (PARTITION BY c.tenant_id
                              ORDER BY c.stage, c.available_at, c.id) AS turn
    FROM (SELECT *, 1 AS stage FROM shared UNION ALL SELECT *, 2 FROM topped) c
), limited AS (
    SELECT d.scope, d.name FROM loads d
    WHERE (d.scope = 'tenant' AND d.name IN (SELECT tenant_id FROM candidates))
       OR (d.scope = 'tool' AND d.name IN (SELECT tool_name FROM candidates))
), snap AS (
    SELECT pg_current_snapshot() AS s,
           pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax
), held AS (
    -- A lane row's xmin is a 32-bit xid: put it in the epoch of the snapshot's xmax (or
    -- the one before, if it is larger) to ask whether the snapshot sees its writer. When it
    -- does, the row locked is the one `loads` read.
    SELECT l.scope, l.name,
           pg_visible_in_snapshot(
               (((((snap.xmax >> 32)
                   - CASE WHEN l.xmin::text::bigint > (snap.xmax & 4294967295) THEN 1
                          ELSE 0 END) << 32)
                 | l.xmin::text::bigint)::text)::xid8,
               snap.s) AS settled
    FROM {s}.lanes l, snap
    WHERE (l.scope, l.name) IN (SELECT scope, name FROM limited)
    ORDER BY l.scope, l.name
    FOR UPDATE OF l SKIP LOCKED
), room AS (
    SELECT h.scope, h.name, d.tokens,
           CASE WHEN NOT h.settled THEN 0
                ELSE least(coalesce(d.max_concurrency - d.in_flight, 2147483647),
                           coalesce(floor(d.tokens), 2147483647))
           END AS n
    FROM held h JOIN loads d ON d.scope = h.scope AND d.name = h.name
), chosen AS (
    SELECT c.id, c.tenant_id, c.tool_name, c.kind, c.run_id FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.tool_name
                                       ORDER BY c.stage, c.turn, c.available_at, c.id)
                    AS tool_turn
        FROM candidates c
    ) c
    WHERE NOT EXISTS (SELECT 1 FROM limited l
                      WHERE l.scope = 'tenant' AND l.name = c.tenant_id
                        AND c.turn > coalesce((SELECT r.n FROM room r
                                               WHERE r.scope = 'tenant'
                                                 AND r.name = c.tenant_id), 0))
      AND NOT EXISTS (SELECT 1 FROM limited l
                      WHERE l.scope = 'tool' AND l.name = c.tool_name
                        AND c.tool_turn > coalesce((SELECT r.n FROM room r
                                                    WHERE r.scope = 'tool'
                                                      AND r.name = c.tool_name), 0))
    ORDER BY c.stage, c.turn, c.available_at, c.id
    LIMIT %(limit)s
), chosen_runs AS MATERIALIZED (
    -- The runs of the rows chosen, each read once by primary key (one scan of the runs'
    -- ids, however many rows a run has here; never a hash of every run), for judged and
    -- for what the claim returns of them below.
    SELECT r.id, r.status, r.action_deadline, r.traceparent, r.tracestate, r.created_at,
           r.model
    FROM {s}.runs r WHERE r.id = ANY(ARRAY(SELECT DISTINCT run_id FROM chosen))
), judged AS (
    -- A tool call whose run is over (ended, or past its requires_action deadline: a retry
    -- that came due before a sweep recorded the expiry) is never started.
    SELECT c.id, r.traceparent, r.tracestate, r.created_at, r.model,
           c.kind = 'tool_call' AND r.id IS NOT NULL
           AND coalesce({s}.run_over_v1(r.status, r.action_deadline), false) AS run_over
    FROM chosen c LEFT JOIN chosen_runs r ON r.id = c.run_id
), claimed AS (
    UPDATE {s}.outbox o
    SET status = 'leased', attempts = o.attempts + 1, lease_owner = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease_s)s), claimed_at = now()
    WHERE o.id = ANY(ARRAY(SELECT id FROM judged WHERE NOT run_over))
    RETURNING o.id, o.kind, o.tenant_id, o.thread_id, o.run_id, o.batch_id, o.tool_call_ref,
              o.correlation_id, o.attempts, o.failures, o.max_attempts, o.payload,
              o.available_at, o.tool_name
), dropped AS (
    -- It leaves the queue instead, as in retry_later_many, quarantine and rescue_expired: its
    -- call keeps the attempts made (its tool message says what is known), the drop is
    -- journaled, and it takes no lane's place or rate token.
    DELETE FROM {s}.outbox o
    WHERE o.id = ANY(ARRAY(SELECT id FROM judged WHERE run_over))
    RETURNING o.*
), noted AS (
    -- SKIP LOCKED: end_run_v1 (the sweep's expiry) locks the call before it deletes this
    -- row, which the claim holds; waiting here would deadlock with it, and it notes the
    -- call itself.
    UPDATE {s}.tool_calls tc
    SET status = CASE WHEN tc.status IN ('succeeded', 'failed') THEN tc.status
                      ELSE 'cancelled' END,
        attempts = greatest(tc.attempts, d.attempts),
        last_error = 'its run was over when this call came due: not started',
        updated_at = now()
    FROM dropped d
    WHERE tc.id = d.tool_call_ref
      AND tc.id = ANY(ARRAY(SELECT x.id FROM {s}.tool_calls x
                            WHERE x.id = ANY(ARRAY(SELECT tool_call_ref FROM dropped))
                            FOR UPDATE SKIP LOCKED))
), journaled AS (
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                             outbox_id, correlation_id, attempt, worker, detail)
    SELECT tenant_id, kind || '.dropped', thread_id, run_id, batch_id, tool_call_ref, id,
           correlation_id, attempts, %(worker)s,
           jsonb_build_object('reason', 'run_over', 'instead_of', 'claim')
    FROM dropped
), lanes_used AS (
    UPDATE {s}.lanes l
    SET claimed_at = now(),
        tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE r.tokens - used.n END,
        refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE now() END
    FROM room r,
         (SELECT 'tenant' AS scope, tenant_id AS name, count(*) AS n FROM claimed
          GROUP BY tenant_id
          UNION ALL
          SELECT 'tool', tool_name, count(*) FROM claimed
          WHERE tool_name IS NOT NULL GROUP BY tool_name) used
    WHERE l.scope = used.scope AND l.name = used.name
      AND r.scope = l.scope AND r.name = l.name
), calls AS MATERIALIZED (
    -- The calls claimed, in one scan of their ids (not a probe per row).
    SELECT * FROM {s}.tool_calls
    WHERE id = ANY(ARRAY(SELECT tool_call_ref FROM claimed WHERE tool_call_ref IS NOT NULL))
), approved AS MATERIALIZED (
    -- The calls' approvals, if they needed one (read by stop and by the approval columns),
    -- in one scan of the unique tool_call_ref.
    SELECT a.tool_call_ref, a.id, a.status, a.decided_by, a.reason, a.deadline,
           a.arguments_digest, a.decided_at, a.created_at
    FROM {s}.approvals a WHERE a.tool_call_ref = ANY(ARRAY(SELECT id FROM calls))
), tools_used AS MATERIALIZED (
    -- Each tool version the calls use, with its tenant's switch, looked up once (a claim
    -- of hundreds of rows names a few tools: a probe of tools and of tool_switches per row
    -- was a good part of a claim's reads).
    SELECT k.tool_name AS used_name, k.tool_version AS used_version,
           k.tenant_id AS used_by, t.*,
           (SELECT jsonb_build_object('switch', w.tenant_id, 'by', w.switched_by,
                                      'reason', w.reason)
            FROM {s}.tool_switches w
            WHERE w.tool_name = k.tool_name AND w.tenant_id IN (k.tenant_id, '*')
            ORDER BY w.tenant_id = '*' LIMIT 1) AS switch
    FROM (SELECT DISTINCT tool_name, tool_version, tenant_id FROM calls) k
    LEFT JOIN LATERAL (
        SELECT * FROM {s}.tools t
        WHERE t.name = k.tool_name AND t.version = k.tool_version
          AND t.tenant_id IN (k.tenant_id, '*')
        ORDER BY t.tenant_id = '*'
        LIMIT 1
    ) t ON true
)
-- The columns of relay.outcomes.Claimed, in its order.
-- A tool call's payload is left out: its call row holds what it needs, and decoding JSON is
-- a good part of a claim's cost in the relay.
-- stop: why a tool call must not run (NULL for nearly every row): its tool was switched off
-- for its tenant or for all, its version is disabled, or its approval is not an approval of
-- these arguments (outbox.policy.stop_text says it to the model).
-- credential: how to find the secret the tool needs, the call's tenant's before the
-- default (outbox.credentials.resolve); never the secret itself. For a webhook: its
-- endpoint (URL, encrypted signing secret).
SELECT c.id, c.kind, c.tenant_id, c.thread_id, c.run_id, c.batch_id, c.tool_call_ref,
       c.correlation_id, c.attempts, c.failures, c.max_attempts,
       CASE WHEN c.kind <> 'tool_call' THEN c.payload END AS payload,
       extract(epoch FROM clock_timestamp() - c.available_at)::float8 AS lag_s,
       tc.tool_call_id, tc.tool_name,
       {s}.resolved_json_v1(tc.arguments, tc.tenant_id, tc.arguments_ref) AS arguments, tc.idempotency_key, tc.idempotency_mode,
       tc.executor, tc.dispatched_attempt,
       -- settle_wait_s: how long an earlier attempt that may have reached the tool may still
       -- take effect there: settle_s past the later of its dispatch + the tool's timeout and
       -- the moment its relay gave up on it (a request sent late is given up late), by this
       -- clock; no resend and no trusted "not found" before (relay.executors). NULL: no
       -- such attempt, or the tool answered it (dispatched_at is gone).
       CASE WHEN tc.dispatched_attempt < c.attempts THEN extract(epoch FROM
           greatest(tc.dispatched_at + make_interval(secs => coalesce(t.timeout_s, 30)),
                    tc.gave_up_at)
           + make_interval(secs => coalesce(t.settle_s, t.timeout_s, 30))
           - now())::float8 END AS settle_wait_s,
       coalesce(t.refuses_key_in_use, false) AS refuses_key_in_use,
       t.endpoint, t.lookup_endpoint, t.callable, t.timeout_s, t.credential_ref,
       CASE WHEN c.kind = 'tool_call' THEN coalesce(
           t.switch,
           CASE WHEN NOT t.enabled THEN jsonb_build_object('disabled_version', t.version) END,
           CASE WHEN a.status <> 'approved' OR a.arguments_digest <> tc.arguments_hash THEN
               jsonb_build_object('approval', a.id, 'status', a.status, 'by', a.decided_by,
                                  'reason', a.reason, 'deadline', a.deadline) END
       ) END AS stop,
       CASE WHEN t.credential_ref IS NOT NULL THEN (
           SELECT jsonb_build_object('tenant_id', cr.tenant_id, 'source', cr.source,
                                     'reference', cr.reference, 'ciphertext', cr.ciphertext,
                                     'header', cr.header, 'scheme', cr.scheme,
                                     'version', cr.version, 'revoked_at', cr.revoked_at)
           FROM {s}.credentials cr
           WHERE cr.name = t.credential_ref AND cr.tenant_id IN (tc.tenant_id, '*')
           ORDER BY cr.tenant_id = '*' LIMIT 1
       )
       WHEN c.kind = 'webhook' THEN (
           -- The endpoint as it is now: its URL, its encrypted signing secret, whether it
           -- was removed (outbox.webhooks; NULL: no such endpoint any more).
           SELECT jsonb_build_object('url', e.url, 'ciphertext', e.ciphertext,
                                     'removed_at', e.removed_at)
           FROM {s}.webhook_endpoints e WHERE e.id = (c.payload->>'endpoint_id')::uuid
       ) END AS credential,
       -- mcp: an MCP tool's name at its server, and how to reach the server as it is
       -- registered now (outbox.relay.mcpclient; server NULL: it was removed).
       CASE WHEN t.executor = 'mcp' THEN jsonb_build_object(
           'tool', t.mcp_tool, 'missing', t.mcp_server,
           'server', (SELECT to_jsonb(m) FROM {s}.mcp_servers m
                      WHERE m.name = t.mcp_server AND m.tenant_id = t.tenant_id))
       END AS mcp,
       -- The run's trace context, its start (seconds since the epoch) and model: every span
       -- of the run hangs under its invoke_agent span (outbox.trace_context).
       r.traceparent, r.tracestate, extract(epoch FROM r.created_at)::float8 AS run_started_at,
       r.model,
       -- deadline_in_s: seconds until the call's deadline (its creation + the tool's
       -- deadline_s, by this clock): no attempt is sent after it, and attempts that never
       -- reached the tool are not charged before it (docs/relay.md, "Deadlines"). NULL: the
       -- tool has none.
       extract(epoch FROM tc.created_at + make_interval(secs => t.deadline_s) - now())::float8
           AS deadline_in_s,
       -- A call that waited for a reviewer's approval: who approved it and how long it
       -- waited (its execute_tool span says both; NULL for every other row).
       CASE WHEN a.status = 'approved' THEN a.decided_by END AS approved_by,
       CASE WHEN a.status = 'approved' THEN
           extract(epoch FROM a.decided_at - a.created_at)::float8 END AS approval_wait_s
FROM claimed c
LEFT JOIN calls tc ON tc.id = c.tool_call_ref
LEFT JOIN approved a ON a.tool_call_ref = tc.id
JOIN judged r ON r.id = c.id  -- the row's run, as judged read it
LEFT JOIN tools_used t
       ON t.used_name = tc.tool_name AND t.used_version IS NOT DISTINCT FROM tc.tool_version
      AND t.used_by = tc.tenant_id
ORDER BY c.available_at, c.id

-- name: finish
-- Remove a done row from the hot table, only for the current lease holder (fencing).
-- The fences test lease_owner, not status = 'leased': the CHECKs outbox_lease_consistent
-- and outbox_lease_holder_is_leased make one imply the other, and a
-- status test would let the planner walk the lease index (whose statistics see it nearly
-- empty) instead of the primary key.
DELETE FROM {s}.outbox
WHERE id = %(id)s AND lease_owner = %(worker)s AND attempts = %(attempt)s
RETURNING id

-- name: retry_later_many
-- Put rows back for a later attempt (Completer._retry_many), each only for its current lease
-- holder and attempt. ``charges``: 1 when the attempt's effect failed by the tool's or
-- model's doing (it counts against max_attempts), 0 when it never started (a hold asked for
-- by Retry-After elsewhere). A row whose run is over is dropped instead (drop_if_run_over_v1,
-- sql/claims.sql) and not returned, so the worker journals its write as refused. In the same
-- statement: what call_status records of each tool call put back ('pending'), and each
-- row's <kind>.retry_scheduled event with its ``details``. One statement for a failed wave
-- of a thousand model turns, not three a turn.
WITH f AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                %(delays)s::float8[], %(charges)s::int[], %(deadlines)s::float8[],
                %(unsent)s::bool[], %(answered)s::bool[], %(tool_call_ids)s::text[],
                %(details)s::jsonb[])
        AS f(id, attempt, error, delay_s, charge, deadline_in_s, unsent, answered,
             tool_call_id, detail)
), over AS (
    SELECT f.id, {s}.drop_if_run_over_v1(f.id, %(worker)s::text, f.attempt, 'retry_later',
                                          'not retried', f.error) AS dropped
    FROM f
), moved AS (
    UPDATE {s}.outbox o
    SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL, last_error = f.error,
        available_at = CASE WHEN f.deadline_in_s IS NULL
                            THEN now() + make_interval(secs => f.delay_s)
                            ELSE least(now() + make_interval(secs => f.delay_s),
                                       greatest(now(), o.claimed_at + make_interval(
                                           secs => f.deadline_in_s))) END,
        failures = o.failures + f.charge
    FROM f JOIN over ON over.id = f.id
    WHERE o.id = f.id AND o.lease_owner = %(worker)s AND o.attempts = f.attempt
      AND NOT over.dropped
    RETURNING o.id, o.tenant_id, o.kind, o.thread_id, o.run_id, o.batch_id, o.tool_call_ref,
              o.correlation_id
), calls AS (
    UPDATE {s}.tool_calls tc
    SET status = 'pending', attempts = f.attempt, last_error = f.error, updated_at = now(),
        dispatched_attempt = CASE WHEN f.unsent AND tc.dispatched_attempt = f.attempt
                                  THEN NULL ELSE tc.dispatched_attempt END,
        dispatched_at = CASE WHEN (f.unsent OR f.answered) AND tc.dispatched_attempt = f.attempt
                             THEN NULL ELSE tc.dispatched_at END,
        gave_up_at = CASE WHEN tc.dispatched_attempt IS DISTINCT FROM f.attempt THEN tc.gave_up_at
                          WHEN f.unsent OR f.answered THEN NULL
                          ELSE now() END
    FROM moved m JOIN f ON f.id = m.id
    WHERE tc.id = m.tool_call_ref
), journaled AS (
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                             tool_call_id, outbox_id, correlation_id, attempt, worker, detail)
    SELECT m.tenant_id, m.kind || '.retry_scheduled', m.thread_id, m.run_id, m.batch_id,
           m.tool_call_ref, f.tool_call_id, m.id, m.correlation_id, f.attempt, %(worker)s,
           f.detail
    FROM moved m JOIN f ON f.id = m.id
)
SELECT id FROM moved

-- name: quarantine
-- Park a row for an operator, only for the current lease holder; the attempt that ended
-- here counts as failed. A row whose run is over is dropped instead (drop_if_run_over_v1,
-- sql/claims.sql) and nothing is returned, so the worker journals its write as refused.
WITH over AS (
    SELECT {s}.drop_if_run_over_v1(%(id)s::bigint, %(worker)s::text, %(attempt)s::integer,
                                   'quarantine', 'not parked for an operator',
                                   %(error)s::text) AS dropped
)
UPDATE {s}.outbox o
SET status = 'quarantined', lease_owner = NULL, lease_expires_at = NULL,
    last_error = %(error)s, failures = o.failures + 1
FROM over
WHERE o.id = %(id)s AND o.lease_owner = %(worker)s AND o.attempts = %(attempt)s
  AND NOT over.dropped
RETURNING o.id

-- name: call_status
-- Record a call's state after an attempt. An attempt that certainly never reached the tool
-- (unsent: a refused connection, 408/429/503) takes back its own dispatch mark, so the next
-- attempt is a plain call, not an ambiguous one; a mark of an earlier attempt stays. An
-- attempt the tool answered (answered: a 5xx but a gateway's) stays ambiguous, but is over
-- at the tool: its dispatch time goes, so the next attempt does not wait for it to settle.
-- Any other attempt of the mark is one the relay gave up on now (a timeout, a broken
-- connection): its request may act at the tool until settle_s past now at least.
UPDATE {s}.tool_calls
SET status = %(status)s, attempts = %(attempt)s, last_error = %(error)s, updated_at = now(),
    dispatched_attempt = CASE WHEN %(unsent)s AND dispatched_attempt = %(attempt)s THEN NULL
                              ELSE dispatched_attempt END,
    dispatched_at = CASE WHEN (%(unsent)s OR %(answered)s) AND dispatched_attempt = %(attempt)s
                         THEN NULL ELSE dispatched_at END,
    gave_up_at = CASE WHEN dispatched_attempt IS DISTINCT FROM %(attempt)s THEN gave_up_at
                      WHEN %(unsent)s OR %(answered)s THEN NULL
                      ELSE now() END
WHERE id = %(tool_call_ref)s

-- name: mark_dispatched
-- Before a tool that cannot dedup is called: note that this attempt may reach it, but only
-- while we still hold an unexpired lease (otherwise we must not call it at all).
UPDATE {s}.tool_calls tc
SET dispatched_attempt = %(attempt)s, dispatched_at = now(), gave_up_at = NULL,
    attempts = %(attempt)s, status = 'running', updated_at = now()
WHERE tc.id = %(tool_call_ref)s
  AND EXISTS (SELECT 1 FROM {s}.outbox o
              WHERE o.id = %(id)s AND o.lease_owner = %(worker)s AND o.status = 'leased'
                AND o.attempts = %(attempt)s AND o.lease_expires_at > now())
RETURNING tc.id

-- name: heartbeat
-- Extend the leases this worker still holds that have less than renew_below_s left (two
-- thirds of the term and one round, relay.maintenance), not every lease at every round:
-- an extension writes a new version of the row, with an entry in each of its indexes
-- (lease_expires_at is a key of outbox_leased, so the update is never HOT) and a dead one
-- the rescue's walk of outbox_leased passes until vacuum. Rows locked by a completion in
-- progress are skipped, not waited for: waiting here deadlocks with the completer's
-- transaction.
WITH mine AS (
    SELECT id FROM {s}.outbox
    WHERE id = ANY(%(ids)s) AND lease_owner = %(worker)s AND status = 'leased'
      AND lease_expires_at < now() + make_interval(secs => %(renew_below_s)s)
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE {s}.outbox o
SET lease_expires_at = now() + make_interval(secs => %(lease_s)s)
FROM mine
WHERE o.id = mine.id
RETURNING o.id

-- name: release
-- Give back rows on shutdown or when the database went away before they started: ready
-- again at once, no attempt charged (``failures`` counts only effects that failed) and no
-- fencing token reused (``attempts`` stays: a token is never handed out twice).
UPDATE {s}.outbox
SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL, available_at = now(),
    lost_leases = lost_leases + 1,
    last_error = 'released by ' || %(worker)s || ' at shutdown'
WHERE id = ANY(%(ids)s) AND lease_owner = %(worker)s AND status = 'leased'
RETURNING id

-- name: rescue_expired
-- Take back rows whose lease expired (the holder died or stalled): ready again, with no
-- attempt charged (a dead relay is not the tool's failure), or quarantined once leases of
-- the row were lost max_lost_leases times (a row that kills whoever runs it must not loop
-- forever); journaled either way. A row whose run is over (ended, or past its
-- requires_action deadline) is not started again nor parked for an operator: it leaves the
-- queue, its call keeps the attempt (so its tool message says "outcome unknown", not "not
-- executed") and the drop is journaled (lease.expired.dropped).
WITH expired AS (
    SELECT o.id, o.lease_owner AS previous_owner,
           EXISTS (SELECT 1 FROM {s}.runs r
                   WHERE r.id = o.run_id
                     AND {s}.run_over_v1(r.status, r.action_deadline)) AS run_over
    FROM {s}.outbox o
    WHERE o.status = 'leased' AND o.lease_expires_at < now()
    ORDER BY o.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), dropped AS (
    DELETE FROM {s}.outbox o USING expired
    WHERE o.id = expired.id AND expired.run_over
    RETURNING o.*, expired.previous_owner
), moved AS (
    UPDATE {s}.outbox o
    SET status = CASE WHEN o.lost_leases + 1 >= %(max_lost_leases)s THEN 'quarantined'
                      ELSE 'ready' END,
        lost_leases = o.lost_leases + 1,
        last_error = 'lease of ' || expired.previous_owner || ' expired during attempt '
                     || o.attempts,
        lease_owner = NULL, lease_expires_at = NULL, available_at = now()
    FROM expired
    WHERE o.id = expired.id AND NOT expired.run_over
    RETURNING o.*, expired.previous_owner
), journaled AS (
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                             outbox_id, correlation_id, attempt, worker, detail)
    SELECT tenant_id,
           CASE WHEN status = 'quarantined' THEN 'lease.expired.quarantined'
                ELSE 'lease.expired.rescued' END,
           thread_id, run_id, batch_id, tool_call_ref, id, correlation_id, attempts,
           %(worker)s, jsonb_build_object('previous_owner', previous_owner, 'kind', kind)
    FROM moved
    UNION ALL
    SELECT tenant_id, 'lease.expired.dropped', thread_id, run_id, batch_id, tool_call_ref, id,
           correlation_id, attempts, %(worker)s,
           jsonb_build_object('previous_owner', previous_owner, 'kind', kind,
                              'reason', 'run_over')
    FROM dropped
), parked AS (
    UPDATE {s}.tool_calls tc SET status = 'quarantined', last_error = moved.last_error,
           updated_at = now()
    FROM moved
    WHERE moved.status = 'quarantined' AND tc.id = moved.tool_call_ref
), noted AS (
    UPDATE {s}.tool_calls tc
    SET status = CASE WHEN tc.status IN ('succeeded', 'failed') THEN tc.status
                      ELSE 'cancelled' END,
        attempts = greatest(tc.attempts, dropped.attempts),
        last_error = 'lease of ' || dropped.previous_owner || ' expired during attempt '
                     || dropped.attempts || ' after its run was over: not started again, '
                     || 'its outcome is unknown',
        updated_at = now()
    FROM dropped
    WHERE tc.id = dropped.tool_call_ref
)
SELECT id, kind, status, previous_owner FROM moved
UNION ALL
SELECT id, kind, 'dropped', previous_owner FROM dropped

-- name: expire_leases_of
-- End now the leases of a worker process known to be dead: its supervisor saw it exit, so
-- nothing of it can still be running. The next rescue (rescue_expired, by any worker) takes
-- its rows back as it would once the leases ran out, without waiting for that. Only the
-- process that saw the exit may say so: a worker that merely lost its connections is alive.
UPDATE {s}.outbox SET lease_expires_at = now()
WHERE status = 'leased' AND lease_owner = %(worker)s AND lease_expires_at > now()
RETURNING id

-- name: rescue_stalled_batches
-- Complete batches whose delivery is missing (the stall at requires_action): enqueue it.
WITH stalled AS (
    INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                            correlation_id)
    SELECT b.tenant_id, 'deliver_batch', {s}.deliver_key_v1(b.id), b.thread_id, b.run_id, b.id,
           r.correlation_id
    FROM {s}.tool_batches b
    JOIN {s}.runs r ON r.id = b.run_id
    WHERE b.status = 'complete'
      AND b.completed_at < now() - make_interval(secs => %(grace_s)s)
      AND NOT EXISTS (SELECT 1 FROM {s}.outbox o WHERE o.dedup_key = {s}.deliver_key_v1(b.id))
    ON CONFLICT (dedup_key, tenant_id) DO NOTHING
    RETURNING *
), journaled AS (
    INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, outbox_id,
                             correlation_id, worker)
    SELECT tenant_id, 'batch.delivery_rescued', thread_id, run_id, batch_id, id,
           correlation_id, %(worker)s
    FROM stalled
)
SELECT batch_id FROM stalled

-- name: next_due
-- Seconds until the next ready row of these kinds is due (null when none is waiting).
SELECT extract(epoch FROM min(available_at) - now()) AS due_in_s
FROM {s}.outbox WHERE status = 'ready' AND kind = ANY(%(kinds)s)

-- name: queue_depth
-- Rows per status and kind, and the lag of the oldest due ready row.
SELECT status, kind, count(*) AS n,
       coalesce(extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'ready' AND available_at <= now())), 0) AS lag_s
FROM {s}.outbox GROUP BY status, kind

-- name: waiting_for_people
-- Per tenant: tool calls waiting for a reviewer's decision (and the oldest one's wait, in
-- seconds), and runs with a row parked for an operator (quarantined or outcome unknown).
SELECT tenant_id, sum(approvals)::bigint, max(oldest_s)::float8, sum(parked)::bigint
FROM (
    SELECT a.tenant_id, count(*) AS approvals,
           extract(epoch FROM now() - min(a.created_at)) AS oldest_s, 0 AS parked
    FROM {s}.approvals a WHERE a.status = 'pending' GROUP BY a.tenant_id
    UNION ALL
    SELECT o.tenant_id, 0, 0, count(DISTINCT o.run_id)
    FROM {s}.outbox o WHERE o.status = 'quarantined' GROUP BY o.tenant_id
) w
GROUP BY tenant_id

-- name: traces_lag
-- Ended runs whose spans the trace exporter (outbox/trace_export.py) has not exported yet, and
-- how long the oldest has waited, in seconds (runs_agent_span_due, a partial index).
SELECT count(*), extract(epoch FROM now() - min(ended_at))::float8
FROM {s}.runs WHERE agent_span_due AND ended_at IS NOT NULL

-- name: finish_many
-- Fencing for many done rows at once: each row leaves the hot table only for its current
-- lease holder and attempt. Rows not returned were fenced off (their caller journals it).
-- Each row is found by primary key, a nested loop over the ids (not through the lease index,
-- whose dead entries grow with every finished row until vacuum); as in finish, the lease
-- holder stands for status = 'leased'.
DELETE FROM {s}.outbox o
USING unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS f(id, attempt)
WHERE o.id = f.id AND o.attempts = f.attempt AND o.lease_owner = %(worker)s
RETURNING o.id

-- name: mark_dispatched_many
-- mark_dispatched for many rows at once (relay.preparer batches the rows that need it):
-- each call is marked only while this worker holds the unexpired lease of that attempt.
-- Returns the calls marked; a call not returned must not be called.
UPDATE {s}.tool_calls tc
SET dispatched_attempt = m.attempt, dispatched_at = now(), gave_up_at = NULL,
    attempts = m.attempt, status = 'running', updated_at = now()
FROM unnest(%(ids)s::bigint[], %(refs)s::bigint[], %(attempts)s::int[]) AS m(id, ref, attempt)
WHERE tc.id = m.ref
  AND EXISTS (SELECT 1 FROM {s}.outbox o
              WHERE o.id = m.id AND o.lease_owner = %(worker)s AND o.attempts = m.attempt
                AND o.lease_expires_at > now()
              OFFSET 0)
RETURNING tc.id

-- name: prepare_turns
-- What each model turn needs before its call, for many turns in one statement: the run,
-- whether the step is already recorded, the thread's messages but the deleted ones, and
-- its calls (as outbox.history builds them; a message's reasoning items, kept verbatim), the
-- run's model options and its tools (the versions it pinned when it started, each with the
-- cap of its results the model is given;
-- for a run without pins, the newest visible to the tenant, its own before a shared one);
-- for a run with a max_tool_calls, the calls its turns asked for so far; the routing rules it
-- was pinned to (outbox/routing.py); and what outbox.context needs: the thread's latest
-- summary (and only the messages after it) when the run compacts (outbox.context.mode: a
-- run whose truncation is disabled or last_messages sees the whole thread, whatever an
-- earlier run of the thread summarised), the model's window and output from the
-- catalogue, the tenant's and the platform's prompt budgets, and the input tokens the model
-- reported for the run's previous turn (NULL when that turn compacted: its usage counts its
-- summary requests too).
-- Each lookup goes through an index by run, thread or name, so a batch costs what its turns
-- read, however many runs and calls the tables hold: a thread's calls through its messages
-- (tool_calls_message_fk keeps a call in its message's thread; tool_calls has no index by
-- thread), and the runs one by primary key a turn (OFFSET 0 keeps the planner from hashing
-- the whole runs table).
SELECT w.run_id, w.step_no, r.status, r.tenant_id, r.thread_id, r.api, r.model,
       r.instructions, r.base_url, r.model_options, r.route_version,
       r.max_tokens - r.tokens_used AS tokens_left,
       (SELECT mr.rules FROM {s}.model_routes mr
        WHERE mr.tenant_id = r.tenant_id AND mr.version = r.route_version) AS route_rules,
       cp.through_seq, cp.summary, mc.context_window, mc.max_output_tokens,
       tb.max_prompt_tokens AS tenant_prompt_tokens,
       rd.max_prompt_tokens AS platform_prompt_tokens,
       (SELECT mt.input_tokens FROM {s}.model_turns mt
        WHERE mt.run_id = w.run_id AND mt.step_no = w.step_no - 1
          AND NOT EXISTS (SELECT 1 FROM {s}.compactions k
                          WHERE k.run_id = w.run_id AND k.step_no = w.step_no - 1))
           AS last_input_tokens,
       EXISTS (SELECT 1 FROM {s}.model_turns mt
               WHERE mt.run_id = w.run_id AND mt.step_no = w.step_no) AS recorded,
       CASE WHEN r.model_options ? 'max_tool_calls'
            THEN (SELECT count(*) FROM {s}.tool_calls c WHERE c.run_id = r.id) END AS calls_made,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'id', m.id, 'role', m.role,
                   'content', {s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref),
                   'answers_call', tc.tool_call_id, 'reasoning', m.reasoning, 'seq', m.seq)
                   ORDER BY m.seq), '[]')
        FROM {s}.messages m
        LEFT JOIN {s}.tool_calls tc ON tc.id = m.tool_call_ref
        WHERE m.thread_id = r.thread_id AND m.deleted_at IS NULL
          AND (cp.through_seq IS NULL OR m.seq > cp.through_seq)) AS messages,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'message_id', c.message_id, 'tool_call_id', c.tool_call_id,
                   'tool_name', c.tool_name,
                   'arguments_raw', {s}.resolved_text_v1(c.arguments_raw, c.tenant_id,
                                                         c.arguments_ref))
                   ORDER BY c.message_id, c.position), '[]')
        FROM {s}.messages cm JOIN {s}.tool_calls c ON c.message_id = cm.id
        WHERE cm.thread_id = r.thread_id) AS calls,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'name', t.name, 'description', t.description,
                   'json_schema', t.json_schema, 'model_result_cap', t.model_result_cap)
                   ORDER BY t.name), '[]')
        FROM (SELECT DISTINCT ON (tl.name) * FROM {s}.tools tl
              WHERE tl.name = ANY(r.tool_names) AND tl.tenant_id IN (r.tenant_id, '*')
                AND (NOT r.tool_pins ? tl.name
                     OR (tl.tenant_id = r.tool_pins -> tl.name ->> 'tenant_id'
                         AND tl.version = (r.tool_pins -> tl.name ->> 'version')::int))
              ORDER BY tl.name, (tl.tenant_id = '*'), tl.version DESC) t) AS tools
FROM unnest(%(run_ids)s::uuid[], %(steps)s::int[]) AS w(run_id, step_no)
JOIN LATERAL (SELECT * FROM {s}.runs WHERE id = w.run_id OFFSET 0) r ON true
LEFT JOIN LATERAL (SELECT c.through_seq, c.summary FROM {s}.compactions c
                   WHERE c.thread_id = r.thread_id
                     AND r.model_options ->> 'truncation' IS DISTINCT FROM 'disabled'
                     AND r.model_options -> 'truncation_strategy' ->> 'type'
                         IS DISTINCT FROM 'last_messages'
                   ORDER BY c.through_seq DESC LIMIT 1) cp ON true
LEFT JOIN {s}.model_catalogue mc ON mc.model = r.model
LEFT JOIN {s}.tenant_budgets tb ON tb.tenant_id = r.tenant_id
LEFT JOIN {s}.run_defaults rd ON true

-- name: model_routing_state
-- What routes the turns of a batch besides their runs (outbox/routing.py): every model's
-- fallback and the circuits that are not clean (open, half-open, or closed with failures
-- counted), each with whether its probe may be taken now and the seconds until it may
-- (half-open: its probe is out, a cool-down until it is known); and the models whose
-- requests carry no derived prompt_cache_key (outbox/providers.py), whichever model a
-- turn goes to.
-- These tables hold a row per model or base URL: a few rows, read once per batch.
SELECT (SELECT coalesce(jsonb_object_agg(f.model, to_jsonb(f)), '{}')
        FROM {s}.model_fallbacks f) AS fallbacks,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'base_url', c.base_url, 'state', c.state, 'failures', c.failures,
                   'probe_due',
                   (c.state = 'open'
                    AND c.opened_at + make_interval(secs => c.cool_down_s) <= now())
                   OR (c.state = 'half_open'
                       AND c.probe_at + make_interval(secs => c.probe_timeout_s) <= now()),
                   'wait_s',
                   CASE WHEN c.state = 'open'
                        THEN greatest(0, extract(epoch FROM c.opened_at
                                                 + make_interval(secs => c.cool_down_s)
                                                 - now()))
                        WHEN c.state = 'half_open' THEN c.cool_down_s
                        ELSE 0 END)), '[]')
        FROM {s}.model_circuits c WHERE c.state <> 'closed' OR c.failures > 0) AS circuits,
       (SELECT coalesce(jsonb_object_agg(mc.model, mc.prompt_cache_key), '{}')
        FROM {s}.model_catalogue mc WHERE mc.prompt_cache_key <> 'derived') AS cache_keys

-- name: claim_model_probe
-- Take the probe of an open circuit whose cool-down is over (claim_model_probe_v1).
SELECT {s}.claim_model_probe_v1(%(base_url)s)

-- name: report_model_calls
-- The failed and answered model calls of a completer's transaction, per base URL: the
-- circuits this changed (report_model_calls_v1).
SELECT * FROM {s}.report_model_calls_v1(%(base_urls)s, %(failed)s, %(answered)s)

-- name: circuits_not_closed
-- Of these base URLs, those whose circuit is open or half-open, as this transaction's
-- reports left them: a failed turn's next attempt goes past them to its fallback.
SELECT c.base_url FROM {s}.model_circuits c
WHERE c.base_url = ANY(%(base_urls)s) AND c.state <> 'closed'

-- name: webhook_done
-- A webhook delivery answered (delivered_at, the receiver's status) or dropped (its
-- endpoint removed: delivered_at stays NULL); attempts: how many it took.
UPDATE {s}.webhook_deliveries
SET delivered_at = CASE WHEN %(delivered)s THEN now() END,
    status_code = %(status_code)s, attempts = %(attempt)s
WHERE id = %(delivery_id)s

-- name: insert_orphan
-- Keep a result that may enter no context (its attempt fenced off, its batch closed) with
-- its call's tenant, run and batch (keep_orphaned_results_v1, sql/results.sql).
SELECT id FROM {s}.keep_orphaned_results_v1(jsonb_build_array(jsonb_build_object(
    'ref', %(tool_call_ref)s::bigint, 'status', %(status)s::text, 'output', %(output)s::jsonb,
    'error', %(error)s::text, 'reason', %(reason)s::text, 'source', %(source)s::text,
    'attempt', %(attempt)s::integer)))

-- name: read_results
-- The stored tool results read_result pages (outbox/context.py), each by its message id and
-- only in the thread and tenant of the call that asks: a handle of another thread or tenant
-- finds nothing.
SELECT w.i, {s}.resolved_text_v1(m.content, m.tenant_id, m.content_ref) AS content
FROM unnest(%(ids)s::bigint[], %(tenants)s::text[], %(threads)s::uuid[])
     WITH ORDINALITY AS w(id, tenant_id, thread_id, i)
JOIN {s}.messages m ON m.id = w.id AND m.tenant_id = w.tenant_id AND m.thread_id = w.thread_id
WHERE m.role = 'tool' AND m.deleted_at IS NULL
