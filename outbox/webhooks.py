"""Signed webhooks per tenant: a run's events POSTed to the tenant's endpoints, through the
outbox (docs/webhooks.md).

An endpoint (``add_endpoint``) names a URL and the events it wants (``run.completed``,
``run.requires_action``, ...; all run events when none are named). In the transaction that
changes a run's status, a trigger records one delivery per endpoint that
wants the event (``webhook_deliveries``, unique per event) and enqueues an outbox row of
kind ``webhook``; the relay POSTs it, signed as Standard Webhooks sign (``webhook-id``,
``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256>``), retried with
backoff like any row, and records when it was delivered. Delivery is at least once: a
relay killed after the receiver answered sends it again, with the same ``webhook-id``, so
receivers skip an id they have seen (``verify`` checks a delivery's signature and age).

The signing secret is shown once and kept encrypted with the relay's key
(``$OUTBOX_CREDENTIALS_KEY``, as credentials stored in the database). Like the writer, the
functions here run on the caller's connection and never commit.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from outbox import constants, credentials
from outbox.calls import check_tenant
from outbox.errors import InvalidInput, NotFound
from outbox.schemas import url_problem
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal

Q = queries("webhooks.sql")
SECRET_PREFIX = "whsec_"
EVENTS: tuple[str, ...] = tuple(f"run.{status}" for status in (*constants.ACTIVE, *constants.ENDED))
TOLERANCE_S = 300  # how old (or how far ahead) a delivery's timestamp may be when verified


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def add_endpoint(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    url: str,
    events: list[str] | None = None,
    *,
    actor: str = "",
) -> tuple[Row, str]:
    """A new endpoint of ``tenant_id``: its row and its signing secret (shown this once)."""
    check_tenant(tenant_id)
    if tenant_id == "*":
        raise InvalidInput("'*' is not a tenant", hint="name the tenant whose runs are sent")
    if problem := url_problem(url):
        raise InvalidInput(problem, hint="give the receiver's http(s) URL")
    wanted = sorted(set(events or []))
    unknown = [e for e in wanted if e not in EVENTS]
    if unknown:
        raise InvalidInput(
            f"unknown events {unknown}", hint=f"choose among {', '.join(EVENTS)} (none: all)"
        )
    secret = new_secret()
    row = fetch_one(
        conn,
        Q.insert_endpoint,
        {"tenant_id": tenant_id, "url": url, "events": wanted, "ciphertext": _encrypt(secret)},
    )
    assert row is not None
    journal(
        conn,
        "webhook.added",
        tenant_id,
        actor=actor or None,
        detail={"endpoint_id": str(row["id"]), "url": url, "events": wanted},
    )
    return row, secret


def list_endpoints(conn: psycopg.Connection[Any], tenant_id: str | None = None) -> list[Row]:
    """Endpoints (of one tenant when given), newest first, with their delivery counts;
    never their secrets."""
    return fetch_all(conn, Q.list_endpoints, {"tenant_id": tenant_id})


def remove_endpoint(
    conn: psycopg.Connection[Any], endpoint_id: uuid.UUID, *, actor: str = ""
) -> Row:
    """Stop sending to an endpoint: no new deliveries, and queued ones are dropped when
    the relay reaches them (journaled ``webhook.dropped``). Removing twice keeps the first
    time."""
    row = fetch_one(conn, Q.remove_endpoint, {"id": endpoint_id})
    if row is None:
        raise NotFound(
            f"webhook endpoint {endpoint_id} does not exist", hint="`outbox webhooks list`"
        )
    journal(
        conn,
        "webhook.removed",
        row["tenant_id"],
        actor=actor or None,
        detail={"endpoint_id": str(endpoint_id)},
    )
    return row


def rotate_secret(
    conn: psycopg.Connection[Any], endpoint_id: uuid.UUID, *, actor: str = ""
) -> tuple[Row, str]:
    """A new signing secret for an endpoint (shown this once); deliveries from now on,
    retries of older events included, are signed with it."""
    secret = new_secret()
    row = fetch_one(conn, Q.rotate_secret, {"id": endpoint_id, "ciphertext": _encrypt(secret)})
    if row is None:
        raise NotFound(
            f"webhook endpoint {endpoint_id} does not exist or was removed",
            hint="`outbox webhooks list`",
        )
    journal(
        conn,
        "webhook.rotated",
        row["tenant_id"],
        actor=actor or None,
        detail={"endpoint_id": str(endpoint_id)},
    )
    return row, secret


def _encrypt(secret: str) -> str:
    """The secret encrypted with the relay's key; refused when there is no key here."""
    try:
        return credentials.encrypt(secret)
    except credentials.CredentialUnavailable as err:
        raise InvalidInput(
            str(err),
            hint="signing secrets are kept encrypted with the relay's key: set "
            f"${credentials.KEY_ENV} here as for the relay",
        ) from None


# -- signing (the relay) and verifying (a receiver) -------------------------------------


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of a delivery: ``v1,`` and the base64 HMAC-SHA256,
    keyed with the secret's bytes, of ``{msg_id}.{timestamp}.{body}``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None) -> str:
    """Check a delivery as a receiver gets it (header names in lower case); returns its
    ``webhook-id`` (skip an id you have handled: a delivery may come more than once).
    ``ValueError`` when a header is missing, the timestamp is more than ``TOLERANCE_S``
    away, or no signature matches."""
    try:
        msg_id, stamp, given = (
            headers["webhook-id"],
            headers["webhook-timestamp"],
            headers["webhook-signature"],
        )
    except KeyError as missing:
        raise ValueError(f"not a webhook delivery: no {missing.args[0]} header") from None
    if not stamp.isdigit() or abs((now or time.time()) - int(stamp)) > TOLERANCE_S:
        raise ValueError(f"webhook-timestamp {stamp!r} is not within {TOLERANCE_S}s of now")
    expected = sign(secret, msg_id, int(stamp), body)
    if not any(hmac.compare_digest(expected, sig) for sig in given.split()):
        raise ValueError("no webhook-signature matches the secret")
    return msg_id
