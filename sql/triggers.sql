-- Triggers: the rules the database enforces on every write, whoever writes (the writer
-- API, the relay, the SQL API, an ORM, a DBA by hand), each beside its trigger function.
-- `{s}` is the schema.
--
-- This file is every trigger and trigger function as the newest migration leaves them
-- (tests/migration/test_history.py checks it, and that nothing the migrations create is
-- missing here). Each migration carries a frozen copy of what it creates: to change one,
-- edit it here and add a migration that carries the change.
--
-- Applied after the function files (a guard calls run_active_v1). Re-applying changes nothing:
-- the functions are CREATE OR REPLACE, and so are the triggers (PostgreSQL 14), but for the
-- one constraint trigger, which PostgreSQL cannot replace: it is dropped if present and
-- created again.
--
-- A trigger that reads or writes another table names the row's tenant there: on one server
-- an equality on a key's column, on a cluster distributed by tenant a statement of one
-- shard, on the node that holds the row (docs/scale.md, "Triggers under Citus").


-- The journal is append-only, whoever asks, on every partition (the row trigger is cloned
-- onto each partition, and each partition has its own TRUNCATE
-- trigger, made with it). journal_refuse_change refuses UPDATE and TRUNCATE, and every
-- DELETE but through two doors, each opened by an event written earlier in the same
-- transaction: prune_journal's journal.pruned (its id in outbox.journal_prune) lets
-- through rows older than the event's cut-off, in the default partition and
-- journal_upto_YYYYMMDD only (whole days are dropped); retain_v1's
-- thread.retained (its id in outbox.journal_retain) lets through rows of runs, and
-- run-less rows of threads, that no longer exist (what it has just retained), but never a
-- thread.retained or thread.erased event. So no deletion goes unjournaled: a
-- hand-set flag with no such event, or an event of another transaction, opens nothing.
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_flag text := current_setting('outbox.journal_prune', true);
    v_retain text := current_setting('outbox.journal_retain', true);
    v_xact text := (pg_current_xact_id()::text::bigint & 4294967295)::text;
    v_before timestamptz;
BEGIN
    IF TG_OP = 'DELETE' AND v_flag ~ '^[0-9]{1,18}$'
       AND (TG_TABLE_NAME = 'journal_default' OR TG_TABLE_NAME ~ '^journal_upto_[0-9]{8}$') THEN
        SELECT (j.detail->>'before')::timestamptz INTO v_before FROM {s}.journal j
        WHERE j.id = v_flag::bigint AND j.at >= now() AND j.event = 'journal.pruned'
          AND j.xmin::text = v_xact;
        IF v_before IS NOT NULL AND OLD.at < v_before THEN
            RETURN OLD;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' AND v_retain ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT 1 FROM {s}.journal j
                   WHERE j.id = v_retain::bigint AND j.at >= now()
                     AND j.event = 'thread.retained' AND j.xmin::text = v_xact)
       AND (CASE WHEN OLD.run_id IS NOT NULL
                 THEN NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.id = OLD.run_id)
                 ELSE OLD.thread_id IS NOT NULL
                      AND OLD.event NOT IN ('thread.retained', 'thread.erased')
                      AND NOT EXISTS (SELECT 1 FROM {s}.threads t WHERE t.id = OLD.thread_id)
            END) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;
-- journal_no_update_delete: refuses changing or deleting a journal row.
CREATE OR REPLACE TRIGGER journal_no_update_delete BEFORE UPDATE OR DELETE ON {s}.journal
    FOR EACH ROW EXECUTE FUNCTION {s}.journal_refuse_change();
-- journal_no_truncate: refuses emptying the journal at once.
CREATE OR REPLACE TRIGGER journal_no_truncate BEFORE TRUNCATE ON {s}.journal
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_refuse_change();
-- journal_no_truncate on each partition: a statement trigger is not cloned, and a partition
-- can be named on its own (journal_partitions_v1 gives every new day its own).
DO $$
DECLARE
    v_part regclass;
