ALTER TABLE {s}.tool_calls DROP COLUMN gave_up_at;
ALTER TABLE {s}.tools DROP COLUMN refuses_key_in_use;
