"""The accounts and sessions of the web console of ``outbox serve``.

Revision ID: 0054
Revises: 0053
Create Date: 2026-12-07

``console_users``: a person's name, tenant (``*``: an operator of every tenant), role and
the argon2 hash of their password, with the count of failed sign-ins that locks the account.
``console_sessions``: the SHA-256 of a signed-in browser's cookie token and the CSRF token
of its forms. The server reads them before any tenant is known through four SECURITY DEFINER
functions granted to ``outbox_api`` (as ``api_key_tenant_v1`` reads keys); no tenant role
reads the tables. The SQL is ``0054_console_accounts.sql`` beside this file, frozen;
``approval_notify`` tells the console of every approval requested or decided
(``NOTIFY outbox_approvals``); ``runs_tenant_created`` serves the console's runs list, a
page at a time. ``0054_console_accounts_down.sql`` drops what it made.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0054"
down_revision = "0053"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0054_console_accounts.sql")
DOWN = frozen_sql(__file__, "0054_console_accounts_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
