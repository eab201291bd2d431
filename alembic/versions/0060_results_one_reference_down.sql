-- 0060 down: tool_results' two foreign keys (call, batch) and its batch index again, and
-- tool_calls' plain index on batch_id.

CREATE INDEX tool_results_batch ON {s}.tool_results (batch_id);
ALTER TABLE {s}.tool_results
    ADD CONSTRAINT tool_results_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
    REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.tool_results
    ADD CONSTRAINT tool_results_batch_fk FOREIGN KEY (batch_id, run_id, tenant_id)
    REFERENCES {s}.tool_batches (id, run_id, tenant_id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_call_batch_fk;

CREATE INDEX tool_calls_batch ON {s}.tool_calls (batch_id);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_batch_call_key;
