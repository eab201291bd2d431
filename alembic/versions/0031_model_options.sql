-- 0031: what a run passes to its model beside the history, kept with the run; and the
-- reasoning items a client's history gave, kept with the message they came before.
-- Frozen: what revision 0031 applies, forever.
--
-- * runs.model_options: tool_choice, parallel_tool_calls, the answer's format (a JSON
--   Schema for structured output) and verbosity, in the Responses API's terms; the relay
--   writes them into each model request in the run's API (outbox/providers.py). Set when
--   the run starts, changed for its next turns by lifecycle.retarget_run while it waits
--   for client outputs.
-- * responses.model_options: the same fields as the response's request gave them (what
--   the response shows).
-- * messages.reasoning: the reasoning items that came right before the message in a
--   client's history (Responses API items, verbatim, never read): replayed before it to a
--   model of the Responses API, left out for chat completions.

ALTER TABLE {s}.runs
    ADD COLUMN model_options jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT runs_model_options_object CHECK (jsonb_typeof(model_options) = 'object');
COMMENT ON COLUMN {s}.runs.model_options IS
    'what the run passes to its model beside the history and the tools: tool_choice, '
    'parallel_tool_calls, format, verbosity (Responses API terms; outbox/providers.py '
    'writes them per API)';

ALTER TABLE {s}.responses
    ADD COLUMN model_options jsonb NOT NULL DEFAULT '{}'::jsonb;

ALTER TABLE {s}.messages
    ADD COLUMN reasoning jsonb
        CONSTRAINT messages_reasoning_array CHECK (jsonb_typeof(reasoning) = 'array');
COMMENT ON COLUMN {s}.messages.reasoning IS
    'reasoning items a client''s history gave right before this message, verbatim: '
    'replayed before it to a model of the Responses API, never read';
