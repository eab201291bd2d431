"""Every key of a tenant's table names its tenant: the tables can be distributed by tenant.

Revision ID: 0057
Revises: 0056
Create Date: 2026-12-07

Citus shards a table by one column and requires every primary key, unique constraint and
foreign key between sharded tables to include it. Every primary key, unique constraint
and foreign key of a table that carries ``tenant_id`` now includes it (docs/scale.md), and
keeps its columns' order with ``tenant_id`` last, so a lookup by id alone reads the same
index as before. A unique ``(id, tenant_id)`` that stood beside a primary key ``(id)``
becomes the primary key: one index less on six tables. Every dedup constraint stays as
strong: each was unique over a column that names one row of one tenant
(docs/guarantees.md). The tables read before a tenant is known (``api_keys``,
``tenant_roles``, ``console_users``, ``console_sessions``) keep their keys: reference tables
on Citus. The functions that insert ``ON CONFLICT`` name the new keys, the view
``duplicate_executions`` names every column it groups by, and the four trigger functions that
looked rows of another table up without their tenant name it. The SQL is
``0057_tenant_keys.sql`` beside this file, frozen; ``0057_tenant_keys_down.sql`` puts back
the keys, the view and the functions of 0056.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0057"
down_revision = "0056"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0057_tenant_keys.sql")
DOWN = frozen_sql(__file__, "0057_tenant_keys_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
