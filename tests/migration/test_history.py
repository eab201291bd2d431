"""Migrations are history: each revision makes the same schema, going up or coming down.

A migration that read a living file (``sql/views.sql``) would create, at its own
revision, whatever that file says today: a database migrated to 0002 would already have
0008's view. Here the schema is dumped from the catalogs at every revision on the way up,
one step at a time, and again at every revision on the way back down: the two dumps of a
revision must be equal. Then the living files of ``sql/`` must be what the head
revision created: applying them again to a migrated database changes nothing (they agree
with it), and applying them to that database stripped of every function, view, trigger,
policy and grant gives it all back (they hold all of it: an object a migration created and
the files forgot fails here).
"""

from __future__ import annotations

import re
from collections import Counter
from pprint import pformat
from typing import Any

import psycopg

from outbox import db, migrate
from outbox.sql import LIVE_FILES, sql_file

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
    # ACLs are compared as sorted lists: the order of their items is the order the grants
    # happened to run in, which means nothing. A never-granted ACL is NULL, the same rights
    # as the default written out.
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               (SELECT array_agg(a::text ORDER BY a::text)
                FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a)
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
    "schema_grants": """
        SELECT (SELECT array_agg(a::text ORDER BY a::text)
                FROM unnest(coalesce(nspacl, acldefault('n', nspowner))) a)
        FROM pg_namespace WHERE nspname = %(s)s""",
    # Every grantee, PUBLIC and the owner too (table_grants sees only the outbox roles).
    "relation_acls": """
        SELECT c.relname,
               (SELECT array_agg(a::text ORDER BY a::text)
                FROM unnest(coalesce(c.relacl, acldefault(
                    (CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))) a)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')""",
    # A column whose every right was revoked may keep an empty ACL: the same as none.
    "column_acls": """
        SELECT c.relname, a.attname, (SELECT array_agg(i::text ORDER BY i::text)
                                      FROM unnest(a.attacl) i)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND cardinality(a.attacl) > 0 AND NOT a.attisdropped""",
    # The roles are the cluster's, not the schema's: roles.sql may create them, never alter.
    "roles": """
        SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin,
               rolreplication, rolbypassrls
        FROM pg_roles
        WHERE rolname IN ('outbox_writer', 'outbox_relay', 'outbox_auditor', 'outbox_api')""",
}

# What the files of sql/ claim to hold, taken from the schema: the rights of every
# grantee but the owner (PUBLIC too) on the schema, its relations and their columns, row-level
# security, and every policy, trigger, view and function. No CASCADE: should anything else
# depend on these (an index or a column default that calls a function), its drop fails and
# names it, rather than taking it along unnoticed. The roles stay (they are the cluster's;
# other databases use them).
STRIP = """
DO $$
DECLARE
    v_schema   text := current_setting('outbox_test.schema');
    v_ns       regnamespace := quote_ident(v_schema)::regnamespace;
    v_grantees text;
    v_drop     text;
    r          record;
BEGIN
    SELECT string_agg(DISTINCT coalesce(quote_ident(ro.rolname), 'PUBLIC'), ', ')
    INTO v_grantees
    FROM (SELECT (aclexplode(nspacl)).grantee AS grantee, nspowner AS owner
          FROM pg_namespace WHERE oid = v_ns
          UNION ALL
          SELECT (aclexplode(c.relacl)).grantee, c.relowner
          FROM pg_class c WHERE c.relnamespace = v_ns
          UNION ALL
          SELECT (aclexplode(a.attacl)).grantee, c.relowner
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          WHERE c.relnamespace = v_ns) g
    LEFT JOIN pg_roles ro ON ro.oid = g.grantee
    WHERE g.grantee <> g.owner;
    IF v_grantees IS NOT NULL THEN
        EXECUTE format('REVOKE ALL ON SCHEMA %1$I FROM %2$s;
                        REVOKE ALL ON ALL TABLES IN SCHEMA %1$I FROM %2$s;
                        REVOKE ALL ON ALL SEQUENCES IN SCHEMA %1$I FROM %2$s',
                       v_schema, v_grantees);
    END IF;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
             WHERE c.relnamespace = v_ns AND (c.relrowsecurity OR c.relforcerowsecurity) LOOP
        EXECUTE format('ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY',
                       r.rel);
    END LOOP;
    FOR r IN SELECT p.polname, p.polrelid::regclass AS rel FROM pg_policy p
             JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = v_ns LOOP
        EXECUTE format('DROP POLICY %I ON %s', r.polname, r.rel);
    END LOOP;
    FOR r IN SELECT t.tgname, t.tgrelid::regclass AS rel FROM pg_trigger t
             JOIN pg_class c ON c.oid = t.tgrelid
             WHERE c.relnamespace = v_ns AND NOT t.tgisinternal
               AND t.tgparentid = 0 LOOP  -- a partition's clone goes with its parent's
        EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
    END LOOP;
    SELECT 'DROP VIEW ' || string_agg(c.oid::regclass::text, ', ') INTO v_drop
    FROM pg_class c WHERE c.relnamespace = v_ns AND c.relkind IN ('v', 'm');
    IF v_drop IS NOT NULL THEN
        EXECUTE v_drop;
    END IF;
    SELECT 'DROP ROUTINE ' || string_agg(p.oid::regprocedure::text, ', ') INTO v_drop
    FROM pg_proc p WHERE p.pronamespace = v_ns;
    IF v_drop IS NOT NULL THEN
        EXECUTE v_drop;
    END IF;
END $$;
"""

