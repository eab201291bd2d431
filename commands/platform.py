"""``outbox platform``: what holds for every run of every tenant: the step ceiling, and the
defaults a new run gets when its caller names none.

Both are stored in the database, so start_run_v1 and the Python API read the same values;
the ceiling holds runs already in flight too, the defaults only runs started after.
"""

from __future__ import annotations

from typing import Any

import click

from outbox import budgets
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    format_fields,
    json_option,
)
from outbox.commands.limits import LimitValue, merged_limit


@click.group("platform", cls=OutboxGroup)
def platform_group() -> None:
    """Limits over every run of every tenant."""


@platform_group.command("limit")
@click.option(
    "--max-steps",
    type=LimitValue(int),
    help="Most model turns of any run, whatever it asked for ('none': no ceiling).",
)
@actor_option
@json_option
def platform_limit(max_steps: Any, actor: str, as_json: bool) -> None:
    """Show or set the platform's step ceiling. Runs in flight are held to it too: one past
    it fails with `step_cap` before its next model turn."""
    with connection() as conn:
        row = budgets.platform_limits(conn)
        if max_steps is not None:
            row = budgets.set_platform_limits(
                conn, max_steps=merged_limit(None, max_steps), actor=actor
            )
    if as_json:
        echo_json(row)
        return
    click.echo(f"platform: max_steps {row['max_steps'] or 'none'}")


@platform_group.command("defaults")
@click.option("--max-steps", type=int, help="Model turns a new run may take.")
@click.option("--loop-limit", type=int, help="Identical turns in a row that end a run as a loop.")
@click.option(
    "--action-timeout",
    type=float,
    help="Seconds a new run waits in requires_action for client outputs before it expires.",
)
@actor_option
@json_option
def platform_defaults(
    max_steps: int | None,
    loop_limit: int | None,
    action_timeout: float | None,
    actor: str,
    as_json: bool,
) -> None:
    """Show or set what a new run gets when its caller names no step cap, loop limit or
    action timeout: the same for start_run_v1 and the Python API (runs already started
    keep theirs). `outbox db upgrade` sets them from OUTBOX_DEFAULT_MAX_STEPS,
    OUTBOX_LOOP_LIMIT and OUTBOX_ACTION_TIMEOUT_S when those are set."""
    with connection() as conn:
        if max_steps is None and loop_limit is None and action_timeout is None:
            row = budgets.run_defaults(conn)
        else:
            row = budgets.set_run_defaults(
                conn,
                max_steps=max_steps,
                loop_limit=loop_limit,
                action_timeout_s=action_timeout,
                actor=actor,
            )
    if as_json:
        echo_json(row)
        return
    click.echo(
        "defaults of new runs: "
        + format_fields({k: row[k] for k in ("max_steps", "loop_limit", "action_timeout_s")})
    )
