"""The limits of a lane (a tool, a tenant): the option type that sets them, how they are
shown, and ``outbox limits``, what each lane has in flight.

``tools limit``, ``tenants limit`` and ``platform limit`` share the option type: a number,
or ``none`` to remove the limit, with a left-out option keeping the value it had.
"""

from __future__ import annotations

from typing import Any

import click

from outbox import limits
from outbox.commands.common import connection, echo_json, json_option
from outbox.errors import InvalidInput


class LimitValue(click.ParamType[Any]):
    """A positive number, or 'none' to remove that limit."""

    name = "N|none"

    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = limits.parse_limit(value, self.kind)
        except InvalidInput as err:
            self.fail(err.args[0], param, ctx)
        return "none" if number is None else number


def merged_limit(current: Any, given: Any) -> Any:
    """A limit option's effect: not given keeps ``current``, 'none' removes it."""
    if given is None:
        return current
    return None if given == "none" else given


def show_lane(scope: str, name: str, lane: dict[str, Any] | None, as_json: bool) -> None:
    if as_json:
        echo_json(lane or {"scope": scope, "name": name, "max_concurrency": None, "rate": None})
        return
    if lane is None:
        click.echo(f"{scope} {name}: no limits")
        return
    parts = [f"max_concurrency {lane['max_concurrency'] or 'none'}"]
    if scope == "tool":
        parts.append(f"rate {lane['rate'] or 'none'}/s")
    click.echo(f"{scope} {name}: " + ", ".join(parts))


@click.command("limits")
@json_option
def limits_command(as_json: bool) -> None:
    """Every tool and tenant with limits, and what each has in flight now."""
    with connection() as conn:
        rows = limits.in_flight(conn)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no limits: set them with `outbox tools limit` or `outbox tenants limit`")
        return
    for row in rows:
        rate = f", rate {row['rate']}/s" if row["rate"] is not None else ""
        click.echo(
            f"{row['scope']:<6} {row['name']:<24} in flight {row['in_flight']}"
            f" of {row['max_concurrency'] or 'unlimited'}{rate}"
        )
