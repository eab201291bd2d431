-- 0060: a tool result references its call, batch and run through one foreign key.
-- Frozen: what revision 0060 applies, forever.
--
-- tool_results had two foreign keys, one to its call (tool_call_ref) and one to its batch
-- (batch_id, run_id), and an index on batch_id for the second's checks when a batch is
-- deleted: every result stored paid two lookups with a row lock and three index entries.
-- Now one foreign key names the call with its batch and run, (batch_id, tool_call_ref,
-- run_id) -> tool_calls (batch_id, id, run_id): a result can only name its own call's batch
-- and run (before, any batch of the run's tenant would do), the batch exists because the
-- call's own foreign key says so, and a deleted call is checked through tool_results'
-- primary key. tool_calls' index on batch_id becomes that key's unique index, which starts
-- with batch_id: the calls keep as many indexes as before.

CREATE UNIQUE INDEX tool_calls_batch_call_key
    ON {s}.tool_calls (batch_id, id, run_id, tenant_id);
ALTER TABLE {s}.tool_calls
    ADD CONSTRAINT tool_calls_batch_call_key UNIQUE USING INDEX tool_calls_batch_call_key;
DROP INDEX {s}.tool_calls_batch;

ALTER TABLE {s}.tool_results
    ADD CONSTRAINT tool_results_call_batch_fk
    FOREIGN KEY (batch_id, tool_call_ref, run_id, tenant_id)
    REFERENCES {s}.tool_calls (batch_id, id, run_id, tenant_id) NOT VALID;
ALTER TABLE {s}.tool_results VALIDATE CONSTRAINT tool_results_call_batch_fk;
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_call_fk;
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_batch_fk;
DROP INDEX {s}.tool_results_batch;
