"""Tenant scope: which tenant's rows this transaction may see and write.

Row-level security (migration 0002) keys every tenant table on the setting
``outbox.tenant_id``. The writer API calls ``scope`` first thing in each public function that
takes a tenant, so a backend connected as ``outbox_writer`` sees and changes only that
tenant's rows, whatever its code asks for. The setting is transaction-local
(``set_config(..., true)``): it ends with the caller's transaction and never leaks to the next
user of a pooled connection. Roles that see every tenant (the relay, the owner, superusers)
are unaffected by it, so the relay may call the same functions across tenants.
"""

from __future__ import annotations

from typing import Any

import psycopg

from outbox.sql import queries

Q = queries("tenancy.sql")
SETTING = "outbox.tenant_id"


def scope(conn: psycopg.Connection[Any], tenant_id: str) -> None:
    """Bind the current transaction to ``tenant_id`` (until it commits or rolls back)."""
    conn.execute(Q.scope, {"tenant_id": tenant_id})
