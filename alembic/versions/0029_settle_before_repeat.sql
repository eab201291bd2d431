-- 0029: no lookup and no resend while an abandoned request may still take effect.
-- Frozen: what revision 0029 applies, forever.
--
-- A request the relay sent keeps running at the tool after its sender died or gave up:
-- a lookup made while it runs answers "not found" and a resend acts a second time. So the
-- time an attempt may have reached the tool is kept with the call (dispatched_at, the
-- database's clock, written with the dispatch mark), and each tool version says how long
-- after its timeout a request may still take effect (settle_s). The relay makes no lookup
-- and no resend before dispatched_at + timeout_s + settle_s.
--
-- A lookup-mode tool needs somewhere to look: the constraint held only for http tools,
-- so a python tool in lookup mode was called again after an ambiguous attempt. It now
-- holds for every executor. Versions registered so before become 'none', which is what
-- the relay makes of their ambiguous attempts from now on (outcome unknown: never called
-- again on a guess), also for their calls already planned as 'lookup'.

ALTER TABLE {s}.tools
    ADD COLUMN settle_s double precision NOT NULL DEFAULT 5
        CONSTRAINT tools_settle_s_range CHECK (settle_s >= 0 AND settle_s <= 3600);
COMMENT ON COLUMN {s}.tools.settle_s IS
    'seconds after its timeout that a request the relay gave up on may still take effect '
    'at the tool: no lookup and no resend of its call before dispatch + timeout_s + settle_s';

ALTER TABLE {s}.tool_calls ADD COLUMN dispatched_at timestamptz;
COMMENT ON COLUMN {s}.tool_calls.dispatched_at IS
    'when attempt dispatched_attempt was marked as possibly reaching the tool (now() of '
    'the database, just before the request was sent); NULL once the tool answered it';
-- Calls marked before this revision and not ended: their request may still be at the tool.
UPDATE {s}.tool_calls SET dispatched_at = updated_at
WHERE dispatched_attempt IS NOT NULL
  AND status NOT IN ('succeeded', 'failed', 'cancelled', 'outcome_unknown');

UPDATE {s}.tools SET idempotency_mode = 'none'
WHERE idempotency_mode = 'lookup' AND lookup_endpoint IS NULL;
ALTER TABLE {s}.tools DROP CONSTRAINT tools_lookup_has_endpoint;
ALTER TABLE {s}.tools ADD CONSTRAINT tools_lookup_has_endpoint
    CHECK (idempotency_mode <> 'lookup' OR lookup_endpoint IS NOT NULL);
