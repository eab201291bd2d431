"""A run's timeline shows only its own tenant's events.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

The journal has no foreign keys (its rows outlive what they describe, and the relay writes
one per completion), and a writer may append events for its own tenant. An event a writer
of tenant A filed under a run id of tenant B showed in B's ``run_timeline``. The view now
keeps the events whose tenant is the run's; the forged one stays in the journal, under A.
``outbox journal --run`` filters the same way (``outbox/queries/ops.sql``).
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import schema_sql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

RUN_TIMELINE_0008 = """
CREATE OR REPLACE VIEW {s}.run_timeline AS
SELECT j.run_id,
       j.tenant_id,
       row_number() OVER w AS seq,
       j.at,
       j.event,
       j.batch_id,
       j.tool_call_ref,
       j.tool_call_id,
       j.outbox_id,
       j.attempt,
       j.worker,
       j.actor,
       coalesce(j.detail ->> 'error', j.detail ->> 'reason') AS error,
       extract(epoch FROM j.at - lag(j.at) OVER w) AS since_previous_s,
       j.correlation_id,
       j.detail,
       j.id AS journal_id
FROM {s}.journal j
JOIN {s}.runs r ON r.id = j.run_id AND r.tenant_id = j.tenant_id
WINDOW w AS (PARTITION BY j.run_id ORDER BY j.at, j.id);
"""

RUN_TIMELINE_0002 = """
CREATE OR REPLACE VIEW {s}.run_timeline AS
SELECT j.run_id,
       j.tenant_id,
       row_number() OVER w AS seq,
       j.at,
       j.event,
       j.batch_id,
       j.tool_call_ref,
       j.tool_call_id,
       j.outbox_id,
       j.attempt,
       j.worker,
       j.actor,
       coalesce(j.detail ->> 'error', j.detail ->> 'reason') AS error,
       extract(epoch FROM j.at - lag(j.at) OVER w) AS since_previous_s,
       j.correlation_id,
       j.detail,
       j.id AS journal_id
FROM {s}.journal j
WHERE j.run_id IS NOT NULL
WINDOW w AS (PARTITION BY j.run_id ORDER BY j.at, j.id);
"""


def upgrade() -> None:
    # CREATE OR REPLACE keeps the view's grants.
    op.execute(schema_sql(RUN_TIMELINE_0008))


def downgrade() -> None:
    op.execute(schema_sql(RUN_TIMELINE_0002))
