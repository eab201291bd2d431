ALTER TABLE {s}.model_catalogue DROP COLUMN prompt_cache_key;
-- Calls the relay ran itself have no executor before this revision: they read as refused.
UPDATE {s}.tool_calls SET executor = 'none' WHERE executor = 'builtin';
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_executor_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_executor_check
    CHECK (executor IN ('http', 'client', 'python', 'mcp', 'none'));
ALTER TABLE {s}.tools DROP COLUMN model_result_cap;
