-- The end of a run and what comes from outside it (outbox/lifecycle.py): expiry and
-- imported conversations.

-- name: due_expiries
-- Runs left in requires_action past their deadline (skipping any another worker holds),
-- once no call of theirs is executing: a relay call under a live lease finishes first, so
-- its result enters the history instead of being orphaned while the model is told it did
-- not happen (the wait ends with the call: its timeout bounds it, and a dead worker's
-- lease expires). Outputs submitted meanwhile are refused by submit_tool_outputs_v1.
SELECT id FROM {s}.runs r
WHERE status = 'requires_action' AND action_deadline < now()
  AND NOT EXISTS (SELECT 1 FROM {s}.outbox o
                  WHERE o.run_id = r.id AND o.kind = 'tool_call' AND o.status = 'leased'
                    AND o.lease_expires_at > now())
ORDER BY action_deadline
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: insert_import_run
-- The closed run that owns the tool calls of an imported conversation.
INSERT INTO {s}.runs (tenant_id, thread_id, status, model, correlation_id, ended_at,
                      step_count)
VALUES (%(tenant_id)s, %(thread_id)s, 'completed', 'import', %(correlation_id)s, now(),
        %(steps)s)
RETURNING *

-- name: insert_batch
-- A model turn's tool calls, as one batch at the turn's step.
INSERT INTO {s}.tool_batches (tenant_id, run_id, thread_id, step_no, message_id, status, size,
                              pending, completed_at)
VALUES (%(tenant_id)s, %(run_id)s, %(thread_id)s, %(step_no)s, %(message_id)s,
        CASE WHEN %(pending)s = 0 THEN 'complete' ELSE 'open' END, %(size)s, %(pending)s,
        CASE WHEN %(pending)s = 0 THEN now() END)
RETURNING id, status

-- name: batch_delivered
-- Mark a batch delivered (an imported conversation's batches are in the history already).
UPDATE {s}.tool_batches SET status = 'delivered', delivered_at = now() WHERE id = %(batch_id)s

-- name: insert_tool_call
-- One tool-call intent.
INSERT INTO {s}.tool_calls (tenant_id, run_id, thread_id, batch_id, message_id, position,
                            tool_call_id, tool_name, tool_version, arguments, arguments_raw,
                            arguments_hash, executor, idempotency_mode, idempotency_key,
                            status)
VALUES (%(tenant_id)s, %(run_id)s, %(thread_id)s, %(batch_id)s, %(message_id)s, %(position)s,
        %(tool_call_id)s, %(tool_name)s, %(tool_version)s, %(arguments)s, %(arguments_raw)s,
        %(arguments_hash)s, %(executor)s, %(idempotency_mode)s, %(idempotency_key)s,
        %(status)s)
RETURNING id

-- name: retarget_pins
-- The version each of a retargeted run's tools takes: the one the run pinned, else the
-- one start_run_v1 would pin now (the tenant's own before a shared one, the newest);
-- NULL for a tool the registry does not have.
SELECT n.name,
       coalesce(r.tool_pins -> n.name,
                (SELECT jsonb_build_object('tenant_id', tl.tenant_id, 'version', tl.version)
                 FROM {s}.tools tl
                 WHERE tl.name = n.name AND tl.tenant_id IN (r.tenant_id, '*')
                 ORDER BY (tl.tenant_id = '*'), tl.version DESC
                 LIMIT 1)) AS pin
FROM {s}.runs r, unnest(%(tools)s::text[]) AS n(name)
WHERE r.id = %(run_id)s

-- name: model_price
-- Whether a model has a price (a run with a budget in money needs one).
SELECT 1 FROM {s}.model_prices WHERE model = %(model)s

-- name: retarget_run
-- A waiting run's model, tools (with their pins), instructions and model options, for its
-- next turn on.
UPDATE {s}.runs
SET model = %(model)s, tool_names = %(tool_names)s, tool_pins = %(pins)s,
    instructions = %(instructions)s, model_options = %(model_options)s, updated_at = now()
WHERE id = %(run_id)s
