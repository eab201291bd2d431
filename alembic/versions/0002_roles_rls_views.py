"""Least-privilege roles, tenant isolation with row-level security, DBA views, journal pruning.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Written as SQL, like 0001, so a DBA reads exactly what the database enforces.
``{s}`` stands for the quoted schema name.

Roles are cluster-wide while schemas are per database, and several databases (every test
database, or staging beside production) may share a server: the roles are created only when
missing (and tolerate a concurrent creator), and the downgrade revokes what this schema
granted them but never drops them, since another database may still use them.

Row-level security is keyed by the transaction-local setting ``outbox.tenant_id`` that the
writer API sets (``outbox.tenancy.scope``). Policies are permissive and ORed per role:
``tenant_isolation`` applies to every role (PUBLIC), ``all_tenants`` adds every row for the
relay and for the role that ran this migration (the owner: FORCE ROW LEVEL SECURITY would
otherwise lock a non-superuser owner out of its own tables), ``audit_read`` lets the auditor
read every tenant. A session without the setting sees no tenant rows at all.

The views are ``0002_views.sql`` beside this file, frozen as this revision created them
(``outbox/sql/views.sql`` holds them as they are now).
"""

from __future__ import annotations

import re

from alembic import op

from outbox.migrate import frozen_sql, schema_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

VIEWS = frozen_sql(__file__, "0002_views.sql")

ROLES = ("outbox_writer", "outbox_relay", "outbox_auditor")

# Every table that carries tenant_id, i.e. every table of 0001.
TENANT_TABLES = (
    "threads",
    "runs",
    "messages",
    "model_turns",
    "tool_batches",
    "tool_calls",
    "tool_results",
    "orphaned_results",
    "submissions",
    "outbox",
    "tools",
    "journal",
)
# What a backend writes through the writer API (intents, client results, its own history).
WRITER_TABLES = (
    "threads",
    "runs",
    "messages",
    "model_turns",
    "tool_batches",
    "tool_calls",
    "tool_results",
    "orphaned_results",
    "submissions",
)

CREATE_ROLE = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        CREATE ROLE {role} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;  -- created concurrently
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'role {role} does not exist and % may not create it', current_user
            USING HINT = 'create it once as a superuser: CREATE ROLE {role} NOLOGIN';
END $$;
"""


def _grants() -> str:
    writer = ", ".join(f"{{s}}.{t}" for t in WRITER_TABLES)
    relay = writer + ", {s}.outbox"
    return f"""
GRANT USAGE ON SCHEMA {{s}} TO outbox_writer, outbox_relay, outbox_auditor;

-- Backends: write intents and read their own tenant. They may enqueue work (INSERT; SELECT
-- for ON CONFLICT ... RETURNING) but hold no UPDATE or DELETE on the outbox, so they cannot
-- claim (FOR UPDATE needs UPDATE), lease or finish rows. The journal is append-only for
-- them: INSERT for the writer API's events, no SELECT, UPDATE, DELETE or TRUNCATE.
GRANT SELECT, INSERT, UPDATE ON {writer} TO outbox_writer;
GRANT SELECT, INSERT ON {{s}}.outbox TO outbox_writer;
GRANT SELECT ON {{s}}.tools TO outbox_writer;
GRANT INSERT ON {{s}}.journal TO outbox_writer;

-- Relay workers: claim, lease, complete (done rows are deleted), across tenants.
GRANT SELECT, INSERT, UPDATE ON {relay} TO outbox_relay;
GRANT DELETE ON {{s}}.outbox TO outbox_relay;
GRANT SELECT ON {{s}}.tools TO outbox_relay;
GRANT INSERT ON {{s}}.journal TO outbox_relay;

