ALTER TABLE {s}.runs DROP CONSTRAINT runs_tenant_idempotency_key;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_tenant_idempotency_key
    UNIQUE (tenant_id, idempotency_key);
DROP INDEX {s}.runs_tenant_status;
CREATE INDEX runs_tenant_status ON {s}.runs (tenant_id, status, created_at);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_idempotency_key;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_idempotency_key
    UNIQUE (tenant_id, idempotency_key);
