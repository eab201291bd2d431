-- journal_notify: every statement that journals events of runs sends a NOTIFY on the channel
-- outbox_journal for each of those runs (delivered when the transaction commits; identical
-- payloads fold into one per transaction, so a transaction that journals ten events of a
-- run sends one). The payload is ids, never the event's detail:
--   {"schema": "outbox", "tenant_id": "...", "run_id": "..."}
-- A run's timeline in the console and the API's run event stream wake on it (one LISTEN
-- per server process) instead of reading the journal on a timer. Per statement, over the
-- statement's new rows, not per row: a completion journals a result of each of tens of
-- calls in one statement, and a trigger call per row cost the relay's result recording
-- about a fifth of its time (docs/sql-api.md). SET outbox.run_notify = 'off'
-- switches it off with run_notify.
CREATE OR REPLACE FUNCTION {s}.journal_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.run_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_journal', json_build_object(
            'schema', TG_TABLE_SCHEMA,
            'tenant_id', n.tenant_id,
            'run_id', n.run_id)::text)
        FROM (SELECT DISTINCT e.tenant_id, e.run_id FROM journal_new e
              WHERE e.run_id IS NOT NULL) n;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER journal_notify AFTER INSERT ON {s}.journal
    REFERENCING NEW TABLE AS journal_new
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_notify();
