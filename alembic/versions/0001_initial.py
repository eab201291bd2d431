"""The whole data model, with its invariants (docs/guarantees.md) enforced by the database.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Written as SQL (not op.create_table) so DBAs can read exactly what the database enforces.
``{s}`` stands for the quoted schema name.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ACTIVE_RUN = "('queued', 'in_progress', 'requires_action')"

UPGRADE = f"""
CREATE TABLE {{s}}.threads (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text NOT NULL CHECK (tenant_id <> ''),
    title       text,
    metadata    jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    next_seq    integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT threads_id_tenant_key UNIQUE (id, tenant_id)
);

CREATE TABLE {{s}}.runs (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       text NOT NULL,
    thread_id       uuid NOT NULL,
    status          text NOT NULL DEFAULT 'queued' CHECK (status IN
                      ('queued', 'in_progress', 'requires_action', 'completed', 'failed',
                       'cancelled', 'expired')),
    model           text NOT NULL,
    api             text NOT NULL DEFAULT 'responses' CHECK (api IN ('responses', 'chat')),
    base_url        text,
    instructions    text,
    tool_names      text[] NOT NULL DEFAULT '{{}}',
    step_count      integer NOT NULL DEFAULT 0 CHECK (step_count >= 0),
    max_steps       integer NOT NULL DEFAULT 20 CHECK (max_steps > 0),
    max_tokens      bigint CHECK (max_tokens > 0),
    tokens_used     bigint NOT NULL DEFAULT 0,
    loop_limit      integer NOT NULL DEFAULT 3 CHECK (loop_limit > 1),
    action_timeout  interval NOT NULL DEFAULT '10 minutes',
    action_deadline timestamptz,
    idempotency_key text,
    correlation_id  text NOT NULL,
    failure_reason  text CHECK (failure_reason IN
                      ('step_cap', 'budget', 'loop', 'model_error', 'tool_error', 'cancelled',
                       'expired')),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz,
    CONSTRAINT runs_thread_fk FOREIGN KEY (thread_id, tenant_id)
        REFERENCES {{s}}.threads (id, tenant_id),
    CONSTRAINT runs_tenant_idempotency_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT runs_id_tenant_key UNIQUE (id, tenant_id),
    CONSTRAINT runs_failure_reason_only_when_ended CHECK
        (failure_reason IS NULL OR status IN ('failed', 'cancelled', 'expired'))
);
-- Invariant 8: one active run per thread.
CREATE UNIQUE INDEX runs_one_active_per_thread ON {{s}}.runs (thread_id)
    WHERE status IN {ACTIVE_RUN};
CREATE INDEX runs_tenant_status ON {{s}}.runs (tenant_id, status, created_at);
CREATE INDEX runs_action_deadline ON {{s}}.runs (action_deadline)
    WHERE status = 'requires_action';

CREATE TABLE {{s}}.messages (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text NOT NULL,
    thread_id     uuid NOT NULL,
    seq           integer NOT NULL CHECK (seq > 0),
    role          text NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content       text,
    run_id        uuid REFERENCES {{s}}.runs (id),
    tool_call_ref bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT messages_thread_fk FOREIGN KEY (thread_id, tenant_id)
        REFERENCES {{s}}.threads (id, tenant_id),
    CONSTRAINT messages_thread_seq_key UNIQUE (thread_id, seq),
    CONSTRAINT messages_id_thread_key UNIQUE (id, thread_id),
    CONSTRAINT messages_one_per_tool_call UNIQUE (tool_call_ref),
    CONSTRAINT messages_tool_role_has_call CHECK ((role = 'tool') = (tool_call_ref IS NOT NULL))
);

CREATE TABLE {{s}}.model_turns (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text NOT NULL,
    run_id        uuid NOT NULL REFERENCES {{s}}.runs (id),
    step_no       integer NOT NULL CHECK (step_no > 0),
    message_id    bigint NOT NULL REFERENCES {{s}}.messages (id),
    response_id   text,
    input_tokens  integer NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens integer NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- One recorded response per model turn.
    CONSTRAINT model_turns_run_step_key UNIQUE (run_id, step_no)
);

