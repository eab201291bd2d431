"""A tenant bound by credential: a backend's login role decides its tenant.

Before: a backend connected as ``outbox_writer`` picked its tenant by setting
``outbox.tenant_id``, so row-level security guarded against bugs, not against a hostile
backend. Here the backend logs in as its own role, bound to tenant A, and tries every way
it has to reach tenant B's rows: setting the scope, entering the tenant, the SQL functions
that run beyond row-level security, SET ROLE. None works.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox import tenancy, writer
from outbox.errors import InvalidInput, NotFound
from tests.helpers import add_tool, new_run, turn

A, B = "tenant-a", "tenant-b"


@pytest.fixture
def backend_role(db_url) -> Iterator[tuple[str, str]]:
    """A login role (cluster-wide, so named uniquely and dropped after) and its URL."""
    role = f"backend_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    url = make_conninfo(**{**conninfo_to_dict(db_url), "user": role, "password": password})
    try:
        yield role, url
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def seed(db_url: str) -> dict[str, uuid.UUID]:
    """A run of each tenant waiting for a client tool's output."""
    runs = {}
    with psycopg.connect(db_url) as conn:
        add_tool(conn, "approve", executor="client", endpoint=None)
        for tenant in (A, B):
            run = new_run(conn, tenant=tenant, tools=["approve"])
            writer.record_model_turn(conn, turn(run, 1, ("call_1", "approve", {"order_id": "1"})))
            runs[tenant] = run.id
        conn.commit()
    return runs


def test_a_bound_role_reaches_its_tenant_only_whatever_it_sets(db_url, backend_role):
    role, url = backend_role
    runs = seed(db_url)
    with psycopg.connect(db_url) as conn:
        tenancy.grant_role(conn, A, role, actor="dba")
        conn.commit()
    outputs = json.dumps([{"tool_call_id": "call_1", "output": {"ok": True}}])
    with psycopg.connect(url) as conn:
        # The scope it sets is ignored: it sees tenant A's rows, and those only.
        conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [B])
        seen = {r[0] for r in conn.execute("SELECT tenant_id FROM outbox.runs")}
        assert seen == {A}
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not tenant-b"):
            conn.execute("SELECT outbox.enter_tenant_v1(%s)", [B])
        conn.rollback()
        submit = "SELECT outbox.submit_tool_outputs_v1(%s, %s, %s::jsonb)"
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not tenant-b"):
            conn.execute(submit, [B, runs[B], outputs])
        conn.rollback()
        # Becoming the writer role does not change who the session is.
        conn.execute("SET ROLE outbox_writer")
        conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [B])
        assert {r[0] for r in conn.execute("SELECT tenant_id FROM outbox.runs")} == {A}
        conn.rollback()
        # Its own tenant's work goes on without any scope set.
        assert conn.execute(submit, [A, runs[A], outputs]).fetchone() == ("in_progress",)
        conn.commit()
    with psycopg.connect(db_url) as conn:
        statuses = dict(conn.execute("SELECT tenant_id, status FROM outbox.runs").fetchall())
    assert statuses == {A: "in_progress", B: "requires_action"}


def test_no_session_lever_moves_a_bound_role_to_another_tenant(db_url, backend_role):
    """Each way a session changes its own state (SET, SET SESSION, set_config at session
    level, RESET ROLE, RESET ALL, SET ROLE back and forth) leaves it acting for tenant A:
    it sees no row of B, writes none, and the functions beyond row-level security refuse B."""
    role, url = backend_role
    seed(db_url)
    with psycopg.connect(db_url) as conn:
        tenancy.grant_role(conn, A, role, actor="dba")
        conn.commit()
    levers = [
        f"SET outbox.tenant_id = '{B}'",
        f"SET SESSION outbox.tenant_id = '{B}'",
        f"SELECT set_config('outbox.tenant_id', '{B}', false)",
        "RESET ROLE",
        "SET ROLE outbox_writer",
        "RESET ALL",
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for lever in levers:
            conn.execute(lever)
            conn.execute(f"SET outbox.tenant_id = '{B}'")  # and the scope again after it
            assert conn.execute("SELECT outbox.current_tenant_v1()").fetchone() == (A,), lever
            seen = {r[0] for r in conn.execute("SELECT tenant_id FROM outbox.threads")}
            assert seen == {A}, lever
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(  # a direct write as tenant B is refused by row-level security
                    "INSERT INTO outbox.threads (id, tenant_id) VALUES (gen_random_uuid(), %s)",
                    [B],
                )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT outbox.create_thread_v1(%s)", [B])
        # Its session user is what binds it, and the session cannot change that.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET SESSION AUTHORIZATION outbox_writer")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE outbox.tenant_roles SET tenant_id = %s", [B])
        assert conn.execute("SELECT count(*) FROM outbox.tenant_roles").fetchone() == (1,)
    with psycopg.connect(db_url) as conn:
        threads = dict(
            conn.execute("SELECT tenant_id, count(*) FROM outbox.threads GROUP BY 1").fetchall()
        )
        bound = conn.execute(
            "SELECT tenant_id FROM outbox.tenant_roles WHERE role_name = %s", [role]
        ).fetchone()
    assert threads == {A: 1, B: 1} and bound == (A,)


def test_an_unbound_writer_still_picks_its_tenant_by_setting_it(db_url):
    """The old contract holds for roles that are not bound (outbox_writer itself)."""
    seed(db_url)
    with psycopg.connect(db_url) as conn:
        conn.execute("SET LOCAL ROLE outbox_writer")
        conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [B])
        assert {r[0] for r in conn.execute("SELECT tenant_id FROM outbox.runs")} == {B}


