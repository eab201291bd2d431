-- 0038: a deadline by which a call of a tool must have been sent.
-- Frozen: what revision 0038 applies, forever.
--
-- An attempt that certainly never reached the tool (a refused connection, a session that
-- could not be opened, 408/429/503) is an infrastructure failure, not the tool's: with a
-- deadline it is not charged against max_attempts, and the deadline is what bounds such
-- retries instead, so a server that stays down is not retried forever. deadline_s counts
-- from the call's creation (when the model asked for it, tool_calls.created_at, by the
-- database's clock); no attempt of the call is sent after it (docs/relay.md, "Deadlines").
-- NULL: no deadline, and unsent attempts are charged as before.

ALTER TABLE {s}.tools
    ADD COLUMN deadline_s double precision
        CONSTRAINT tools_deadline_s_range CHECK (deadline_s > 0 AND deadline_s <= 604800);
COMMENT ON COLUMN {s}.tools.deadline_s IS
    'seconds after a call of this tool was made by which an attempt of it must have been '
    'sent (NULL: none); unsent attempts before it are not charged against max_attempts';

ALTER TABLE {s}.mcp_servers
    ADD COLUMN deadline_s double precision
        CONSTRAINT mcp_servers_deadline_s_range CHECK (deadline_s > 0 AND deadline_s <= 604800);
COMMENT ON COLUMN {s}.mcp_servers.deadline_s IS
    'the deadline_s of the tools this server lists (NULL: none)';
GRANT SELECT (deadline_s) ON {s}.mcp_servers TO outbox_auditor;
