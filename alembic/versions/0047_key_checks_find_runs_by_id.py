"""The foreign-key checks of ``runs`` find the run by its id, whenever they were planned.

Revision ID: 0047
Revises: 0046
Create Date: 2026-11-28

A foreign-key check of a row that names its run and tenant (model_turns, submissions,
responses, approvals, assistant_runs) is PostgreSQL's ``SELECT 1 FROM ONLY runs x WHERE id =
$1 AND tenant_id = $2 FOR KEY SHARE OF x``, and ``start_run_v2`` looks for the thread's
active run (``thread_id = $1`` and an active status, and the tenant by row-level
security); each is planned once per connection and kept (generic plans). Planned while
``runs`` held a few hundred rows and no statistics, an index that starts with
``tenant_id`` (``runs_tenant_status``, ``runs_tenant_idempotency_key``) cost the same as
the one on ``id`` or on ``thread_id``, and the plan that took it read every run (every
active run) of the tenant on each call for the life of the connection (PostgreSQL 15 and
18; ``tests/integration/test_turn_plans.py``). Neither index can serve such a lookup now:
``runs_tenant_status`` is partial on ``created_at > '-infinity'``, which every row meets
and which only a statement that states it proves (``list_runs``; an ``IS NOT NULL`` of a
NOT NULL column would not do: PostgreSQL 17 and later drop it from the statement); the
idempotency key's unique constraint lists ``idempotency_key`` first (the same constraint:
``ON CONFLICT (tenant_id, idempotency_key)`` infers it whatever the order, and its lookups
name both columns). ``tool_calls_idempotency_key`` likewise: with the tenant first, the
server's read of a response's calls ANDed a bitmap of every tool call of the tenant (the
tenant from row-level security) into a lookup by run. The SQL is
``0047_key_checks_find_runs_by_id.sql`` beside this file, frozen; the downgrade makes the
three indexes again as they were (``0047_key_checks_find_runs_by_id_down.sql``).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0047_key_checks_find_runs_by_id.sql")
DOWN = frozen_sql(__file__, "0047_key_checks_find_runs_by_id_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