CREATE TABLE {{s}}.tool_batches (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL,
    run_id       uuid NOT NULL REFERENCES {{s}}.runs (id),
    thread_id    uuid NOT NULL,
    step_no      integer NOT NULL CHECK (step_no > 0),
    message_id   bigint NOT NULL,
    status       text NOT NULL DEFAULT 'open' CHECK (status IN
                   ('open', 'complete', 'delivered', 'cancelled', 'expired')),
    size         integer NOT NULL CHECK (size > 0),
    pending      integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    delivered_at timestamptz,
    CONSTRAINT tool_batches_run_step_key UNIQUE (run_id, step_no),
    CONSTRAINT tool_batches_message_fk FOREIGN KEY (message_id, thread_id)
        REFERENCES {{s}}.messages (id, thread_id),
    CONSTRAINT tool_batches_pending_range CHECK (pending >= 0 AND pending <= size),
    CONSTRAINT tool_batches_open_until_done CHECK (status <> 'open' OR pending > 0)
);

-- The rescue sweep looks for complete batches whose delivery never happened.
CREATE INDEX tool_batches_complete ON {{s}}.tool_batches (completed_at)
    WHERE status = 'complete';

CREATE TABLE {{s}}.tool_calls (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text NOT NULL,
    run_id             uuid NOT NULL REFERENCES {{s}}.runs (id),
    thread_id          uuid NOT NULL,
    batch_id           bigint NOT NULL REFERENCES {{s}}.tool_batches (id),
    message_id         bigint NOT NULL,
    position           integer NOT NULL CHECK (position >= 0),
    tool_call_id       text NOT NULL CHECK (tool_call_id <> ''),
    tool_name          text NOT NULL,
    tool_version       integer,
    arguments          jsonb,
    arguments_raw      text NOT NULL,
    arguments_hash     text NOT NULL,
    executor           text NOT NULL CHECK (executor IN ('http', 'client', 'python', 'none')),
    idempotency_mode   text CHECK (idempotency_mode IN ('key', 'lookup', 'none')),
    idempotency_key    text NOT NULL,
    status             text NOT NULL DEFAULT 'pending' CHECK (status IN
                         ('pending', 'running', 'succeeded', 'failed', 'outcome_unknown',
                          'quarantined', 'cancelled')),
    attempts           integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    dispatched_attempt integer,
    last_error         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- Invariant 2: one intent per provider call id within a run.
    CONSTRAINT tool_calls_run_call_key UNIQUE (run_id, tool_call_id),
    CONSTRAINT tool_calls_batch_position_key UNIQUE (batch_id, position),
    CONSTRAINT tool_calls_id_thread_key UNIQUE (id, thread_id),
    CONSTRAINT tool_calls_idempotency_key UNIQUE (tenant_id, idempotency_key),
    -- Invariant 7: the call belongs to an assistant message of the same thread.
    CONSTRAINT tool_calls_message_fk FOREIGN KEY (message_id, thread_id)
        REFERENCES {{s}}.messages (id, thread_id)
);
CREATE INDEX tool_calls_batch ON {{s}}.tool_calls (batch_id);
CREATE INDEX tool_calls_status ON {{s}}.tool_calls (status)
    WHERE status IN ('outcome_unknown', 'quarantined');

-- Invariant 7: a tool message in the history references a call of the same thread.
ALTER TABLE {{s}}.messages ADD CONSTRAINT messages_tool_call_fk
    FOREIGN KEY (tool_call_ref, thread_id) REFERENCES {{s}}.tool_calls (id, thread_id);

CREATE TABLE {{s}}.tool_results (
    tool_call_ref bigint PRIMARY KEY REFERENCES {{s}}.tool_calls (id),
    tenant_id     text NOT NULL,
    run_id        uuid NOT NULL,
    batch_id      bigint NOT NULL,
    status        text NOT NULL CHECK (status IN ('ok', 'error')),
    output        jsonb,
    error         text,
    attempt       integer NOT NULL DEFAULT 0,
    source        text NOT NULL CHECK (source IN
                    ('relay', 'client', 'lookup', 'operator', 'validation', 'system')),
    worker        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tool_results_error_has_text CHECK (status = 'ok' OR error IS NOT NULL)
);

CREATE TABLE {{s}}.orphaned_results (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text NOT NULL,
    run_id        uuid,
    batch_id      bigint,
    tool_call_ref bigint REFERENCES {{s}}.tool_calls (id),
    tool_call_id  text,
    status        text NOT NULL CHECK (status IN ('ok', 'error')),
    output        jsonb,
    error         text,
    reason        text NOT NULL CHECK (reason IN
                    ('batch_closed', 'run_ended', 'duplicate', 'fenced')),
    source        text NOT NULL,
    attempt       integer,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{s}}.submissions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text NOT NULL,
    run_id        uuid NOT NULL REFERENCES {{s}}.runs (id),
    batch_id      bigint NOT NULL REFERENCES {{s}}.tool_batches (id),
    outputs_count integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- Invariant 6: outputs of a batch are submitted once.
    CONSTRAINT submissions_one_per_batch UNIQUE (batch_id)
);

