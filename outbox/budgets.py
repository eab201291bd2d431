"""Budgets, prices and the platform's limits: what the writer counts each turn against.

A run has budgets in tokens (``max_tokens``) and in money (``max_cost``); a tenant has the
same over all its runs (``outbox tenants budget``). Money is counted by the price of the
run's model (``outbox.model_prices``, per million input, cached input and output tokens, in
the one currency the platform bills in): each recorded turn stores its ``cost``, adds it to
its run and to its tenant's budget, and the next model turn of a run that spent its budget
(or whose tenant did) is not started: the run fails with ``budget``. A model without a
price costs nothing, so a budget in money on a run needs its model's price
(``start_run_v1`` refuses it otherwise). ``platform_limits.max_steps`` caps every run's
model turns, whatever the run asked for (``step_cap``). ``limit_reached`` is the one check
of all these, made by the writer in the transaction that would enqueue the run's next turn
(docs/guarantees.md, invariant 11).

What a new run gets when its caller names no step cap, loop limit or action timeout is one
row of the database (``run_defaults``), which ``start_run_v1`` reads for SQL callers and the
Python writer API alike: one source, so the same settings make the same run whichever way
it is started. ``outbox platform defaults`` sets it; ``outbox db upgrade`` stores there the
deployment's ``OUTBOX_DEFAULT_MAX_STEPS``, ``OUTBOX_LOOP_LIMIT`` and
``OUTBOX_ACTION_TIMEOUT_S`` when set (``apply_environment``).

Like the other operator settings, these run in the caller's transaction and are journaled.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg

from outbox import calls, config
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal, pg

Q = queries("budgets.sql")
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


def tokens(value: Any, what: str) -> int:
    """A whole number of tokens, as an operator typed it (the console's budget form)."""
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number of tokens, got {value!r}") from None


def money_text(amount: Decimal) -> str:
    """Money spent, as its prices give it: a turn's cost is a quotient that PostgreSQL keeps
    with twenty decimals (0.60000000000000000000), shown without the zeros it added. A
    budget keeps the scale its operator set it with, so it is shown as stored."""
    return f"{amount.normalize():f}"


def prices(conn: psycopg.Connection[Any]) -> list[Row]:
    return fetch_all(conn, Q.prices, {})


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
    row = fetch_one(conn, Q.set_price, params)
    assert row is not None
    detail = {k: None if v is None else str(v) for k, v in params.items() if k != "actor"}
    journal(conn, "price.set", PLATFORM, actor=actor, detail=detail)
    return row


def remove_price(conn: psycopg.Connection[Any], model: str, *, actor: str | None = None) -> None:
    if fetch_one(conn, Q.remove_price, {"model": model}) is None:
        raise NotFound(f"model {model!r} has no price", hint="`outbox prices list`")
    journal(conn, "price.removed", PLATFORM, actor=actor, detail={"model": model})


def set_tenant_budget(
    db: Any,
    tenant_id: str,
    max_tokens: int | None,
    max_cost: Decimal | None = None,
    *,
    actor: str | None = None,
) -> Row:
    """Set a tenant's budget over all its runs, in tokens and/or in money (by
    ``model_prices``); what was used already stays counted. None: no limit of that kind.
    Journaled (``tenant.budget_set``) with ``actor``."""
    conn = pg(db)
    calls.check_tenant(tenant_id)
    if max_tokens is None and max_cost is None:
        raise InvalidInput("a budget needs a limit: --max-tokens, --max-cost or both")
    if max_tokens is not None and max_tokens <= 0:
        raise InvalidInput(f"a token budget must be positive, got {max_tokens}")
    if max_cost is not None and not max_cost > 0:
        raise InvalidInput(f"a budget in money must be positive, got {max_cost}")
    row = fetch_one(
        conn,
        Q.set_tenant_budget,
        {"tenant_id": tenant_id, "max_tokens": max_tokens, "max_cost": max_cost},
    )
    assert row is not None
    detail = {"max_tokens": max_tokens, "max_cost": None if max_cost is None else str(max_cost)}
    journal(conn, "tenant.budget_set", tenant_id, actor=actor, detail=detail)
    return row


def tenant_budget_spent(conn: psycopg.Connection[Any], tenant_id: str) -> str | None:
    """Why the tenant may start no more model turns, or None while its budget lasts."""
    return tenant_budgets_spent(conn, [tenant_id]).get(tenant_id)


def tenant_budgets_spent(conn: psycopg.Connection[Any], tenant_ids: list[str]) -> dict[str, str]:
    """For each of ``tenant_ids`` whose budget is spent: why it may start no more turns."""
    spent: dict[str, str] = {}
    for b in fetch_all(conn, Q.tenant_budgets, {"tenant_ids": tenant_ids}):
        tenant = b["tenant_id"]
        if b["max_tokens"] is not None and b["tokens_used"] >= b["max_tokens"]:
            spent[tenant] = (
                f"tenant {tenant!r} used {b['tokens_used']} tokens, its budget is {b['max_tokens']}"
            )
        elif b["max_cost"] is not None and b["cost_used"] >= b["max_cost"]:
            spent[tenant] = (
                f"tenant {tenant!r} spent {money_text(b['cost_used'])}, "
                f"its budget is {b['max_cost']:f}"
            )
    return spent


def limit_reached(
    run: Row, next_step: int, tenant_spent: str | None = None, ceiling: int | None = None
) -> tuple[str, str] | None:
    """The reason a run may not take ``next_step``: (``step_cap`` | ``budget``, message).
    ``tenant_spent`` is ``tenant_budgets_spent``'s word on the run's tenant, ``ceiling``
    the platform's step ceiling."""
    if next_step > run["max_steps"]:
        return "step_cap", f"the run reached its step cap of {run['max_steps']} model turns"
    if ceiling is not None and next_step > ceiling:
        return "step_cap", f"the run reached the platform's step ceiling of {ceiling} model turns"
    if run["max_tokens"] is not None and run["tokens_used"] >= run["max_tokens"]:
        return (
            "budget",
            f"the run used {run['tokens_used']} tokens, its budget is {run['max_tokens']}",
        )
    if run.get("max_cost") is not None and run["cost"] >= run["max_cost"]:
        return (
            "budget",
            f"the run spent {money_text(run['cost'])}, its budget is {run['max_cost']:f}",
        )
    if tenant_spent is not None:
        return "budget", tenant_spent
    return None


def platform_limits(conn: psycopg.Connection[Any]) -> Row:
    return fetch_one(conn, Q.platform_limits, {}) or {"max_steps": None}


def set_platform_limits(
    conn: psycopg.Connection[Any], *, max_steps: int | None, actor: str | None = None
) -> Row:
    """Cap every run's model turns at ``max_steps`` (None: no ceiling), runs in flight too:
    a run past it fails with ``step_cap`` before its next model turn."""
    if max_steps is not None and (not math.isfinite(max_steps) or max_steps < 1):
        raise InvalidInput(f"--max-steps must be at least 1, got {max_steps}")
    row = fetch_one(
        conn, Q.set_platform_limits, {"max_steps": max_steps, "actor": actor or "unknown"}
    )
    assert row is not None
    journal(conn, "platform.limits_set", PLATFORM, actor=actor, detail={"max_steps": max_steps})
    return row


def platform_max_steps(conn: psycopg.Connection[Any]) -> int | None:
    """The platform's step ceiling over every run (``outbox platform limit``), if any."""
    row = fetch_one(conn, Q.platform_max_steps, {})
    return None if row is None else row["max_steps"]


def run_defaults(conn: psycopg.Connection[Any]) -> Row:
    """The defaults of new runs: ``max_steps``, ``loop_limit``, ``action_timeout_s``."""
    row = fetch_one(conn, Q.run_defaults, {})
    if row is None:
        raise NotFound(
            "the defaults of new runs are missing (outbox.run_defaults has no row)",
            hint="set them again: `outbox platform defaults --max-steps N`",
        )
    return row


def set_run_defaults(
    conn: psycopg.Connection[Any],
    *,
    max_steps: int | None = None,
    loop_limit: int | None = None,
    action_timeout_s: float | None = None,
    actor: str | None = None,
) -> Row:
    """Change the defaults given (None: unchanged) of runs started from now on, by SQL or
    the writer API; runs already started keep theirs."""
    if max_steps is not None and not 1 <= max_steps <= 10_000:
        raise InvalidInput(f"--max-steps must be 1-10000, got {max_steps}")
    if loop_limit is not None and loop_limit < 2:
        raise InvalidInput(f"--loop-limit must be at least 2, got {loop_limit}")
    if action_timeout_s is not None and not (
        math.isfinite(action_timeout_s) and action_timeout_s > 0
    ):
        raise InvalidInput(f"--action-timeout must be a positive number, got {action_timeout_s}")
    given = {"max_steps": max_steps, "loop_limit": loop_limit, "action_timeout_s": action_timeout_s}
    conn.execute(Q.ensure_run_defaults)
    row = fetch_one(conn, Q.set_run_defaults, {**given, "actor": actor or "unknown"})
    assert row is not None
    detail = {k: v for k, v in given.items() if v is not None}
    journal(conn, "platform.run_defaults_set", PLATFORM, actor=actor, detail=detail)
    return row


def apply_environment(conn: psycopg.Connection[Any], *, actor: str | None = None) -> Row:
    """Store the defaults of new runs this process's environment sets
    (``config.RUN_DEFAULT_VARIABLES``: ``OUTBOX_DEFAULT_MAX_STEPS``, ``OUTBOX_LOOP_LIMIT``,
    ``OUTBOX_ACTION_TIMEOUT_S``) where they differ from the database's; returns the ones
    changed. ``outbox db upgrade`` calls it, so a deployment that set them keeps them."""
    wanted: Row = {}
    for field, text in config.run_defaults_from_environment().items():
        name = config.RUN_DEFAULT_VARIABLES[field]
        try:
            wanted[field] = float(text) if field == "action_timeout_s" else int(text)
        except ValueError:
            kind = "a number of seconds" if field == "action_timeout_s" else "a whole number"
            raise InvalidInput(f"{name} must be {kind}, got {text!r}") from None
    current = fetch_one(conn, Q.run_defaults, {}) or {}
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    if changed:
        set_run_defaults(conn, **changed, actor=actor)
    return changed
