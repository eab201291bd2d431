"""API keys of ``outbox serve``: each key acts for one tenant, is shown once, kept hashed.

A key is ``ob-`` followed by 32 random bytes (URL-safe base64); only its SHA-256 is stored,
so a database dump gives no usable key. Creating and revoking are journaled under the key's
tenant. Looking a key up happens before any tenant is known: ``api_key_tenant_v1``
(SECURITY DEFINER) answers it for ``outbox_api`` without letting that role read ``api_keys``,
so ``outbox serve`` may log in as a mere member of ``outbox_api``.
Like the writer, these functions run on the caller's connection and never commit.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any

import psycopg

from outbox.calls import check_tenant
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal

Q = queries("keys.sql")
PREFIX = "ob-"
SHOWN_CHARS = 10  # characters of a key kept in clear to tell keys apart in listings


def digest(key: str) -> str:
    """The SHA-256 (hex) a key is stored and looked up by."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(
    conn: psycopg.Connection[Any], tenant_id: str, *, name: str | None = None, actor: str = ""
) -> tuple[Row, str]:
    """A new key for ``tenant_id``: its row and the key itself (shown this once)."""
    check_tenant(tenant_id)
    if tenant_id == "*":
        raise InvalidInput("'*' is not a tenant", hint="name the tenant the key acts for")
    key = PREFIX + secrets.token_urlsafe(32)
    row = fetch_one(
        conn,
        Q.insert_key,
        {
            "tenant_id": tenant_id,
            "name": name,
            "key_hash": digest(key),
            "key_prefix": key[:SHOWN_CHARS],
        },
    )
    assert row is not None
    journal(
        conn,
        "api_key.created",
        tenant_id,
        actor=actor or None,
        detail={"key_id": str(row["id"]), "name": name, "key_prefix": row["key_prefix"]},
    )
    return row, key


def list_keys(conn: psycopg.Connection[Any], tenant_id: str | None = None) -> list[Row]:
    """Every key (of one tenant when given), newest first, without hashes."""
    return fetch_all(conn, Q.list_keys, {"tenant_id": tenant_id})


def revoke_key(conn: psycopg.Connection[Any], key_id: uuid.UUID, *, actor: str = "") -> Row:
    """Revoke a key: every later request with it is refused (401). Revoking twice keeps the
    first time; ``NotFound`` for an unknown id."""
    row = fetch_one(conn, Q.revoke_key, {"id": key_id})
    if row is None:
        raise NotFound(f"API key {key_id} does not exist", hint="`outbox keys list` shows them")
    journal(
        conn,
        "api_key.revoked",
        row["tenant_id"],
        actor=actor or None,
        detail={"key_id": str(row["id"]), "key_prefix": row["key_prefix"]},
    )
    return row


def tenant_of(conn: psycopg.Connection[Any], key: str) -> str | None:
    """The tenant ``key`` acts for, or None for an unknown or revoked key."""
    if not key.startswith(PREFIX):
        return None
    row = fetch_one(conn, Q.tenant_of_key, {"key_hash": digest(key)})
    return None if row is None or row["tenant_id"] is None else str(row["tenant_id"])
