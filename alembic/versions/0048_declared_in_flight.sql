ALTER TABLE {s}.tools ADD COLUMN refuses_key_in_use boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN {s}.tools.refuses_key_in_use IS
    'the tool answers 409 to a request whose Idempotency-Key belongs to a request it is '
    'still acting on, and never acts on it: after an ambiguous attempt the relay resends at '
    'once instead of waiting for the earlier request to settle';
ALTER TABLE {s}.tool_calls ADD COLUMN gave_up_at timestamptz;
COMMENT ON COLUMN {s}.tool_calls.gave_up_at IS
    'when the relay stopped waiting for attempt dispatched_attempt (a timeout or a broken '
    'connection): its request may still act at the tool until the later of dispatched_at + '
    'the tool''s timeout_s and this, plus settle_s';
