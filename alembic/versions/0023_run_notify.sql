-- 0023: backends told without polling. Every change of a run's status sends a NOTIFY on
-- the channel outbox_runs, from the transaction that made it: delivered when that
-- transaction commits, never for one rolled back. Frozen: what revision 0023 applies.
--
-- The payload is a small JSON object (ids and statuses, never content), well under
-- PostgreSQL's 8000-byte limit:
--   {"schema": "outbox", "tenant_id": "...", "thread_id": "...", "run_id": "...",
--    "status": "requires_action", "previous_status": "in_progress"}
-- (previous_status is null for a new run). LISTEN is not subject to row-level security:
-- a connection that listens sees every tenant's ids and statuses (docs/serve.md says what
-- to use instead where tenants must not learn of each other). SET outbox.run_notify = 'off'
-- (session, role or database) switches it off, e.g. for a bulk import.
CREATE FUNCTION {s}.run_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.run_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_runs', json_build_object(
            'schema', TG_TABLE_SCHEMA,
            'tenant_id', NEW.tenant_id,
            'thread_id', NEW.thread_id,
            'run_id', NEW.id,
            'status', NEW.status,
            'previous_status', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER run_notify_insert AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.run_notify();
CREATE TRIGGER run_notify_update AFTER UPDATE OF status ON {s}.runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.run_notify();
