"""Migrations are history: each revision makes the same schema, going up or coming down.

A migration that read a living file (``outbox/sql/views.sql``) would create, at its own
revision, whatever that file says today: a database migrated to 0002 would already have
0008's view. Here the schema is dumped from the catalogs at every revision on the way up,
one step at a time, and again at every revision on the way back down: the two dumps of a
revision must be equal. Then the living files of ``outbox/sql/`` must be what the head
revision created: applying them again to a migrated database changes nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg

from outbox import db, migrate
from outbox.sql import sql_file

SCHEMA = "outbox"

# Everything a migration can create in the schema, as text that names no OIDs.
CATALOG: dict[str, str] = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default, ordinal_position
        FROM information_schema.columns WHERE table_schema = %(s)s""",
    "tables": """
        SELECT c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity,
               coalesce(c.reloptions, '{}')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s""",
    "constraints": """
        SELECT cl.relname, co.conname, pg_get_constraintdef(co.oid)
        FROM pg_constraint co JOIN pg_class cl ON cl.oid = co.conrelid
        JOIN pg_namespace n ON n.oid = cl.relnamespace WHERE n.nspname = %(s)s""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s",
    "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = %(s)s",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               coalesce(p.proacl, acldefault('f', p.proowner))::text
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(s)s""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND NOT t.tgisinternal""",
    "policies": """
        SELECT tablename, policyname, permissive, roles::text, cmd, qual, with_check
        FROM pg_policies WHERE schemaname = %(s)s""",
    "table_grants": """
        SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants
        WHERE table_schema = %(s)s AND grantee LIKE 'outbox%%'""",
    "column_grants": """
        SELECT grantee, table_name, column_name, privilege_type
        FROM information_schema.column_privileges
        WHERE table_schema = %(s)s AND grantee LIKE 'outbox%%'""",
    # A never-granted ACL is NULL, the same rights as the default written out.
    "schema_grants": """
        SELECT coalesce(nspacl, acldefault('n', nspowner))::text
        FROM pg_namespace WHERE nspname = %(s)s""",
}


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            name: sorted(conn.execute(query, {"s": SCHEMA}).fetchall(), key=repr)
            for name, query in CATALOG.items()
        }


def differences(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, Any]:
    out = {}
    for name in CATALOG:
        gone = [r for r in a[name] if r not in b[name]]
        new = [r for r in b[name] if r not in a[name]]
        if gone or new:
            out[name] = {"only_before": gone, "only_after": new}
    return out


def test_every_revision_gives_the_same_schema_going_up_and_coming_down(empty_db_url):
    revisions = migrate.revisions()
    assert revisions[0] == "0001" and revisions[-1] == migrate.head_revision()
    going_up = {}
    for revision in revisions:
        migrate.upgrade(empty_db_url, revision, schema=SCHEMA)
        going_up[revision] = dump(empty_db_url)
    # (base is no revision: the schema and its version table stay; test_migrations checks it)
    for revision in reversed(revisions[:-1]):
        migrate.downgrade(empty_db_url, revision, schema=SCHEMA)
        coming_down = dump(empty_db_url)
        diff = differences(going_up[revision], coming_down)
        assert diff == {}, f"revision {revision} differs on the way down: {diff}"


def test_each_revision_makes_what_it_made_when_written(empty_db_url):
    """0002 created run_timeline without the tenant join that 0008 added."""
    migrate.upgrade(empty_db_url, "0002", schema=SCHEMA)
    views = dict(dump(empty_db_url)["views"])
    assert "r.tenant_id" not in views["run_timeline"]
    migrate.upgrade(empty_db_url, "0008", schema=SCHEMA)
    views = dict(dump(empty_db_url)["views"])
    assert "r.tenant_id" in views["run_timeline"]


def test_the_sql_files_are_what_the_head_revision_made(db_url):
    """``outbox/sql/*.sql`` run again on a migrated database change nothing."""
    before = dump(db_url)
    with psycopg.connect(db_url) as conn:
        for name in ("views.sql", "functions.sql"):
            conn.execute(sql_file(name).replace("{s}", db.quote_ident(SCHEMA)))  # type: ignore[arg-type]
        conn.commit()
    assert differences(before, dump(db_url)) == {}
