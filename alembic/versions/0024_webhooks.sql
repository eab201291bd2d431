-- 0024: signed webhooks per tenant, delivered through the outbox (one more kind, 'webhook').
-- Frozen: what revision 0024 applies, forever.

-- An endpoint a tenant's run events are POSTed to. Its signing secret is kept encrypted
-- with the relay's key ($OUTBOX_CREDENTIALS_KEY, as credentials stored in the database);
-- events: the event names it wants ('run.completed', ...), all run events when empty.
CREATE TABLE {s}.webhook_endpoints (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text NOT NULL CHECK (tenant_id <> '*' AND tenant_id <> ''),
    url         text NOT NULL CHECK (url ~ '^https?://'),
    events      text[] NOT NULL DEFAULT '{}',
    ciphertext  text NOT NULL,
    created_by  text NOT NULL DEFAULT session_user,
    created_at  timestamptz NOT NULL DEFAULT now(),
    rotated_at  timestamptz,
    removed_at  timestamptz
);
CREATE INDEX webhook_endpoints_tenant ON {s}.webhook_endpoints (tenant_id)
    WHERE removed_at IS NULL;
COMMENT ON TABLE {s}.webhook_endpoints IS
    'webhook endpoints per tenant: run events are POSTed there, signed (Standard Webhooks), '
    'through the outbox; the secret is encrypted with the relay''s key';

-- One row per event and endpoint: the unique key is what makes a status change enqueue
-- one delivery, whatever runs twice. event_key = run id, event, and the how-many-th time
-- this run entered that status (a run may wait in requires_action more than once).
CREATE TABLE {s}.webhook_deliveries (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  uuid NOT NULL REFERENCES {s}.webhook_endpoints (id),
    tenant_id    text NOT NULL,
    run_id       uuid NOT NULL,
    event        text NOT NULL,
    event_key    text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    status_code  integer,
    attempts     integer NOT NULL DEFAULT 0,
    CONSTRAINT webhook_deliveries_once UNIQUE (endpoint_id, event_key)
);
CREATE INDEX webhook_deliveries_run ON {s}.webhook_deliveries (run_id);
COMMENT ON TABLE {s}.webhook_deliveries IS
    'one row per webhook event and endpoint (unique): when it was delivered and how';

-- The outbox takes the new kind; its dedup key names the delivery.
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_kind_check;
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_kind_check
    CHECK (kind IN ('model_turn', 'tool_call', 'deliver_batch', 'webhook'));
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_dedup_key_names_its_row;
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_dedup_key_names_its_row CHECK (coalesce(
    CASE kind
        WHEN 'tool_call' THEN dedup_key = 'tool_call:' || tool_call_ref
        WHEN 'deliver_batch' THEN dedup_key = 'deliver:' || batch_id
        WHEN 'model_turn' THEN dedup_key LIKE 'model_turn:' || run_id || ':%'
        WHEN 'webhook' THEN dedup_key LIKE 'webhook:%' AND run_id IS NULL
    END, false));

-- webhook_enqueue: in the transaction that changes a run's status, one delivery per
-- endpoint of the run's tenant that wants the event ('run.' || status). The outbox row
-- carries no run_id (ending a run drops its ready rows; a delivery must outlive that): the
-- run is named in its payload. Runs as the schema owner (SECURITY DEFINER) so a writer
-- that may change runs needs no rights on the webhook tables.
CREATE FUNCTION {s}.webhook_enqueue() RETURNS trigger
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
            WHERE d.endpoint_id = v_endpoint.id AND d.run_id = NEW.id AND d.event = v_event));
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
CREATE TRIGGER webhook_enqueue_insert AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.webhook_enqueue();
CREATE TRIGGER webhook_enqueue_update AFTER UPDATE OF status ON {s}.runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {s}.webhook_enqueue();

-- Tenant isolation as for every tenant table; the relay reads endpoints (to deliver) and
-- records deliveries.
ALTER TABLE {s}.webhook_endpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.webhook_endpoints FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.webhook_endpoints TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.webhook_endpoints TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.webhook_endpoints FOR SELECT TO outbox_auditor USING (true);

ALTER TABLE {s}.webhook_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.webhook_deliveries FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.webhook_deliveries TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.webhook_deliveries TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.webhook_deliveries FOR SELECT TO outbox_auditor USING (true);

GRANT SELECT ON {s}.webhook_endpoints TO outbox_relay, outbox_auditor;
GRANT SELECT, UPDATE ON {s}.webhook_deliveries TO outbox_relay;
GRANT SELECT ON {s}.webhook_deliveries TO outbox_auditor, outbox_api;
