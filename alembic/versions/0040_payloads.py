"""Large payloads by reference: bodies over a threshold stored once per tenant by digest.

Revision ID: 0040
Revises: 0038
Create Date: 2026-11-27

``payloads`` (digest, tenant_id, bytes, body) holds every argument, result and tool message
over ``outbox.payload_inline_max`` bytes (8192 by default) once; ``tool_calls.arguments_ref``,
``tool_results.output_ref``, ``orphaned_results.output_ref`` and ``messages.content_ref``
reference it (a foreign key each), set by the trigger ``payload_by_reference`` whoever
writes. Readers resolve with ``resolved_text_v1`` and ``resolved_json_v1``; the journal
names large bodies by digest and size (``journal_payloads`` resolves them); retention and
erasure sweep the bodies nothing references any more (``sweep_payloads_v1``). The SQL is
``0040_payloads.sql`` beside this file, frozen; the downgrade (``0040_payloads_down.sql``)
makes the functions again as 0035 left them and drops what 0040 added (a body stored by
reference is lost with it: downgrade before any is written).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0040"
down_revision = "0038"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0040_payloads.sql")
DOWNGRADE = frozen_sql(__file__, "0040_payloads_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