# The parts of the dump the files of sql/ make; after STRIP each is empty (or at its
# default), which proves the strip took away what the files must give back.
LIVE = ("views", "functions", "triggers", "policies", "table_grants", "column_grants")


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            name: sorted(conn.execute(query, {"s": SCHEMA}).fetchall(), key=repr)
            for name, query in CATALOG.items()
        }


def differences(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, Any]:
    out = {}
    for name in CATALOG:
        after = b[name]
        if name == "roles":
            # Roles are the cluster's: coming down keeps those a later revision made (other
            # databases may use them), so on a fresh server they are in b and not in a.
            before = {row[0] for row in a[name]}
            after = [row for row in after if row[0] in before]
        # Rows as multisets, keyed by repr (rows hold lists, which do not hash): comparing
        # list to list was quadratic, a second of CPU per revision for the functions alone.
        was, now = Counter(map(repr, a[name])), Counter(map(repr, after))
        gone = [r for r in a[name] if was[repr(r)] > now[repr(r)]]
        new = [r for r in after if now[repr(r)] > was[repr(r)]]
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


def live_sql(name: str) -> str:
    """A file of ``sql/`` for the test schema."""
    return sql_file(name).replace("{s}", db.quote_ident(SCHEMA))


def apply_files(conn: psycopg.Connection[Any], files: dict[str, str]) -> None:
    for text in files.values():
        conn.execute(text.encode())  # as written: a '%' in the SQL is no parameter


def strip(conn: psycopg.Connection[Any]) -> None:
    # Qualified names in the catalog's text form: the schema is not on this search_path.
    conn.execute("SET LOCAL search_path = pg_catalog")
    conn.execute("SELECT set_config('outbox_test.schema', %s, true)", (SCHEMA,))
    conn.execute(STRIP.encode())
    conn.execute("RESET search_path")


def test_the_sql_files_are_what_the_head_revision_made(db_url):
    """``sql/*.sql`` run again on a migrated database change nothing."""
    before = dump(db_url)
    with psycopg.connect(db_url) as conn:
        apply_files(conn, {name: live_sql(name) for name in LIVE_FILES})
        conn.commit()
    assert differences(before, dump(db_url)) == {}


def test_the_sql_files_hold_everything_but_the_tables(db_url):
    """A database at head, stripped of its functions, views, triggers, policies, row-level
    security and grants, is itself again once the files of ``sql/`` are applied: the
    files hold every live object the migrations made, not only agree with the ones they
    hold."""
    head = dump(db_url)
    with psycopg.connect(db_url) as conn:
        strip(conn)
        conn.commit()
    stripped = dump(db_url)
    assert {name: stripped[name] for name in LIVE if stripped[name]} == {}
    assert not any(rls or force for _, _, rls, force, _ in stripped["tables"])
    # Only the owner's own rights are left, as if nothing had ever been granted.
    assert [acl for (acl,) in stripped["schema_grants"] if len(acl) > 1] == []
    assert [row for row in stripped["relation_acls"] if len(row[1]) > 1] == []
    with psycopg.connect(db_url) as conn:
        apply_files(conn, {name: live_sql(name) for name in LIVE_FILES})
        conn.commit()
    diff = differences(head, dump(db_url))
    assert diff == {}, f"sql/ lacks (only_before) or adds (only_after):\n{pformat(diff)}"


def test_a_live_object_missing_from_the_files_is_caught(db_url):
    """The test above fails when the files forget something: here one policy."""
    files = {name: live_sql(name) for name in LIVE_FILES}
    quoted = re.escape(db.quote_ident(SCHEMA))
    files["policies.sql"], found = re.subn(
        rf"CREATE POLICY audit_read ON {quoted}\.runs\b[^;]*;", "", files["policies.sql"]
    )
    assert found == 1
    head = dump(db_url)
    with psycopg.connect(db_url) as conn:
        strip(conn)
        apply_files(conn, files)
        conn.commit()
    assert differences(head, dump(db_url)) == {
        "policies": {
            "only_before": [r for r in head["policies"] if r[:2] == ("runs", "audit_read")],
            "only_after": [],
        }
    }
