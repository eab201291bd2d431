"""An ``Idempotency-Key`` covers the whole request, not just the thread it names.

The key of a run is unique per tenant in the database (``runs.idempotency_key``, DESIGN
invariant 2), which settles races; what the key was *sent with* is kept beside the run it
made: a digest of the whole normalised request (the endpoint, the ids of its path and every
field of its body, defaults filled in, ``stream`` apart since it changes how the answer is
sent, not what runs), journaled as ``run.requested`` in the transaction that creates the
run. A resend with the same key and the same digest gets the first request's run; any
difference is a 409 naming the key. Design choice: the journal rather than a new column,
so no migration; a run made before this (no ``run.requested`` event) answers a resend as
before, by the key alone.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import psycopg
from pydantic import BaseModel

from outbox.store import Row, fetch_one, journal
from server.errors import APIError
from server.store import Q

EVENT = "run.requested"
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


def earlier(conn: psycopg.Connection[Any], tenant: str, key: str, wanted: str) -> Row | None:
    """The run an earlier request with ``key`` made (``id``, ``thread_id``), None when
    there is none; 409 naming the key when that request was another one."""
    row = fetch_one(conn, Q.run_by_idempotency_key, {"tenant_id": tenant, "key": key})
    if row is None:
        return None
    if row["digest"] is not None and row["digest"] != wanted:
        raise APIError(
            409,
            f"Idempotency-Key '{key}' was already used with a different request: a resend "
            "must repeat the first request exactly (every field of its body) to get its "
            "result; use a new key for a new request.",
            code="idempotency_key_reused",
        )
    return row


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