def test_granting_refuses_roles_that_would_not_be_confined(db_url, backend_role):
    role, _ = backend_role
    with psycopg.connect(db_url) as conn:
        owner = conn.execute("SELECT current_user").fetchone()[0]
        with pytest.raises(InvalidInput, match="sees every tenant"):
            tenancy.grant_role(conn, A, owner)
        conn.rollback()
        with pytest.raises(NotFound, match="does not exist"):
            tenancy.grant_role(conn, A, "no_such_role_here")
        conn.rollback()
        tenancy.grant_role(conn, A, role)
        with pytest.raises(InvalidInput, match="bound to tenant tenant-a"):
            tenancy.grant_role(conn, B, role)
        conn.rollback()
        tenancy.grant_role(conn, A, role)
        assert [r["role_name"] for r in tenancy.roles(conn)] == [role]
        assert tenancy.revoke_role(conn, role) == A
        assert tenancy.roles(conn) == []
        conn.commit()


def test_cli_creates_binds_lists_and_revokes_a_role(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    role = f"backend_{uuid.uuid4().hex[:10]}"
    runner = CliRunner()
    try:
        done = runner.invoke(
            cli.main, ["tenants", "grant", A, "--role", role, "--create"], input="s3cret-pw\n"
        )
        assert done.exit_code == 0, done.output
        assert f"role {role} acts for tenant {A} only" in done.output
        listed = runner.invoke(cli.main, ["tenants", "roles", "--json"])
        assert role in listed.output and "s3cret" not in listed.output
        empty = runner.invoke(cli.main, ["tenants", "grant", A, "--role", "x", "--create"])
        assert empty.exit_code == 2 and "read no password" in empty.output
        # The password works: the role logs in with it (it was sent hashed, SCRAM).
        url = make_conninfo(**{**conninfo_to_dict(db_url), "user": role, "password": "s3cret-pw"})
        with psycopg.connect(url) as backend:
            assert backend.execute("SELECT session_user").fetchone() == (role,)
        revoked = runner.invoke(cli.main, ["tenants", "revoke", "--role", role])
        assert revoked.exit_code == 0 and f"no longer acts for tenant {A}" in revoked.output
        with psycopg.connect(db_url) as conn:
            journal = conn.execute(
                "SELECT event FROM outbox.journal WHERE event LIKE 'tenant.role_%' ORDER BY id"
            ).fetchall()
            assert journal == [("tenant.role_granted",), ("tenant.role_revoked",)]
            assert "s3cret" not in str(conn.execute("SELECT * FROM outbox.journal").fetchall())
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_tenant_is_read_as_the_owner_and_tells_each_session_its_own(db_url, backend_role):
    """``current_tenant_v1`` runs as the schema owner (migration 0044: its plan is no longer
    made again at every change of user), who reads every mapping; a session still learns
    its own binding only: an unbound login role gets its setting or nothing, never the
    bound role's tenant, and the bound role gets its tenant under any current user."""
    role, url = backend_role
    other = f"backend_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    with psycopg.connect(db_url, autocommit=True) as conn:
        tenancy.grant_role(conn, A, role, actor="dba")
        conn.execute(f"CREATE ROLE {other} LOGIN PASSWORD '{password}' IN ROLE outbox_writer")
        definer, config = conn.execute(
            "SELECT prosecdef, proconfig FROM pg_proc"
            " WHERE oid = 'outbox.current_tenant_v1'::regproc"
        ).fetchone()
        assert definer and config == ["search_path=pg_catalog, pg_temp"]
    other_url = make_conninfo(**{**conninfo_to_dict(db_url), "user": other, "password": password})
    try:
        with psycopg.connect(other_url) as conn:
            ask = "SELECT outbox.current_tenant_v1()"
            assert conn.execute(ask).fetchone() == (None,)
            conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [B])
            assert conn.execute(ask).fetchone() == (B,)
            conn.execute("SET LOCAL ROLE outbox_writer")
            assert conn.execute(ask).fetchone() == (B,)
            conn.rollback()
        with psycopg.connect(url) as conn:
            conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [B])
            for user in ("outbox_writer", "NONE"):
                conn.execute(f"SET LOCAL ROLE {user}")
                assert conn.execute("SELECT outbox.current_tenant_v1()").fetchone() == (A,)
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {other}")
