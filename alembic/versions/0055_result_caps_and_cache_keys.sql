ALTER TABLE {s}.tools ADD COLUMN model_result_cap integer
    CHECK (model_result_cap >= 0);
COMMENT ON COLUMN {s}.tools.model_result_cap IS
    'the most bytes of a result of this tool the model is given: past it, the model sees '
    'its first part and a handle that read_result pages (NULL: the platform''s default, '
    '0: no cap); the stored result is whole';

ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_executor_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_executor_check
    CHECK (executor IN ('http', 'client', 'python', 'mcp', 'none', 'builtin'));

ALTER TABLE {s}.model_catalogue ADD COLUMN prompt_cache_key text NOT NULL DEFAULT 'derived'
    CHECK (prompt_cache_key IN ('derived', 'caller', 'never'));
COMMENT ON COLUMN {s}.model_catalogue.prompt_cache_key IS
    'the prompt_cache_key the model''s requests carry: derived (the caller''s, else one '
    'derived from the tenant and the thread), caller (only a caller''s), never (none: for '
    'a server that refuses the field)';
