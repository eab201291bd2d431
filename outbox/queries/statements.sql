-- The journal, appended to by every module that changes state (outbox/statements.py).

-- name: journal
-- Append one event to the journal.
INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                         tool_call_id, outbox_id, correlation_id, attempt, worker, actor, detail)
VALUES (%(tenant_id)s, %(event)s, %(thread_id)s, %(run_id)s, %(batch_id)s, %(tool_call_ref)s,
        %(tool_call_id)s, %(outbox_id)s, %(correlation_id)s, %(attempt)s, %(worker)s,
        %(actor)s, %(detail)s)
