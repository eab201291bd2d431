"""Console people who sign in through an OpenID Connect provider.

Revision ID: 0059
Revises: 0058
Create Date: 2026-12-07

``console_users.oidc_subject``: the subject (``sub``) of the person at the provider that
``outbox serve --oidc-issuer`` names, set by an operator (``outbox console users add ...
--oidc-subject``), never taken from the provider alone; unique, so one subject is one
person. A person may sign in with a password, through the provider, or both: the password
hash may now be NULL when a subject is set. ``console_oidc_signed_in_v1`` opens the session
of the person with a subject the server has verified, before any tenant is known (SECURITY
DEFINER, granted to ``outbox_api``, as ``console_signed_in_v1``). The SQL is
``0059_console_oidc.sql`` beside this file, frozen; ``0059_console_oidc_down.sql`` drops
what it made (and fails while a person without a password exists: remove them first).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0059"
down_revision = "0058"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0059_console_oidc.sql")
DOWN = frozen_sql(__file__, "0059_console_oidc_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