BEGIN
    FOR v_part IN SELECT i.inhrelid::regclass FROM pg_inherits i
                  WHERE i.inhparent = '{s}.journal'::regclass LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER journal_no_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION {s}.journal_refuse_change()', v_part);
    END LOOP;
END $$;


-- outbox_notify: wakes the relays (NOTIFY outbox_ready, the schema as payload) once per
-- statement that inserts outbox rows; identical payloads fold into one per transaction,
-- sent at commit. SET outbox.notify = 'off' (session, role or database) switches it off:
-- a transaction that notified takes a global lock at commit, and relays that only poll
-- (--no-listen, behind a pooler in transaction mode) need no wake-up.
CREATE OR REPLACE FUNCTION {s}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_ready', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON {s}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.outbox_notify();


-- outbox_refs_in_tenant: an outbox row names only a thread, run, batch and tool call of
-- its own tenant (foreign keys are checked beyond row-level security, so a row could
-- otherwise point at another tenant's objects by id); refused as a foreign_key_violation.
CREATE OR REPLACE FUNCTION {s}.outbox_refs_in_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    missing text;
BEGIN
    IF NEW.thread_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.threads
            WHERE id = NEW.thread_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('thread %s', NEW.thread_id);
    ELSIF NEW.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.runs
            WHERE id = NEW.run_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('run %s', NEW.run_id);
    ELSIF NEW.batch_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.tool_batches
            WHERE id = NEW.batch_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('batch %s', NEW.batch_id);
    ELSIF NEW.tool_call_ref IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.tool_calls
            WHERE id = NEW.tool_call_ref AND tenant_id = NEW.tenant_id) THEN
        missing := format('tool call %s', NEW.tool_call_ref);
    END IF;
    IF missing IS NOT NULL THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('outbox row of tenant %L names %s, which is not %L''s',
                             NEW.tenant_id, missing, NEW.tenant_id),
            HINT = 'enqueue work through the writer API, for rows of the tenant in scope';
    END IF;
    RETURN NULL;
END $$;
-- A constraint trigger runs after the row's own checks (row-level security first).
DROP TRIGGER IF EXISTS outbox_refs_in_tenant ON {s}.outbox;
CREATE CONSTRAINT TRIGGER outbox_refs_in_tenant
    AFTER INSERT OR UPDATE OF tenant_id, thread_id, run_id, batch_id, tool_call_ref
    ON {s}.outbox FOR EACH ROW EXECUTE FUNCTION {s}.outbox_refs_in_tenant();


-- run_notify: tells backends without polling. Every change of a run's status sends a NOTIFY
-- on the channel outbox_runs, from the transaction that made it: delivered when that
-- transaction commits, never for one rolled back. The payload is a small JSON object (ids
-- and statuses, never content):
--   {"schema": "outbox", "tenant_id": "...", "thread_id": "...", "run_id": "...",
--    "status": "requires_action", "previous_status": "in_progress"}
-- (previous_status is null for a new run). LISTEN is not subject to row-level security:
-- a connection that listens sees every tenant's ids and statuses (docs/serve.md says what
-- to use instead where tenants must not learn of each other). SET outbox.run_notify = 'off'
-- (session, role or database) switches it off, e.g. for a bulk import.
CREATE OR REPLACE FUNCTION {s}.run_notify() RETURNS trigger
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
-- run_notify_insert: a new run's first status.
CREATE OR REPLACE TRIGGER run_notify_insert AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.run_notify();
-- run_notify_update: every later change of status.
CREATE OR REPLACE TRIGGER run_notify_update AFTER UPDATE OF status ON {s}.runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.run_notify();