CREATE TABLE {{s}}.outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('model_turn', 'tool_call', 'deliver_batch')),
    dedup_key        text NOT NULL,
    thread_id        uuid,
    run_id           uuid,
    batch_id         bigint,
    tool_call_ref    bigint,
    correlation_id   text,
    status           text NOT NULL DEFAULT 'ready' CHECK (status IN
                       ('ready', 'leased', 'quarantined')),
    available_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    lease_owner      text,
    lease_expires_at timestamptz,
    claimed_at       timestamptz,
    last_error       text,
    payload          jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_dedup_key UNIQUE (dedup_key),
    CONSTRAINT outbox_lease_consistent CHECK
        ((status = 'leased') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);
-- The claim reads only this index: ready rows in due order.
CREATE INDEX outbox_ready ON {{s}}.outbox (available_at, id) WHERE status = 'ready';
CREATE INDEX outbox_leased ON {{s}}.outbox (lease_expires_at) WHERE status = 'leased';
CREATE INDEX outbox_run ON {{s}}.outbox (run_id);
ALTER TABLE {{s}}.outbox SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 0);

CREATE TABLE {{s}}.tools (
    tenant_id        text NOT NULL DEFAULT '*',
    name             text NOT NULL CHECK (name ~ '^[a-zA-Z0-9_-]{{1,64}}$'),
    version          integer NOT NULL CHECK (version > 0),
    description      text NOT NULL DEFAULT '',
    json_schema      jsonb NOT NULL DEFAULT '{{"type": "object"}}'::jsonb,
    executor         text NOT NULL CHECK (executor IN ('http', 'client', 'python')),
    endpoint         text,
    lookup_endpoint  text,
    callable         text,
    credential_ref   text,
    timeout_s        double precision NOT NULL DEFAULT 30 CHECK (timeout_s > 0),
    max_attempts     integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    idempotency_mode text NOT NULL CHECK (idempotency_mode IN ('key', 'lookup', 'none')),
    risk_tier        text NOT NULL DEFAULT 'low' CHECK (risk_tier IN ('low', 'medium', 'high')),
    enabled          boolean NOT NULL DEFAULT true,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name, version),
    CONSTRAINT tools_http_has_endpoint CHECK (executor <> 'http' OR endpoint IS NOT NULL),
    CONSTRAINT tools_python_has_callable CHECK (executor <> 'python' OR callable IS NOT NULL),
    CONSTRAINT tools_lookup_has_endpoint CHECK
        (executor <> 'http' OR idempotency_mode <> 'lookup' OR lookup_endpoint IS NOT NULL)
);

CREATE TABLE {{s}}.journal (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenant_id      text NOT NULL,
    event          text NOT NULL,
    thread_id      uuid,
    run_id         uuid,
    batch_id       bigint,
    tool_call_ref  bigint,
    tool_call_id   text,
    outbox_id      bigint,
    correlation_id text,
    attempt        integer,
    worker         text,
    actor          text,
    detail         jsonb NOT NULL DEFAULT '{{}}'::jsonb
);
CREATE INDEX journal_run ON {{s}}.journal (run_id, id);
CREATE INDEX journal_at ON {{s}}.journal (at);

-- Invariant 10: the journal is append-only, whoever asks.
CREATE FUNCTION {{s}}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;
CREATE TRIGGER journal_no_update_delete BEFORE UPDATE OR DELETE ON {{s}}.journal
    FOR EACH ROW EXECUTE FUNCTION {{s}}.journal_refuse_change();
CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON {{s}}.journal
    FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.journal_refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON {{s}}.journal FROM PUBLIC;

-- One wake-up per inserting statement (identical payloads fold into one per transaction).
-- SET outbox.notify = 'off' (session, role or database) switches it off.
CREATE FUNCTION {{s}}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('outbox.notify', true), '') <> 'off' THEN
        PERFORM pg_notify('outbox_ready', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON {{s}}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.outbox_notify();
"""

DOWNGRADE = """
DROP TABLE {s}.journal, {s}.tools, {s}.outbox, {s}.submissions, {s}.orphaned_results,
    {s}.tool_results, {s}.model_turns CASCADE;
ALTER TABLE {s}.messages DROP CONSTRAINT messages_tool_call_fk;
DROP TABLE {s}.tool_calls, {s}.tool_batches, {s}.messages, {s}.runs, {s}.threads CASCADE;
DROP FUNCTION {s}.journal_refuse_change(), {s}.outbox_notify();
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
