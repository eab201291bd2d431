"""``outbox models``: the model catalogue (window, output limit, prices) and prompt budgets.

One command group for what the platform knows of a model: its context window and most
output tokens (``outbox.context``: a run's prompt budget is the window minus the output
unless the run, its tenant or the platform names one) and, when given, its prices
(``outbox.budgets``, the same rows ``outbox prices`` sets).
"""

from __future__ import annotations

import click

from outbox import budgets, context
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("models", cls=OutboxGroup)
def models_group() -> None:
    """The model catalogue: context windows, output limits, prices; prompt budgets."""


@models_group.command("list")
@json_option
def models_list(as_json: bool) -> None:
    """Every model in the catalogue, with its prices when it has them."""
    with connection() as conn:
        rows = context.models(conn)
    columns = ["model", "context_window", "max_output_tokens", "input_per_mtok"]
    emit(rows, as_json, [*columns, "output_per_mtok", "updated_by"])


@models_group.command("set")
@click.argument("model")
@click.option("--context-window", type=int, required=True, help="Tokens the model takes.")
@click.option("--max-output", type=int, required=True, help="Most tokens it answers.")
@click.option("--input", "input_", help="Price of a million input tokens (with --output).")
@click.option("--output", help="Price of a million output tokens (with --input).")
@click.option("--cached-input", help="Price of a million cached input tokens.")
@actor_option
@json_option
def models_set(
    model: str,
    context_window: int,
    max_output: int,
    input_: str | None,
    output: str | None,
    cached_input: str | None,
    actor: str,
    as_json: bool,
) -> None:
    """Put MODEL in the catalogue (and price it when --input and --output are given)."""
    if (input_ is None) != (output is None):
        raise click.UsageError("--input and --output go together")
    with connection() as conn:
        row = context.set_model(
            conn, model, context_window=context_window, max_output=max_output, actor=actor
        )
        if input_ is not None and output is not None:
            budgets.set_price(
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
    click.echo(f"{model}: window {context_window} tokens, output up to {max_output}")


@models_group.command("remove")
@click.argument("model")
@actor_option
@json_option
def models_remove(model: str, actor: str, as_json: bool) -> None:
    """Take MODEL out of the catalogue (its runs get the default window)."""
    with connection() as conn:
        context.remove_model(conn, model, actor=actor)
    if as_json:
        echo_json({"model": model, "removed": True})
        return
    click.echo(f"removed {model} from the catalogue")


@models_group.command("budget")
@click.option("--tenant", help="The tenant's budget (default: the platform's).")
@click.option(
    "--max-prompt-tokens",
    required=True,
    help="Tokens a request of a run that names none may hold, or 'none'.",
)
@actor_option
@json_option
def models_budget(tenant: str | None, max_prompt_tokens: str, actor: str, as_json: bool) -> None:
    """The prompt budget of runs that name none: a tenant's, or the platform's."""
    if max_prompt_tokens != "none" and not max_prompt_tokens.isdigit():
        raise click.BadParameter("a number of tokens, or 'none'", param_hint="--max-prompt-tokens")
    tokens = None if max_prompt_tokens == "none" else int(max_prompt_tokens)
    with connection() as conn:
        context.set_prompt_budget(conn, tokens, tenant_id=tenant, actor=actor)
    if as_json:
        echo_json({"tenant_id": tenant or "*", "max_prompt_tokens": tokens})
        return
    click.echo(f"prompt budget of {tenant or 'the platform'}: {max_prompt_tokens}")
