"""``outbox models``: what the platform knows of a model and where its turns go.

- the catalogue: a model's context window and most output tokens (``outbox.context``: a
  run's prompt budget is the window minus the output unless the run, its tenant or the
  platform names one) and, when given, its prices (``outbox.budgets``, the same rows
  ``outbox prices`` sets); prompt budgets of a tenant or the platform;
- where a model's turns go when it fails, the circuit of each base URL, and the routing
  rules that pick a step's model (``outbox.routing``, docs/models.md). Fallbacks and
  circuits are the platform's (every tenant's runs of that model or base URL); routing
  rules are a tenant's, versioned: a run keeps the version it started with.
"""

from __future__ import annotations

import json

import click

from outbox import budgets, context, routing
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
    """Models: the catalogue (windows, output limits, prices), prompt budgets, fallbacks,
    circuits per base URL and routing rules."""


@models_group.command("list")
@json_option
def models_list(as_json: bool) -> None:
    """Every model in the catalogue, with its prices when it has them."""
    with connection() as conn:
        rows = context.models(conn)
    columns = ["model", "context_window", "max_output_tokens", "prompt_cache_key", "input_per_mtok"]
    emit(rows, as_json, [*columns, "output_per_mtok", "updated_by"])


@models_group.command("set")
@click.argument("model")
@click.option("--context-window", type=int, required=True, help="Tokens the model takes.")
@click.option("--max-output", type=int, required=True, help="Most tokens it answers.")
@click.option("--input", "input_", help="Price of a million input tokens (with --output).")
@click.option("--output", help="Price of a million output tokens (with --input).")
@click.option("--cached-input", help="Price of a million cached input tokens.")
@click.option(
    "--prompt-cache-key",
    type=click.Choice(context.CACHE_KEY_SWITCHES),
    default="derived",
    show_default=True,
    help="Which prompt_cache_key MODEL's requests carry: the caller's, else one derived from "
    "the thread (derived); only a caller's (caller); none, not even a caller's (never), for a "
    "server that refuses the field.",
)
@click.option(
    "--no-prompt-cache-key",
    is_flag=True,
    help="The same as --prompt-cache-key caller: no derived key.",
)
@actor_option
@json_option
def models_set(
    model: str,
    context_window: int,
    max_output: int,
    input_: str | None,
    output: str | None,
    cached_input: str | None,
    prompt_cache_key: str,
    no_prompt_cache_key: bool,
    actor: str,
    as_json: bool,
) -> None:
    """Put MODEL in the catalogue (and price it when --input and --output are given)."""
    if (input_ is None) != (output is None):
        raise click.UsageError("--input and --output go together")
    if no_prompt_cache_key and prompt_cache_key != "derived":
        raise click.UsageError("--no-prompt-cache-key is --prompt-cache-key caller: give one")
    with connection() as conn:
        row = context.set_model(
            conn,
            model,
            context_window=context_window,
            max_output=max_output,
            prompt_cache_key="caller" if no_prompt_cache_key else prompt_cache_key,
            actor=actor,
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


@models_group.command("fallback")
@click.argument("model")
@click.option("--to", "to_model", help="The model its failing turns go to.")
@click.option("--base-url", help="The fallback's base URL (default: the run's).")
@click.option(
    "--api",
    type=click.Choice(["responses", "chat"]),
    help="The API the fallback speaks (default: the run's).",
)
@click.option(
    "--after",
    "after_attempts",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Failed attempts of a turn (429, 5xx, timeouts, no connection) before it falls back.",
)
@click.option("--remove", is_flag=True, help="MODEL has no fallback any more.")
@json_option
def models_fallback(
    model: str,
    to_model: str | None,
    base_url: str | None,
    api: str | None,
    after_attempts: int,
    remove: bool,
    as_json: bool,
) -> None:
    """Send MODEL's turns to another model (--to), base URL or API after --after failed
    attempts, and at once while MODEL's base URL's circuit is open. A 4xx that says the
    request is bad never falls back. The fallback's own fallback makes a chain."""
    with connection() as conn:
        if remove:
            if not routing.remove_fallback(conn, model):
                raise click.ClickException(f"{model} has no fallback")
            click.echo(f"{model} has no fallback")
            return
        if to_model is None:
            raise click.UsageError("--to MODEL is required (or --remove)")
        row = routing.set_fallback(
            conn,
            model,
            to_model,
            to_base_url=base_url,
            to_api=api,
            after_attempts=after_attempts,
        )
    if as_json:
        echo_json(row)
        return
    where = f" at {base_url}" if base_url else ""
    over = f" over {api}" if api else ""
    click.echo(f"{model} falls back to {to_model}{where}{over} after {after_attempts} failures")


@models_group.command("fallbacks")
@json_option
def models_fallbacks(as_json: bool) -> None:
    """Every model's fallback."""
    with connection() as conn:
        rows = routing.fallbacks(conn)
    emit(rows, as_json, ["model", "to_model", "to_base_url", "to_api", "after_attempts"])


@models_group.command("circuits")
@json_option
def models_circuits(as_json: bool) -> None:
    """Every base URL's circuit: closed, open (turns go to their fallback, or wait) or
    half-open (its probe is out); wait_s: seconds until an open one is probed."""
    with connection() as conn:
        rows = routing.circuits(conn)
    emit(
        rows,
        as_json,
        ["base_url", "state", "failures", "opened_at", "wait_s", "open_after", "cool_down_s"],
    )


@models_group.command("circuit")
@click.argument("base_url")
@click.option(
    "--open-after", type=click.IntRange(min=1), help="Consecutive failures that open it (5)."
)
@click.option("--window", "window_s", type=float, help="Seconds they must fall within (10).")
@click.option("--cool-down", "cool_down_s", type=float, help="Seconds open before a probe (5).")
@click.option(
    "--probe-timeout",
    "probe_timeout_s",
    type=float,
    help="Seconds after which an unanswered probe is taken again (150).",
)
@click.option("--close", is_flag=True, help="Close it now (the server is known to be back).")
@json_option
def models_circuit(
    base_url: str,
    open_after: int | None,
    window_s: float | None,
    cool_down_s: float | None,
    probe_timeout_s: float | None,
    close: bool,
    as_json: bool,
) -> None:
    """Set BASE_URL's circuit (shared by every relay); unset options keep their values."""
    with connection() as conn:
        row = routing.set_circuit(
            conn,
            base_url,
            open_after=open_after,
            window_s=window_s,
            cool_down_s=cool_down_s,
            probe_timeout_s=probe_timeout_s,
            close=close,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(
        f"{row['base_url']}: {row['state']}, opens after {row['open_after']} failures within "
        f"{row['window_s']:g} s, probed after {row['cool_down_s']:g} s"
    )


@models_group.command("route")
@click.argument("tenant")
@click.option(
    "--rules",
    required=True,
    help='A JSON list of rules, the first that matches wins, e.g. \'[{"first_turn": true, '
    '"model": "big"}, {"after_tool_results": true, "model": "small"}]\'; conditions: '
    "first_turn, after_tool_results, min_turn, max_turn, max_tokens_left; targets: model, "
    "base_url, api. [] routes nothing.",
)
@json_option
def models_route(tenant: str, rules: str, as_json: bool) -> None:
    """A new version of TENANT's routing rules: runs created from now on use it, running
    runs keep the version they started with."""
    try:
        parsed = json.loads(rules)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON: {err}", param_hint="--rules") from err
    if not isinstance(parsed, list):
        raise click.BadParameter("a JSON list of rules", param_hint="--rules")
    try:
        with connection() as conn:
            row = routing.set_routes(conn, tenant, parsed)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--rules") from err
    if as_json:
        echo_json(row)
        return
    click.echo(f"{tenant}: routing rules version {row['version']} ({len(row['rules'])} rules)")


@models_group.command("routes")
@click.option("--tenant", help="Every version of this tenant's rules (default: each newest).")
@json_option
def models_routes(tenant: str | None, as_json: bool) -> None:
    """The routing rules of each tenant (its newest version), or every version of one."""
    with connection() as conn:
        rows = routing.routes(conn, tenant)
    emit(
        [{**r, "rules": json.dumps(r["rules"])} for r in rows] if not as_json else rows,
        as_json,
        ["tenant_id", "version", "rules", "created_by", "created_at"],
    )
