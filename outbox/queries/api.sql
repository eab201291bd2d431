-- name: create_thread
-- Create a thread with its opening messages (create_thread_v1 in sql/runs.sql).
SELECT {s}.create_thread_v1(%(tenant_id)s, %(title)s, %(metadata)s, %(messages)s) AS id

-- name: start_run
-- Start a run (start_run_v3): its id, status, correlation id and whether this call made it.
-- (The run's row is read by another statement: this one's snapshot predates the insert.)
SELECT * FROM {s}.start_run_v3(
    p_tenant_id => %(tenant_id)s, p_thread_id => %(thread_id)s, p_model => %(model)s,
    p_message => %(message)s, p_tools => %(tools)s::text[],
    p_idempotency_key => %(idempotency_key)s, p_api => %(api)s, p_base_url => %(base_url)s,
    p_instructions => %(instructions)s, p_max_steps => %(max_steps)s,
    p_max_tokens => %(max_tokens)s, p_loop_limit => %(loop_limit)s,
    p_action_timeout_s => %(action_timeout_s)s, p_correlation_id => %(correlation_id)s,
    p_max_cost => %(max_cost)s, p_traceparent => %(traceparent)s,
    p_tracestate => %(tracestate)s, p_model_options => %(model_options)s)

-- name: cancel_run
-- Cancel a run (cancel_run_v1); returns its row.
SELECT * FROM {s}.cancel_run_v1(%(tenant_id)s, %(run_id)s, %(actor)s)

-- name: end_run
-- End a run failed, cancelled or expired (end_run_v1: the caller holds the run lock).
SELECT * FROM {s}.end_run_v1(%(run_id)s, %(status)s, %(reason)s, %(error)s, %(actor)s)

-- name: run_tenant
-- The tenant of a run (an operator cancelling by id alone).
SELECT tenant_id FROM {s}.runs WHERE id = %(run_id)s

-- name: get_run
-- One run.
SELECT * FROM {s}.runs WHERE id = %(run_id)s

-- name: pending_client_calls
-- The client calls a run is waiting for, in call order.
SELECT tc.tool_call_id, tc.tool_name,
       {s}.resolved_text_v1(tc.arguments_raw, tc.tenant_id, tc.arguments_ref) AS arguments_raw
FROM {s}.tool_calls tc
JOIN {s}.tool_batches b ON b.id = tc.batch_id AND b.status = 'open'
WHERE tc.run_id = %(run_id)s AND tc.executor = 'client' AND tc.status = 'pending'
ORDER BY b.step_no, tc.position

-- name: submit_tool_outputs
-- Client outputs go through the one SQL implementation (sql/results.sql).
SELECT {s}.submit_tool_outputs_v1(%(tenant_id)s, %(run_id)s, %(outputs)s) AS status