-- approval_notify: every approval requested or decided (inserted, or its status changed)
-- sends a NOTIFY on the channel outbox_approvals from the transaction that made it
-- (delivered when it commits). The payload is ids and the status, never arguments:
--   {"schema": "outbox", "tenant_id": "...", "run_id": "...", "approval_id": 42,
--    "status": "pending"}
-- The console's inbox wakes on it (one LISTEN per server process). SET outbox.run_notify
-- = 'off' switches it off with run_notify.
CREATE OR REPLACE FUNCTION {s}.approval_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.run_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_approvals', json_build_object(
            'schema', TG_TABLE_SCHEMA,
            'tenant_id', NEW.tenant_id,
            'run_id', NEW.run_id,
            'approval_id', NEW.id,
            'status', NEW.status)::text);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER approval_notify_insert AFTER INSERT ON {s}.approvals
    FOR EACH ROW EXECUTE FUNCTION {s}.approval_notify();
CREATE OR REPLACE TRIGGER approval_notify_update AFTER UPDATE OF status ON {s}.approvals
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.approval_notify();


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


-- webhook_enqueue: in the transaction that changes a run's status, one delivery per
-- endpoint of the run's tenant that wants the event ('run.' || status), each an outbox row
-- of kind webhook, deduplicated by its event key. The outbox row carries no run_id (ending
-- a run drops its ready rows; a delivery must outlive that): the run is named in its
-- payload. Runs as the schema owner (SECURITY DEFINER) so a writer that may change runs
-- needs no rights on the webhook tables; nobody executes it but as a trigger.
CREATE OR REPLACE FUNCTION {s}.webhook_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_event    text := 'run.' || NEW.status;
    v_endpoint {s}.webhook_endpoints;
    v_key      text;
    v_delivery bigint;
BEGIN
    FOR v_endpoint IN
        SELECT * FROM {s}.webhook_endpoints e
        WHERE e.tenant_id = NEW.tenant_id AND e.removed_at IS NULL
          AND (e.events = '{}' OR v_event = ANY(e.events))
        ORDER BY e.id
    LOOP
        v_key := NEW.id || ':' || v_event || ':' || (1 + (
            SELECT count(*) FROM {s}.webhook_deliveries d
            WHERE d.endpoint_id = v_endpoint.id AND d.run_id = NEW.id AND d.event = v_event
              AND d.tenant_id = NEW.tenant_id));
        INSERT INTO {s}.webhook_deliveries (endpoint_id, tenant_id, run_id, event, event_key)
        VALUES (v_endpoint.id, NEW.tenant_id, NEW.id, v_event, v_key)
        ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO NOTHING
        RETURNING id INTO v_delivery;
        CONTINUE WHEN v_delivery IS NULL;
        INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, correlation_id, max_attempts,
                                payload)
        VALUES (NEW.tenant_id, 'webhook', 'webhook:' || v_endpoint.id || ':' || v_key,
                NEW.correlation_id, 8,
                jsonb_build_object(
                    'delivery_id', v_delivery, 'endpoint_id', v_endpoint.id,
                    'event_key', v_key,
                    'body', jsonb_build_object(
                        'type', v_event,
                        'timestamp', to_char(now() AT TIME ZONE 'UTC',
                                             'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                        'data', jsonb_build_object(
                            'object', 'run', 'id', NEW.id, 'tenant_id', NEW.tenant_id,
                            'thread_id', NEW.thread_id, 'status', NEW.status,
                            'previous_status',
                            CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                            'failure_reason', NEW.failure_reason))));
    END LOOP;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION {s}.webhook_enqueue() FROM PUBLIC;
-- webhook_enqueue_insert: a new run's first status (run.queued).
CREATE OR REPLACE TRIGGER webhook_enqueue_insert AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.webhook_enqueue();
-- webhook_enqueue_update: every later change of status.
CREATE OR REPLACE TRIGGER webhook_enqueue_update AFTER UPDATE OF status ON {s}.runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.webhook_enqueue();


