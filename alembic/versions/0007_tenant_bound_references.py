"""Every reference stays inside its tenant (and its run or thread), by the database.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

Row-level security hides other tenants' rows from a writer, but a foreign-key check does
not go through it: before this revision a writer of tenant A could insert a tool call, a
submission, a result or a model turn whose ``run_id``, ``batch_id``, ``tool_call_ref`` or
``message_id`` named a row of tenant B (batch and call ids are sequential, easy to guess),
and the check passed. Threads were already bound this way (``(thread_id, tenant_id)``);
now every reference names the tenant too, through the row it points at:

- a run is referenced with its thread and tenant where the row has both
  (``(run_id, thread_id, tenant_id)``), else with its tenant;
- a batch with its run and tenant, so a call, a result or a submission of one run never
  names another run's batch;
- a tool call (from a result or an orphaned result) and a message (from a model turn)
  with their tenant;
- the outbox, which had no foreign keys at all, gets its references checked by a
  constraint trigger (lookups, no row locks; the comment in UPGRADE says why) and its
  dedup key tied to the row it names: a row naming another tenant's run or call would
  have made the relay call that tenant's model or tool, and another tenant's dedup key
  would have swallowed that tenant's work.

A nullable reference is bound with the tenant alone (NOT NULL): PostgreSQL does not check
a composite key with a NULL in it. The run and batch an orphaned result copies from its
call are not bound (nothing reads them but reports; results are always joined by call).

It costs two more unique indexes on tables written per call (``tool_calls (id,
tenant_id)``, ``messages (id, tenant_id)``), two on tables written per turn or run, and
up to four lookups per outbox row enqueued; docs/operations.md has the measurement. Building
the indexes and checking existing rows holds ``runs``, ``messages``, ``tool_batches``,
``tool_calls`` and ``outbox`` (reads included) while the migration runs.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE {s}.runs ADD CONSTRAINT runs_id_thread_tenant_key
    UNIQUE (id, thread_id, tenant_id);
ALTER TABLE {s}.tool_batches ADD CONSTRAINT tool_batches_id_run_tenant_key
    UNIQUE (id, run_id, tenant_id);
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_id_tenant_key UNIQUE (id, tenant_id);
ALTER TABLE {s}.messages ADD CONSTRAINT messages_id_tenant_key UNIQUE (id, tenant_id);

ALTER TABLE {s}.messages DROP CONSTRAINT messages_run_id_fkey,
    ADD CONSTRAINT messages_run_fk FOREIGN KEY (run_id, thread_id, tenant_id)
        REFERENCES {s}.runs (id, thread_id, tenant_id);
ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_run_id_fkey,
    DROP CONSTRAINT model_turns_message_id_fkey,
    ADD CONSTRAINT model_turns_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    ADD CONSTRAINT model_turns_message_fk FOREIGN KEY (message_id, tenant_id)
        REFERENCES {s}.messages (id, tenant_id);
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_run_id_fkey,
    ADD CONSTRAINT tool_batches_run_fk FOREIGN KEY (run_id, thread_id, tenant_id)
        REFERENCES {s}.runs (id, thread_id, tenant_id);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_run_id_fkey,
    DROP CONSTRAINT tool_calls_batch_id_fkey,
    ADD CONSTRAINT tool_calls_run_fk FOREIGN KEY (run_id, thread_id, tenant_id)
        REFERENCES {s}.runs (id, thread_id, tenant_id),
    ADD CONSTRAINT tool_calls_batch_fk FOREIGN KEY (batch_id, run_id, tenant_id)
        REFERENCES {s}.tool_batches (id, run_id, tenant_id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_tool_call_ref_fkey,
    ADD CONSTRAINT tool_results_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
        REFERENCES {s}.tool_calls (id, tenant_id),
    ADD CONSTRAINT tool_results_batch_fk FOREIGN KEY (batch_id, run_id, tenant_id)
        REFERENCES {s}.tool_batches (id, run_id, tenant_id);
-- A nullable reference is bound with the tenant alone (NOT NULL): a composite key with a
-- NULL in it is not checked.
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_tool_call_ref_fkey,
    ADD CONSTRAINT orphaned_results_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
        REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_run_id_fkey,
    DROP CONSTRAINT submissions_batch_id_fkey,
    ADD CONSTRAINT submissions_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    ADD CONSTRAINT submissions_batch_fk FOREIGN KEY (batch_id, run_id, tenant_id)
        REFERENCES {s}.tool_batches (id, run_id, tenant_id);
-- The outbox is what the relay acts on: a row naming another tenant's run or call would
-- make the relay call that tenant's model or tool, and one holding another tenant's dedup
-- key would silently swallow that tenant's work (ON CONFLICT DO NOTHING). Its references
-- are checked by lookups, not foreign keys: a foreign key takes a KEY SHARE lock on the run
-- and batch it names, and paths that enqueue while holding a batch (a client result that
-- completes it, the rescue sweep) would then lock a run after its batch, against the one
-- lock order (run, then batch). Runs, threads, batches and calls are never deleted, so a
-- lookup without a lock cannot be overtaken. The lookups go through row-level security:
-- a writer finds only its tenant's rows.
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_dedup_key_names_its_row CHECK (coalesce(
    CASE kind
        WHEN 'tool_call' THEN dedup_key = 'tool_call:' || tool_call_ref
        WHEN 'deliver_batch' THEN dedup_key = 'deliver:' || batch_id
        WHEN 'model_turn' THEN dedup_key LIKE 'model_turn:' || run_id || ':%'
    END, false));

CREATE FUNCTION {s}.outbox_refs_in_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    missing text;
BEGIN
    IF NEW.thread_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.threads
            WHERE id = NEW.thread_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('thread %s', NEW.thread_id);
    ELSIF NEW.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.runs
            WHERE id = NEW.run_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('run %s', NEW.run_id);
    ELSIF NEW.batch_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.tool_batches
            WHERE id = NEW.batch_id AND tenant_id = NEW.tenant_id) THEN
        missing := format('batch %s', NEW.batch_id);
    ELSIF NEW.tool_call_ref IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.tool_calls
            WHERE id = NEW.tool_call_ref AND tenant_id = NEW.tenant_id) THEN
        missing := format('tool call %s', NEW.tool_call_ref);
    END IF;
    IF missing IS NOT NULL THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('outbox row of tenant %L names %s, which is not %L''s',
                             NEW.tenant_id, missing, NEW.tenant_id),
            HINT = 'enqueue work through the writer API, for rows of the tenant in scope';
    END IF;
    RETURN NULL;
END $$;
-- A constraint trigger runs after the row's own checks (row-level security first).
CREATE CONSTRAINT TRIGGER outbox_refs_in_tenant
    AFTER INSERT OR UPDATE OF tenant_id, thread_id, run_id, batch_id, tool_call_ref
    ON {s}.outbox FOR EACH ROW EXECUTE FUNCTION {s}.outbox_refs_in_tenant();
"""

