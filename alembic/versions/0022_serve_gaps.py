"""``outbox serve`` logs in as less than the schema owner; assistants can be deleted.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-24

``api_key_tenant_v1`` (SECURITY DEFINER, executable by ``outbox_api``) answers the tenant of
a key's SHA-256, so the server's login needs only membership in ``outbox_api``, not the
schema owner's rights (it never reads ``api_keys`` itself). ``assistant_runs`` clears its
link when an assistant is deleted (``ON DELETE SET NULL (assistant_id)``) and ``outbox_api``
may delete its tenant's assistants. The SQL is ``0022_serve_gaps.sql`` beside this file,
frozen. The downgrade drops the function, revokes the grant and restores the link as 0020
made it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0022_serve_gaps.sql")

DOWNGRADE = """
DROP FUNCTION {s}.api_key_tenant_v1(text);
REVOKE DELETE ON {s}.assistants FROM outbox_api;
ALTER TABLE {s}.assistant_runs DROP CONSTRAINT assistant_runs_assistant_fk;
ALTER TABLE {s}.assistant_runs ADD CONSTRAINT assistant_runs_assistant_fk
    FOREIGN KEY (assistant_id, tenant_id) REFERENCES {s}.assistants (id, tenant_id);
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
