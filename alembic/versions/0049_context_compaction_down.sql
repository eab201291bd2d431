DROP TABLE {s}.compactions;
DELETE FROM {s}.tenant_budgets WHERE max_tokens IS NULL AND max_cost IS NULL;
ALTER TABLE {s}.tenant_budgets DROP COLUMN max_prompt_tokens,
    ADD CONSTRAINT tenant_budgets_limit_something
        CHECK (max_tokens IS NOT NULL OR max_cost IS NOT NULL);
ALTER TABLE {s}.run_defaults DROP COLUMN max_prompt_tokens;
DROP TABLE {s}.model_catalogue;
