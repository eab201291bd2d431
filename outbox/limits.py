"""Limits per tool and per tenant, enforced by every relay's claim, across processes.

A *lane* is a tool (the calls of it, for every tenant) or a tenant (all its work).
``max_concurrency`` caps what the lane has in flight: rows leased by any relay, counted
in PostgreSQL when a claim runs, so two relays on two machines never exceed it together.
``rate`` (tools only) caps the calls started per second, with a token bucket of burst
``max(1, rate)``. A lane without a row in ``outbox.lanes`` has no limit. The claim
(``relay/queries/relay.sql``) reads and updates these rows; docs/relay.md ("Limits and fair
claims") says how and what it costs.

Like the operator actions, these run in the caller's transaction, never commit, and are
journaled (``lane.limited`` / ``lane.unlimited``, with the actor).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import psycopg

from outbox import calls
from outbox.errors import InvalidInput
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal

Q = queries("limits.sql")
Row = dict[str, Any]
Scope = Literal["tool", "tenant"]
ALL_TENANTS = "*"  # the journal's tenant for a tool's lane, which is every tenant's


def parse_limit(text: Any, kind: type[int] | type[float]) -> int | float | None:
    """A limit as an operator writes it (``outbox tools limit``, the console's forms): a
    number over 0, or 'none' for no limit (None). ``InvalidInput`` says what is allowed."""
    if str(text).strip().lower() == "none":
        return None
    try:
        number = kind(text)
    except (TypeError, ValueError):
        allowed = "a whole number" if kind is int else "a number"
        raise InvalidInput(f"{text!r} is neither {allowed} nor 'none'") from None
    if not number > 0:  # also refuses NaN
        raise InvalidInput(f"{text!r} must be over 0 (or 'none' to remove the limit)")
    return number


def get(conn: psycopg.Connection[Any], scope: Scope, name: str) -> Row | None:
    """The lane's limits, or None when it has none."""
    return fetch_one(conn, Q.get, {"scope": scope, "name": name})


def set_limits(
    conn: psycopg.Connection[Any],
    scope: Scope,
    name: str,
    *,
    max_concurrency: int | None = None,
    rate: float | None = None,
    actor: str | None = None,
) -> Row | None:
    """Set a lane's limits; both None removes them. Returns the lane (None if removed)."""
    if scope == "tenant":
        calls.check_tenant(name)
    elif not name:
        raise InvalidInput("a tool lane needs the tool's name")
    if max_concurrency is not None and max_concurrency < 1:
        raise InvalidInput(
            f"--max-concurrency must be at least 1, got {max_concurrency}",
            hint="use 'none' to remove the limit",
        )
    if rate is not None and (not math.isfinite(rate) or rate <= 0):
        raise InvalidInput(
            f"--rate must be a positive number of calls per second, got {rate}",
            hint="use 'none' to remove the limit",
        )
    if rate is not None and scope != "tool":
        raise InvalidInput("a rate limit is per tool; a tenant has --max-concurrency only")
    tenant = name if scope == "tenant" else ALL_TENANTS
    if max_concurrency is None and rate is None:
        removed = fetch_one(conn, Q.clear, {"scope": scope, "name": name})
        if removed:
            journal(conn, "lane.unlimited", tenant, actor=actor, detail={"lane": f"{scope}:{name}"})
        return None
    row = fetch_one(
        conn,
        Q.set,
        {"scope": scope, "name": name, "max_concurrency": max_concurrency, "rate": rate},
    )
    assert row is not None
    journal(
        conn,
        "lane.limited",
        tenant,
        actor=actor,
        detail={"lane": f"{scope}:{name}", "max_concurrency": max_concurrency, "rate": rate},
    )
    return row


def in_flight(conn: psycopg.Connection[Any]) -> list[Row]:
    """Every lane with limits and what it has in flight now."""
    return fetch_all(conn, Q.in_flight, {})
