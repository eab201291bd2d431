"""Tenant scope: which tenant's rows this transaction may see and write.

Row-level security keys every tenant table on the setting
``outbox.tenant_id``. The writer API calls ``scope`` first thing in each public function that
takes a tenant, so a backend connected as ``outbox_writer`` sees and changes only that
tenant's rows, whatever its code asks for. The setting is transaction-local
(``set_config(..., true)``): it ends with the caller's transaction and never leaks to the next
user of a pooled connection. Roles that see every tenant (the relay, the owner, superusers)
are unaffected by it, so the relay may call the same functions across tenants.

That setting guards against bugs, not against a hostile backend, which may set it to any
tenant. A login role bound to a tenant (``grant_role``, ``outbox tenants grant``) is
confined by its credential instead: row-level security and the SQL functions ask
``current_tenant_v1()``, which is the bound tenant of ``session_user``
whatever the session sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from outbox import calls
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal

Q = queries("tenancy.sql")
SETTING = "outbox.tenant_id"
BOUND = "outbox_bound_tenant"  # the connection's attribute while ``bound`` holds


def scope(conn: psycopg.Connection[Any], tenant_id: str) -> None:
    """Bind the current transaction to ``tenant_id`` (until it commits or rolls back);
    nothing to do inside ``bound`` for the same tenant."""
    if getattr(conn, BOUND, None) == tenant_id:
        return
    conn.execute(Q.scope, {"tenant_id": tenant_id})


@contextmanager
def bound(conn: psycopg.Connection[Any], tenant_id: str) -> Iterator[None]:
    """For the block, the connection's transaction is known to be bound to ``tenant_id``:
    the caller scoped it (``Q.scope``'s setting) outside any savepoint and ends the
    transaction only after the block, so ``scope`` for that tenant skips its statement.
    ``outbox serve`` opens every request's transaction so: the writer functions it calls
    would otherwise set the same setting again, one round trip each."""
    setattr(conn, BOUND, tenant_id)
    try:
        yield
    finally:
        setattr(conn, BOUND, None)


def grant_role(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    role: str,
    *,
    actor: str | None = None,
    create_with_password: str | None = None,
) -> dict[str, Any]:
    """Bind login ``role`` to ``tenant_id`` and give it the writer's rights: its sessions
    act for that tenant only, whatever they set. ``create_with_password`` creates the role
    (LOGIN) first. Refused for a role that sees every tenant anyway (superuser, BYPASSRLS,
    a relay or the schema owner) and for one bound to another tenant."""
    calls.check_tenant(tenant_id)
    if not role or len(role) > 63:
        raise InvalidInput("a role name is 1-63 characters")
    if create_with_password is not None:
        # Hashed here (SCRAM), so the clear password is in no statement the server may log.
        hashed = conn.pgconn.encrypt_password(
            create_with_password.encode(), role.encode(), b"scram-sha-256"
        )
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(hashed.decode())
            )
        )
    facts = fetch_one(conn, Q.role_facts, {"role": role})
    if facts is None:
        raise NotFound(
            f"role {role!r} does not exist",
            hint="create it (CREATE ROLE ... LOGIN) or pass --create",
        )
    if facts["bypasses_rls"] or facts["is_relay"] or facts["is_owner"]:
        raise InvalidInput(
            f"role {role!r} sees every tenant (superuser, BYPASSRLS, a relay or the schema "
            "owner): binding it to one tenant would not confine it",
            hint="bind a role made for this backend only",
        )
    if facts["bound_to"] not in (None, tenant_id):
        raise InvalidInput(
            f"role {role!r} is bound to tenant {facts['bound_to']}",
            hint=f"`outbox tenants revoke --role {role}` first",
        )
    conn.execute(sql.SQL("GRANT outbox_writer TO {}").format(sql.Identifier(role)))
    row = fetch_one(
        conn, Q.bind_role, {"role": role, "tenant_id": tenant_id, "actor": actor or "unknown"}
    )
    if row is not None:
        journal(conn, "tenant.role_granted", tenant_id, actor=actor, detail={"role": role})
    return {"role_name": role, "tenant_id": tenant_id, "created": row is not None}


def revoke_role(conn: psycopg.Connection[Any], role: str, *, actor: str | None = None) -> str:
    """Unbind ``role`` and take the writer's rights back; returns the tenant it was bound to."""
    row = fetch_one(conn, Q.unbind_role, {"role": role})
    if row is None:
        raise NotFound(f"role {role!r} is bound to no tenant", hint="`outbox tenants roles`")
    conn.execute(sql.SQL("REVOKE outbox_writer FROM {}").format(sql.Identifier(role)))
    journal(conn, "tenant.role_revoked", row["tenant_id"], actor=actor, detail={"role": role})
    return str(row["tenant_id"])


def roles(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return fetch_all(conn, Q.roles, {})
