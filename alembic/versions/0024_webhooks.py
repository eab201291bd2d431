"""Signed webhooks per tenant, delivered through the outbox (kind ``webhook``).

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-24

``webhook_endpoints`` (per tenant: URL, wanted events, signing secret encrypted with the
relay's key) and ``webhook_deliveries`` (one row per event and endpoint, unique: a status
change enqueues one delivery). A trigger on ``runs`` enqueues, in the transaction that
changed the status, an outbox row of the new kind ``webhook`` per endpoint that wants the
event; the relay POSTs it signed, retried with backoff like any row. The SQL is
``0024_webhooks.sql`` beside this file, frozen. The downgrade drops the triggers, the
function and the tables (after deleting outbox rows of the kind) and restores the outbox's
checks as 0001 and 0007 made them.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0024_webhooks.sql")

DOWNGRADE = """
DROP TRIGGER webhook_enqueue_update ON {s}.runs;
DROP TRIGGER webhook_enqueue_insert ON {s}.runs;
DROP FUNCTION {s}.webhook_enqueue();
DELETE FROM {s}.outbox WHERE kind = 'webhook';
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_dedup_key_names_its_row;
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_dedup_key_names_its_row CHECK (coalesce(
    CASE kind
        WHEN 'tool_call' THEN dedup_key = 'tool_call:' || tool_call_ref
        WHEN 'deliver_batch' THEN dedup_key = 'deliver:' || batch_id
        WHEN 'model_turn' THEN dedup_key LIKE 'model_turn:' || run_id || ':%'
    END, false));
ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_kind_check;
ALTER TABLE {s}.outbox ADD CONSTRAINT outbox_kind_check
    CHECK (kind IN ('model_turn', 'tool_call', 'deliver_batch'));
DROP TABLE {s}.webhook_deliveries;
DROP TABLE {s}.webhook_endpoints;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
