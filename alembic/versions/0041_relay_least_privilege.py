"""The relay's role no longer starts, cancels or creates anything.

Revision ID: 0041
Revises: 0040
Create Date: 2026-11-27

``outbox_relay`` loses EXECUTE on the writer's entry points (``create_thread_v1``,
``start_run_v1``/``_v2``, ``same_run_request_v1``, ``cancel_run_v1``), which no
relay statement calls. The SQL is ``0041_relay_least_privilege.sql`` beside this
file, frozen. The downgrade grants them back.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0041_relay_least_privilege.sql")

DOWNGRADE = """
GRANT EXECUTE ON FUNCTION {s}.create_thread_v1(text, text, jsonb, jsonb),
                          {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric),
                          {s}.start_run_v2(text, uuid, text, text, text[], text, text, text,
                                           text, integer, bigint, integer, double precision,
                                           text, numeric, text, text),
                          {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                          {s}.cancel_run_v1(text, uuid, text)
    TO outbox_relay;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
