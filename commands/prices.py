"""``outbox prices``: what a million tokens of each model cost, which budgets in money count.

Prices are in the one currency the platform bills in; a new price counts for the turns
recorded from then on, never for turns already charged.
"""

from __future__ import annotations

import click

from outbox import budgets
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("prices", cls=OutboxGroup)
def prices_group() -> None:
    """Model prices per million tokens: what budgets in money count."""


@prices_group.command("list")
@json_option
def prices_list(as_json: bool) -> None:
    """Every model with a price."""
    with connection() as conn:
        rows = budgets.prices(conn)
    emit(
        rows,
        as_json,
        ["model", "input_per_mtok", "cached_input_per_mtok", "output_per_mtok", "updated_by"],
    )


@prices_group.command("set")
@click.argument("model")
@click.option("--input", "input_", required=True, help="Price of a million input tokens.")
@click.option("--output", required=True, help="Price of a million output tokens.")
@click.option("--cached-input", help="Price of a million cached input tokens (default: --input).")
@actor_option
@json_option
def prices_set(
    model: str, input_: str, output: str, cached_input: str | None, actor: str, as_json: bool
) -> None:
    """Price MODEL's tokens, in the one currency the platform bills in. Turns recorded from
    now on are counted at this price against run and tenant budgets in money."""
    with connection() as conn:
        row = budgets.set_price(
            conn,
            model,
            input_per_mtok=input_,
            output_per_mtok=output,
            cached_input_per_mtok=cached_input,
            actor=actor,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(f"priced {model}: input {input_}, output {output} per million tokens")