DOWNGRADE = """
DROP TRIGGER outbox_refs_in_tenant ON {s}.outbox;
DROP FUNCTION {s}.outbox_refs_in_tenant();
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_dedup_key_names_its_row;
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_batch_fk,
    DROP CONSTRAINT submissions_run_fk,
    ADD CONSTRAINT submissions_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id),
    ADD CONSTRAINT submissions_batch_id_fkey FOREIGN KEY (batch_id)
        REFERENCES {s}.tool_batches (id);
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_call_fk,
    ADD CONSTRAINT orphaned_results_tool_call_ref_fkey FOREIGN KEY (tool_call_ref)
        REFERENCES {s}.tool_calls (id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_call_fk,
    DROP CONSTRAINT tool_results_batch_fk,
    ADD CONSTRAINT tool_results_tool_call_ref_fkey FOREIGN KEY (tool_call_ref)
        REFERENCES {s}.tool_calls (id);
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_batch_fk,
    DROP CONSTRAINT tool_calls_run_fk,
    ADD CONSTRAINT tool_calls_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id),
    ADD CONSTRAINT tool_calls_batch_id_fkey FOREIGN KEY (batch_id)
        REFERENCES {s}.tool_batches (id);
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_run_fk,
    ADD CONSTRAINT tool_batches_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id);
ALTER TABLE {s}.model_turns DROP CONSTRAINT model_turns_message_fk,
    DROP CONSTRAINT model_turns_run_fk,
    ADD CONSTRAINT model_turns_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id),
    ADD CONSTRAINT model_turns_message_id_fkey FOREIGN KEY (message_id)
        REFERENCES {s}.messages (id);
ALTER TABLE {s}.messages DROP CONSTRAINT messages_run_fk,
    ADD CONSTRAINT messages_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id);

ALTER TABLE {s}.messages DROP CONSTRAINT messages_id_tenant_key;
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_id_tenant_key;
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_id_run_tenant_key;
ALTER TABLE {s}.runs DROP CONSTRAINT runs_id_thread_tenant_key;
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
