"""What a tool declares of a request still in flight, and when the relay gave up on one.

Revision ID: 0048
Revises: 0047
Create Date: 2026-12-07

``tools.refuses_key_in_use``: a ``key`` tool that answers 409 to a second request with the
key of a request it is still acting on (the Idempotency-Key draft's "concurrent request",
as Stripe's ``idempotency_key_in_use``) cannot act twice however soon the relay resends,
so the relay resends at once after an ambiguous attempt instead of waiting for that
request to settle. ``tool_calls.gave_up_at``: when the relay stopped waiting for the
dispatched attempt; a request sent late (a queue for a connection, a slow stream of
bytes, a paused process) may act at the tool until then plus the tool's settle time, which
the dispatch time alone does not bound. The SQL is ``0048_declared_in_flight.sql`` beside
this file, frozen; ``0048_declared_in_flight_down.sql`` drops both columns.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0048_declared_in_flight.sql")
DOWN = frozen_sql(__file__, "0048_declared_in_flight_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
