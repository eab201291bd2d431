CREATE TABLE {s}.model_catalogue (
    model             text PRIMARY KEY CHECK (length(model) BETWEEN 1 AND 200),
    context_window    integer NOT NULL CHECK (context_window > 0),
    max_output_tokens integer NOT NULL CHECK (max_output_tokens > 0),
    updated_by        text NOT NULL DEFAULT SESSION_USER,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT model_catalogue_output_within_window CHECK (max_output_tokens < context_window)
);
COMMENT ON TABLE {s}.model_catalogue IS
    'what each model can take: its context window and the most output tokens it answers, '
    'in tokens; a run''s prompt budget is the window minus the output unless the run, its '
    'tenant or the platform names one';

ALTER TABLE {s}.run_defaults ADD COLUMN max_prompt_tokens integer
    CHECK (max_prompt_tokens > 0);
COMMENT ON COLUMN {s}.run_defaults.max_prompt_tokens IS
    'the prompt budget of a run that names none and whose tenant names none (NULL: the '
    'model''s window minus its output)';
ALTER TABLE {s}.tenant_budgets ADD COLUMN max_prompt_tokens integer
    CHECK (max_prompt_tokens > 0),
    DROP CONSTRAINT tenant_budgets_limit_something,
    ADD CONSTRAINT tenant_budgets_limit_something
        CHECK (max_tokens IS NOT NULL OR max_cost IS NOT NULL OR max_prompt_tokens IS NOT NULL);
COMMENT ON COLUMN {s}.tenant_budgets.max_prompt_tokens IS
    'the prompt budget of the tenant''s runs that name none (NULL: the platform''s)';

CREATE TABLE {s}.compactions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id         text NOT NULL,
    thread_id         uuid NOT NULL,
    run_id            uuid NOT NULL,
    step_no           integer NOT NULL,
    through_seq       bigint NOT NULL,
    summary           text NOT NULL,
    tokens_before     integer NOT NULL,
    tokens_after      integer NOT NULL,
    input_tokens      integer NOT NULL DEFAULT 0,
    output_tokens     integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT compactions_one_per_step UNIQUE (run_id, step_no),
    CONSTRAINT compactions_run_fk FOREIGN KEY (run_id, thread_id, tenant_id)
        REFERENCES {s}.runs (id, thread_id, tenant_id) ON DELETE CASCADE
);
CREATE INDEX compactions_thread ON {s}.compactions (thread_id, through_seq);
COMMENT ON TABLE {s}.compactions IS
    'summaries of a thread''s oldest messages (seq up to through_seq) that the model sees '
    'in their place; the messages themselves stay in the thread. One per (run, step): the '
    'turn that compacted records it with itself';

GRANT SELECT ON {s}.model_catalogue TO outbox_writer, outbox_relay, outbox_auditor, outbox_api;
GRANT SELECT, INSERT ON {s}.compactions TO outbox_relay;
GRANT SELECT ON {s}.compactions TO outbox_writer, outbox_api;

ALTER TABLE {s}.compactions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {s}.compactions;
CREATE POLICY tenant_isolation ON {s}.compactions TO PUBLIC
    USING (tenant_id = (SELECT {s}.current_tenant_v1()))
    WITH CHECK (tenant_id = (SELECT {s}.current_tenant_v1()));
DROP POLICY IF EXISTS all_tenants ON {s}.compactions;
CREATE POLICY all_tenants ON {s}.compactions TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS audit_read ON {s}.compactions;
CREATE POLICY audit_read ON {s}.compactions FOR SELECT TO outbox_auditor USING (true);
