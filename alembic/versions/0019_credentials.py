"""The credential broker: per-tenant secrets, by reference or encrypted.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-24

``credentials`` keeps, per tenant (``'*'``: the default), how the relay finds the secret
a tool's ``credential_ref`` names: an environment variable, a file, or the value encrypted
with a key only the relay holds; the header it is sent in; its version (rotation) and
whether it was revoked (``outbox.credentials``, docs/actions.md). The SQL is
``0019_credentials.sql`` beside this file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0019_credentials.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql("DROP TABLE {s}.credentials;")
