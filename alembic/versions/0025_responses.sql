-- 0025: the objects of OpenAI's Responses protocol for `outbox serve`. Frozen: what
-- revision 0025 applies, forever.
--
-- A response is a stretch of a run: the run a request started, or the same run carried on
-- by a request that answered its client function calls (function_call_output items).
-- Its output is what the run wrote to its thread from output_from_seq on, up to where the
-- next response of the run begins. A conversation is a thread.
CREATE TABLE {s}.responses (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id            text NOT NULL,
    run_id               uuid NOT NULL,
    thread_id            uuid NOT NULL,
    previous_response_id uuid REFERENCES {s}.responses (id),
    in_conversation      boolean NOT NULL DEFAULT false,
    output_from_seq      integer NOT NULL,
    input                jsonb NOT NULL DEFAULT '[]',
    model                text NOT NULL,
    instructions         text,
    tools                jsonb NOT NULL DEFAULT '[]',
    metadata             jsonb NOT NULL DEFAULT '{}',
    background           boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT responses_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    CONSTRAINT responses_thread_fk FOREIGN KEY (thread_id, tenant_id)
        REFERENCES {s}.threads (id, tenant_id)
);
CREATE INDEX responses_run ON {s}.responses (run_id, output_from_seq);
CREATE INDEX responses_thread ON {s}.responses (thread_id, created_at);
COMMENT ON TABLE {s}.responses IS
    'responses of the Responses protocol (outbox serve): each a stretch of a run, with the '
    'input items the request gave';

ALTER TABLE {s}.responses ENABLE ROW LEVEL SECURITY;
ALTER TABLE {s}.responses FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {s}.responses TO PUBLIC
    USING (tenant_id = {s}.current_tenant_v1())
    WITH CHECK (tenant_id = {s}.current_tenant_v1());
CREATE POLICY all_tenants ON {s}.responses TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {s}.responses FOR SELECT TO outbox_auditor USING (true);
GRANT SELECT, INSERT ON {s}.responses TO outbox_api;
GRANT SELECT ON {s}.responses TO outbox_auditor;
