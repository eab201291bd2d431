-- journal_notify: every journal event of a run sends a NOTIFY on the channel outbox_journal
-- from the transaction that wrote it (delivered when it commits; identical payloads fold
-- into one per transaction, so a transaction that journals ten events of a run sends one).
-- The payload is ids, never the event's detail:
--   {"schema": "outbox", "tenant_id": "...", "run_id": "..."}
-- A run's timeline in the console and the API's run event stream wake on it (one LISTEN
-- per server process) instead of reading the journal on a timer. SET outbox.run_notify =
-- 'off' switches it off with run_notify. A row trigger on the partitioned journal is
-- cloned onto every partition, those journal_partitions_v1 makes later too.
CREATE OR REPLACE FUNCTION {s}.journal_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.run_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_journal', json_build_object(
            'schema', TG_TABLE_SCHEMA,
            'tenant_id', NEW.tenant_id,
            'run_id', NEW.run_id)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER journal_notify AFTER INSERT ON {s}.journal
    FOR EACH ROW WHEN (NEW.run_id IS NOT NULL) EXECUTE FUNCTION {s}.journal_notify();
