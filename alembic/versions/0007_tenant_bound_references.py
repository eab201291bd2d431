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
- a batch with its run, so a call or a submission of one run never names another run's
  batch;
- a tool call (from a result or an orphaned result) and a message (from a model turn)
  with their tenant.

It costs two more unique indexes on tables written per call (``tool_calls (id,
tenant_id)`` and ``messages (id, tenant_id)``); docs/operations.md has the measurement.
Building them locks those tables for writes while the migration runs.
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
ALTER TABLE {s}.tool_batches ADD CONSTRAINT tool_batches_id_run_key UNIQUE (id, run_id);
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
    ADD CONSTRAINT tool_calls_batch_fk FOREIGN KEY (batch_id, run_id)
        REFERENCES {s}.tool_batches (id, run_id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_tool_call_ref_fkey,
    ADD CONSTRAINT tool_results_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
        REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_tool_call_ref_fkey,
    ADD CONSTRAINT orphaned_results_call_fk FOREIGN KEY (tool_call_ref, tenant_id)
        REFERENCES {s}.tool_calls (id, tenant_id);
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_run_id_fkey,
    DROP CONSTRAINT submissions_batch_id_fkey,
    ADD CONSTRAINT submissions_run_fk FOREIGN KEY (run_id, tenant_id)
        REFERENCES {s}.runs (id, tenant_id),
    ADD CONSTRAINT submissions_batch_fk FOREIGN KEY (batch_id, run_id)
        REFERENCES {s}.tool_batches (id, run_id);
"""

DOWNGRADE = """
ALTER TABLE {s}.submissions DROP CONSTRAINT submissions_batch_fk,
    DROP CONSTRAINT submissions_run_fk,
    ADD CONSTRAINT submissions_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs (id),
    ADD CONSTRAINT submissions_batch_id_fkey FOREIGN KEY (batch_id)
        REFERENCES {s}.tool_batches (id);
ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_call_fk,
    ADD CONSTRAINT orphaned_results_tool_call_ref_fkey FOREIGN KEY (tool_call_ref)
        REFERENCES {s}.tool_calls (id);
ALTER TABLE {s}.tool_results DROP CONSTRAINT tool_results_call_fk,
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
ALTER TABLE {s}.tool_batches DROP CONSTRAINT tool_batches_id_run_key;
ALTER TABLE {s}.runs DROP CONSTRAINT runs_id_thread_tenant_key;
"""


def upgrade() -> None:
    op.execute(schema_sql(UPGRADE))


def downgrade() -> None:
    op.execute(schema_sql(DOWNGRADE))