-- thread_delete_guard: a thread is deleted (deleted_at set) only once no run of it is
-- active (cancel first), so a deleted thread never has a run the relay still works on.
-- The library checks this under the thread's lock for a clear error; this makes it a
-- rule of the database, also for a deleted_at set by hand (OB001, naming the run).
CREATE OR REPLACE FUNCTION {s}.thread_delete_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_active {s}.runs;
BEGIN
    SELECT * INTO v_active FROM {s}.runs r
    WHERE r.thread_id = NEW.id AND r.tenant_id = NEW.tenant_id AND {s}.run_active_v1(r.status);
    IF FOUND THEN
        RAISE EXCEPTION 'thread % has active run % (%): it cannot be deleted',
                        NEW.id, v_active.id, v_active.status
            USING ERRCODE = 'OB001',
                  DETAIL = json_build_object('thread_id', NEW.id, 'run_id', v_active.id,
                                            'status', v_active.status)::text,
                  HINT = 'cancel the run first, or wait for it to end';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER thread_delete_guard BEFORE UPDATE OF deleted_at ON {s}.threads
    FOR EACH ROW WHEN (NEW.deleted_at IS NOT NULL AND OLD.deleted_at IS NULL)
    EXECUTE FUNCTION {s}.thread_delete_guard();


-- message_delete_guard: a message is deleted (hidden from the API and from every later
-- replay) only when that keeps the history well-formed: never the
-- assistant turn that asked for tool calls, whose results would be left without their
-- call (OB007). The CHECK messages_deleted_only_plain refuses the rest (tool results).
CREATE OR REPLACE FUNCTION {s}.message_delete_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A model turn's calls carry its run: by the run's index; a message of no run
    -- (imported or added through the API) by its thread.
    IF EXISTS (SELECT 1 FROM {s}.tool_calls tc
               WHERE tc.message_id = NEW.id AND tc.tenant_id = NEW.tenant_id
                 AND (CASE WHEN NEW.run_id IS NULL THEN tc.thread_id = NEW.thread_id
                           ELSE tc.run_id = NEW.run_id END)) THEN
        RAISE EXCEPTION 'message % carries tool calls: it cannot be deleted', NEW.id
            USING ERRCODE = 'OB007',
                  HINT = 'deleting it would leave the results of its calls without the call that asked for them';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER message_delete_guard BEFORE UPDATE OF deleted_at ON {s}.messages
    FOR EACH ROW WHEN (NEW.deleted_at IS NOT NULL AND OLD.deleted_at IS NULL)
    EXECUTE FUNCTION {s}.message_delete_guard();


-- orphaned_results_erased: a result that arrives for an erased thread (a call that was
-- still running when erase_thread_v1 cancelled its run) is kept without its content:
-- output removed, an error text replaced by 'erased'.
CREATE OR REPLACE FUNCTION {s}.orphaned_results_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.runs r
               JOIN {s}.threads t ON t.id = r.thread_id AND t.tenant_id = r.tenant_id
               WHERE r.id = NEW.run_id AND r.tenant_id = NEW.tenant_id
                 AND t.erased_at IS NOT NULL)
       OR EXISTS (SELECT 1 FROM {s}.tool_calls c
                  JOIN {s}.threads t ON t.id = c.thread_id AND t.tenant_id = c.tenant_id
                  WHERE c.id = NEW.tool_call_ref AND c.tenant_id = NEW.tenant_id
                    AND t.erased_at IS NOT NULL) THEN
        NEW.output := NULL;
        NEW.error := CASE WHEN NEW.error IS NOT NULL THEN 'erased' END;
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER orphaned_results_erased BEFORE INSERT ON {s}.orphaned_results
    FOR EACH ROW EXECUTE FUNCTION {s}.orphaned_results_erased();


-- payload_by_reference: a body above payload_inline_max_v1() bytes is stored once in
-- payloads (payload_put_v1, payloads.sql) and its row keeps the reference: a call's raw
-- arguments (when they parse: arguments unparsable stay inline, as the model sent them),
-- a result's output (tool_results, orphaned_results), a tool message's text. Whoever
-- writes, the same: the writer API, the relay, the SQL API, an ORM. The WHEN conditions
-- keep small bodies from calling it at all; a result's is a bound (a JSON text is at most
-- six times its binary size), the function checks the text's size itself. Runs as the
-- schema owner (SECURITY DEFINER): writers hold no right on payloads.
CREATE OR REPLACE FUNCTION {s}.payload_by_reference() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_max  integer := {s}.payload_inline_max_v1();
    v_body text;
