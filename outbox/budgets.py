"""Budgets in money and the platform's limits: what the writer counts each turn against.

A run has budgets in tokens (``max_tokens``) and in money (``max_cost``); a tenant has the
same over all its runs (``outbox tenants budget``). Money is counted by the price of the
run's model (``outbox.model_prices``, per million input, cached input and output tokens, in
the one currency the platform bills in): each recorded turn stores its ``cost``, adds it to
its run and to its tenant's budget, and the next model turn of a run that spent its budget
(or whose tenant did) is not started: the run fails with ``budget``. A model without a
price costs nothing, so a budget in money on a run needs its model's price
(``start_run_v1`` refuses it otherwise). ``platform_limits.max_steps`` caps every run's
model turns, whatever the run asked for (``step_cap``).

Like the other operator settings, these run in the caller's transaction and are journaled.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg

from outbox import writer
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries

Q = queries("budgets.sql")
Row = dict[str, Any]
PLATFORM = "*"  # the journal's tenant for platform-wide settings


def money(value: Any, what: str) -> Decimal:
    """A non-negative amount of money, exactly (never a float)."""
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise InvalidInput(f"{what} must be a number, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise InvalidInput(f"{what} must be a finite number at least 0, got {value!r}")
    return amount


def prices(conn: psycopg.Connection[Any]) -> list[Row]:
    return writer.fetch_all(conn, Q.prices, {})


def set_price(
    conn: psycopg.Connection[Any],
    model: str,
    *,
    input_per_mtok: Any,
    output_per_mtok: Any,
    cached_input_per_mtok: Any = None,
    actor: str | None = None,
) -> Row:
    """Price ``model``'s tokens per million: input, output and (None: as input) cached
    input. Turns recorded from now on count at this price."""
    if not model or len(model) > 200:
        raise InvalidInput("a model name is 1-200 characters")
    params = {
        "model": model,
        "input": money(input_per_mtok, "--input"),
        "output": money(output_per_mtok, "--output"),
        "cached_input": None
        if cached_input_per_mtok is None
        else money(cached_input_per_mtok, "--cached-input"),
        "actor": actor or "unknown",
    }
    row = writer.fetch_one(conn, Q.set_price, params)
    assert row is not None
    detail = {k: None if v is None else str(v) for k, v in params.items() if k != "actor"}
    writer.journal(conn, "price.set", PLATFORM, actor=actor, detail=detail)
    return row


def remove_price(conn: psycopg.Connection[Any], model: str, *, actor: str | None = None) -> None:
    if writer.fetch_one(conn, Q.remove_price, {"model": model}) is None:
        raise NotFound(f"model {model!r} has no price", hint="`outbox prices list`")
    writer.journal(conn, "price.removed", PLATFORM, actor=actor, detail={"model": model})


def platform_limits(conn: psycopg.Connection[Any]) -> Row:
    return writer.fetch_one(conn, Q.platform_limits, {}) or {"max_steps": None}


def set_platform_limits(
    conn: psycopg.Connection[Any], *, max_steps: int | None, actor: str | None = None
) -> Row:
    """Cap every run's model turns at ``max_steps`` (None: no ceiling), runs in flight too:
    a run past it fails with ``step_cap`` before its next model turn."""
    if max_steps is not None and (not math.isfinite(max_steps) or max_steps < 1):
        raise InvalidInput(f"--max-steps must be at least 1, got {max_steps}")
    row = writer.fetch_one(
        conn, Q.set_platform_limits, {"max_steps": max_steps, "actor": actor or "unknown"}
    )
    assert row is not None
    writer.journal(
        conn, "platform.limits_set", PLATFORM, actor=actor, detail={"max_steps": max_steps}
    )
    return row