-- Auditors: the journal and the views, nothing else, never a write.
GRANT SELECT ON {{s}}.journal TO outbox_auditor;
"""


def _rls() -> str:
    statements = []
    for table in TENANT_TABLES:
        if table == "tools":  # shared tools ('*') are visible to every tenant
            mine = "tenant_id IN (current_setting('outbox.tenant_id', true), '*')"
            check = "tenant_id = current_setting('outbox.tenant_id', true)"
        else:
            mine = check = "tenant_id = current_setting('outbox.tenant_id', true)"
        statements.append(f"""
ALTER TABLE {{s}}.{table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {{s}}.{table} FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON {{s}}.{table} TO PUBLIC
    USING ({mine}) WITH CHECK ({check});
CREATE POLICY all_tenants ON {{s}}.{table} TO outbox_relay, CURRENT_USER
    USING (true) WITH CHECK (true);
CREATE POLICY audit_read ON {{s}}.{table} FOR SELECT TO outbox_auditor USING (true);
""")
    return "".join(statements)


# The 0001 trigger, now honouring one narrow exception: a DELETE run by prune_journal, which
# marks its own transaction with its transaction id. Updates and truncation stay refused, and
# so does every DELETE outside that function.
JOURNAL_GUARD = """
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND current_setting('outbox.journal_prune', true) = pg_current_xact_id()::text THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;

-- Delete journal events older than older_than (and journal that it happened). Runs with
-- its owner's rights; only the owner (and superusers) may execute it.
CREATE FUNCTION {s}.prune_journal(older_than interval, actor text DEFAULT session_user)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    removed bigint;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'prune_journal needs a positive age, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('outbox.journal_prune', pg_current_xact_id()::text, true);
    DELETE FROM {s}.journal WHERE at < now() - older_than;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('outbox.journal_prune', '', true);
    INSERT INTO {s}.journal (tenant_id, event, actor, detail)
    VALUES ('*', 'journal.pruned', actor,
            jsonb_build_object('older_than', older_than::text, 'removed', removed,
                               'before', now() - older_than));
    RETURN removed;
END $$;
REVOKE EXECUTE ON FUNCTION {s}.prune_journal(interval, text) FROM PUBLIC;
"""

JOURNAL_GUARD_0001 = """
CREATE OR REPLACE FUNCTION {s}.journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the outbox journal is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'journal rows are evidence; prune old ones with "outbox prune"';
END $$;
"""


def view_names(text: str) -> list[str]:
    """The views a file of ``CREATE OR REPLACE VIEW`` statements defines, in file order."""
    return re.findall(r"CREATE OR REPLACE VIEW \{s\}\.(\w+)", text)


def upgrade() -> None:
    for role in ROLES:
        op.execute(CREATE_ROLE.format(role=role))
    op.execute(schema_sql(_grants()))
    op.execute(schema_sql(_rls()))
    op.execute(schema_sql(JOURNAL_GUARD))
    op.execute(schema_sql(VIEWS))
    names = ", ".join(f"{{s}}.{name}" for name in view_names(VIEWS))
    op.execute(schema_sql(f"GRANT SELECT ON {names} TO outbox_auditor;"))


def downgrade() -> None:
    views = ", ".join(f"{{s}}.{name}" for name in view_names(VIEWS))
    policies = "".join(
        f"""
DROP POLICY IF EXISTS tenant_isolation ON {{s}}.{table};
DROP POLICY IF EXISTS all_tenants ON {{s}}.{table};
DROP POLICY IF EXISTS audit_read ON {{s}}.{table};
ALTER TABLE {{s}}.{table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {{s}}.{table} DISABLE ROW LEVEL SECURITY;
"""
        for table in TENANT_TABLES
    )
    roles = ", ".join(ROLES)
    op.execute(
        schema_sql(
            f"""
DROP VIEW IF EXISTS {views};
DROP FUNCTION IF EXISTS {{s}}.prune_journal(interval, text);
{JOURNAL_GUARD_0001}
{policies}
REVOKE ALL ON ALL TABLES IN SCHEMA {{s}} FROM {roles};
REVOKE ALL ON SCHEMA {{s}} FROM {roles};
"""
        )
    )
