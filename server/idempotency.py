"""An ``Idempotency-Key`` covers the whole request, not just the thread it names.

The key of a run is unique per tenant in the database (``runs.idempotency_key``;
docs/guarantees.md, invariant 2), which settles races; what the key was *sent with* is kept
beside the run it made: a digest of the whole normalised request (the endpoint, the ids of
its path and every field of its body, defaults filled in, ``stream`` apart since it changes
how the answer is sent, not what runs), journaled as ``run.requested`` in the transaction
that creates the run. A resend with the same key and the same digest gets the first
request's run; any difference is a 409 naming the key. Design choice: the journal rather
than a new column, so no migration; a run without a ``run.requested`` event answers a
resend by the key alone.

Requests that start no run of their own (``responses.create``, which may carry a waiting
run on, and a thread's new message) keep their key in the journal as ``request.keyed``,
under the key's own uuid (``key_id``: a uuid5 of the tenant and the key) in the ``run_id``
column. The journal has no foreign keys, ``journal_run`` indexes that column, and a uuid5
never equals a run's id (random, version 4): an indexed lookup without a migration. A key
lives as long as the journal partition that holds it (OpenAI keeps keys 24 hours).

One key is one request, whatever the endpoint: the digest names the endpoint, and every
lookup (``earlier``) looks in both places, so a key used for a response is a 409 on a run.
Twins sent at the same moment take turns (``hold``: a transaction-level advisory lock on
the tenant and key), so the second finds the first's object once it commits instead of
racing it to the unique index and answering a 409.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from pydantic import BaseModel

from outbox.server.db_pool import Q
from outbox.server.errors import APIError
from outbox.statements import Row, fetch_one, journal

EVENT = "run.requested"
KEYED = "request.keyed"  # the key of a request that started no run of its own
KEY_NAMESPACE = uuid.UUID("6f1c2a9e-29d0-5b1e-9a4f-0e29a7c0b1d2")  # key_id's uuid5 namespace
NOT_SENT = frozenset({"stream"})  # fields that change how the answer is sent, not what runs


def digest(endpoint: str, path: dict[str, str], body: BaseModel) -> str:
    """The request's digest: its endpoint, path ids and body, normalised."""
    request = {
        "endpoint": endpoint,
        "path": path,
        "body": body.model_dump(mode="json", exclude=set(NOT_SENT)),
    }
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Earlier:
    """What an earlier request with the key made: a run (``run_id``, ``thread_id``) or
    another object (``object_id``: ``resp_...``, ``msg_...``, with its ``thread_id``)."""

    thread_id: uuid.UUID
    run_id: uuid.UUID | None = None
    object_id: str | None = None


def key_id(tenant: str, key: str) -> uuid.UUID:
    """The key's own uuid: the same for the same tenant and key, another tenant's differs."""
    return uuid.uuid5(KEY_NAMESPACE, f"{tenant}\x01{key}")


def hold(conn: psycopg.Connection[Any], tenant: str, key: str) -> None:
    """Wait until no other transaction of this tenant holds ``key`` (until it commits)."""
    conn.execute(Q.hold_idempotency_key, {"tenant_id": tenant, "key": key})


def earlier(conn: psycopg.Connection[Any], tenant: str, key: str, wanted: str) -> Earlier | None:
    """What an earlier request with ``key`` made, None when there is none; 409 naming the
    key when that request was another one. Holds the key first (``hold``) for the rest of
    the caller's transaction."""
    hold(conn, tenant, key)
    run = fetch_one(conn, Q.run_by_idempotency_key, {"tenant_id": tenant, "key": key})
    if run is not None:
        _same(key, run["digest"], wanted)
        return Earlier(thread_id=run["thread_id"], run_id=run["id"])
    made = fetch_one(
        conn, Q.request_by_idempotency_key, {"tenant_id": tenant, "key_id": key_id(tenant, key)}
    )
    if made is not None:
        _same(key, made["digest"], wanted)
        return Earlier(thread_id=made["thread_id"], object_id=made["object_id"])
    return None


def _same(key: str, digest: str | None, wanted: str) -> None:
    if digest is not None and digest != wanted:
        raise reused(key)


def reused(key: str) -> APIError:
    """The 409 of a key sent with another request than the one it was first sent with."""
    return APIError(
        409,
        f"Idempotency-Key '{key}' was already used with a different request: a resend "
        "must repeat the first request exactly (every field of its body) to get its "
        "result; use a new key for a new request.",
        code="idempotency_key_reused",
    )


def keep(
    conn: psycopg.Connection[Any],
    tenant: str,
    key: str,
    digest: str,
    thread_id: uuid.UUID,
    object_id: str,
) -> None:
    """Keep what a request that started no run of its own made (``object_id``), with its
    digest, in the caller's transaction."""
    journal(
        conn,
        KEYED,
        tenant,
        thread_id=thread_id,
        run_id=key_id(tenant, key),
        detail={"idempotency_key": key, "digest": digest, "object_id": object_id},
    )


def remember(conn: psycopg.Connection[Any], tenant: str, run: Row, key: str, digest: str) -> None:
    """Keep the digest of the request that made ``run`` (in the caller's transaction)."""
    journal(
        conn,
        EVENT,
        tenant,
        thread_id=run["thread_id"],
        run_id=run["id"],
        detail={"idempotency_key": key, "digest": digest},
    )
