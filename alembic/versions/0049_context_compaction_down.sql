DROP TABLE {s}.compactions;
ALTER TABLE {s}.tenant_budgets DROP COLUMN max_prompt_tokens;
ALTER TABLE {s}.run_defaults DROP COLUMN max_prompt_tokens;
DROP TABLE {s}.model_catalogue;