BEGIN
    IF TG_TABLE_NAME = 'tool_calls' THEN
        IF NEW.arguments IS NOT NULL AND octet_length(NEW.arguments_raw) > v_max THEN
            NEW.arguments_ref := {s}.payload_put_v1(NEW.tenant_id, NEW.arguments_raw);
            NEW.arguments_raw := '';
            NEW.arguments := NULL;
        END IF;
    ELSIF TG_TABLE_NAME = 'messages' THEN
        IF octet_length(NEW.content) > v_max THEN
            NEW.content_ref := {s}.payload_put_v1(NEW.tenant_id, NEW.content);
            NEW.content := NULL;
        END IF;
    ELSE
        v_body := NEW.output::text;
        IF octet_length(v_body) > v_max THEN
            NEW.output_ref := {s}.payload_put_v1(NEW.tenant_id, v_body);
            NEW.output := NULL;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER tool_calls_payload BEFORE INSERT OR UPDATE OF arguments_raw
    ON {s}.tool_calls
    FOR EACH ROW WHEN (octet_length(NEW.arguments_raw) > {s}.payload_inline_max_v1())
    EXECUTE FUNCTION {s}.payload_by_reference();
CREATE OR REPLACE TRIGGER tool_results_payload BEFORE INSERT OR UPDATE OF output
    ON {s}.tool_results
    FOR EACH ROW WHEN (pg_column_size(NEW.output) * 6 > {s}.payload_inline_max_v1())
    EXECUTE FUNCTION {s}.payload_by_reference();
-- Named after orphaned_results_erased, so it runs after it (an erased thread's late result
-- keeps no body to store).
CREATE OR REPLACE TRIGGER orphaned_results_payload BEFORE INSERT OR UPDATE OF output
    ON {s}.orphaned_results
    FOR EACH ROW WHEN (pg_column_size(NEW.output) * 6 > {s}.payload_inline_max_v1())
    EXECUTE FUNCTION {s}.payload_by_reference();
CREATE OR REPLACE TRIGGER messages_payload BEFORE INSERT OR UPDATE OF content
    ON {s}.messages
    FOR EACH ROW WHEN (NEW.role = 'tool'
                       AND octet_length(NEW.content) > {s}.payload_inline_max_v1())
    EXECUTE FUNCTION {s}.payload_by_reference();


-- A run that ends is marked agent_span_due, whoever ends it (a model's last turn, a failure,
-- the expiry sweep, a cancel): the trace exporter (outbox/trace_export.py, `outbox traces
-- export`) takes the marked runs once they are committed and builds their spans from what
-- the database recorded, so no relay records a span. A run ended then continued (a new
-- turn on it) keeps its mark and is exported once it ends again: its lease is dropped, so
-- an exporter exporting its first end does not clear the mark of its second.
CREATE OR REPLACE FUNCTION {s}.runs_mark_span_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.agent_span_due := true;
    NEW.spans_taken_until := NULL;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER runs_span_due BEFORE UPDATE OF ended_at ON {s}.runs
    FOR EACH ROW WHEN (OLD.ended_at IS NULL AND NEW.ended_at IS NOT NULL)
    EXECUTE FUNCTION {s}.runs_mark_span_due();


-- A run is pinned when it is created to its tenant's newest routing rules (model_routes,
-- outbox/routing.py), as it is to its tools' versions: rules changed later never change
-- which model a running run's turns go to. Every path that starts a run (the writer API,
-- the SQL API, `outbox serve`) inserts the row, so the pin is taken here. Runs as the schema
-- owner (SECURITY DEFINER): writers hold no right on model_routes.
CREATE OR REPLACE FUNCTION {s}.runs_pin_route() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.route_version IS NULL THEN
        NEW.route_version := (SELECT max(mr.version) FROM {s}.model_routes mr
                              WHERE mr.tenant_id = NEW.tenant_id);
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER runs_pin_route BEFORE INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.runs_pin_route();
