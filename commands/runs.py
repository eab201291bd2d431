"""``outbox runs``: list and show runs, start one, cancel one, submit a client tool's
outputs.

A run is named by its id or a prefix of it (``ops.resolve_run``). A new run goes through
``writer.start_run``, the transaction a backend's own call makes: the CLI has no way of
starting a run that a backend does not have.
"""

from __future__ import annotations

import uuid
from typing import Any

import click

from outbox import lifecycle, ops, storable, writer
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
    read_json_file,
)
from outbox.errors import InvalidInput
from outbox.schemas import ModelOptions, StartRun

# The options of ``runs create`` that are model options under the same name.
MODEL_OPTIONS = (
    "temperature",
    "top_p",
    "max_output_tokens",
    "verbosity",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "top_logprobs",
    "max_tool_calls",
)


@click.group("runs", cls=OutboxGroup)
def runs_group() -> None:
    """Runs: list, show (and the commands that create and steer them)."""


RUN_COLUMNS = ["id", "tenant_id", "status", "model", "step_count", "tokens_used", "created_at"]


@runs_group.command("list")
@click.option("--status", help="Only runs in this status.")
@click.option("--tenant", help="Only this tenant's runs.")
@click.option("--since", help="Created since an age (2h, 30d) or an ISO time.")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
def runs_list(
    status: str | None, tenant: str | None, since: str | None, limit: int, as_json: bool
) -> None:
    """List runs, newest first."""
    when = ops.parse_since(since) if since else None
    with connection() as conn:
        rows = ops.list_runs(conn, status=status, tenant_id=tenant, since=when, limit=limit)
    emit(rows, as_json, RUN_COLUMNS)


TIMELINE_COLUMNS = [
    "at",
    "event",
    "batch_id",
    "tool_call_ref",
    "attempt",
    "worker",
    "actor",
    "error",
]


@runs_group.command("show")
@click.argument("run")
@json_option
def runs_show(run: str, as_json: bool) -> None:
    """Show RUN (its id or a prefix), its timeline of journal events and the client calls
    it waits for."""
    with connection() as conn:
        shown = ops.show_run(conn, run)
    if as_json:
        echo_json(shown)
        return
    r = shown["run"]
    click.echo(
        f"run {r['id']}  tenant {r['tenant_id']}  {r['status']}  model {r['model']}  "
        f"steps {r['step_count']}/{r['max_steps']}  tokens {r['tokens_used']}"
    )
    if r["last_error"]:
        click.echo(f"last error: {r['last_error']}")
    rows = [
        {**{k: "" if v is None else v for k, v in e.items()}, "at": f"{e['at']:%H:%M:%S.%f}"}
        for e in shown["timeline"]
    ]
    emit(rows, False, TIMELINE_COLUMNS)
    if shown["pending_client_calls"]:
        click.echo("\nwaiting for client outputs (outbox runs submit-outputs RUN FILE):")
        emit(shown["pending_client_calls"], False, ["tool_call_id", "tool_name", "arguments_raw"])
    if shown["pending_approvals"]:
        click.echo("\nwaiting for a reviewer (outbox approvals approve|deny ID):")
        emit(shown["pending_approvals"], False, ["id", "tool_call_id", "tool_name", "deadline"])


@runs_group.command("create")
@click.option(
    "--thread", "thread_id", type=click.UUID, required=True, help="Thread id (see threads create)."
)
@click.option("--tenant", required=True, help="The tenant that owns the thread.")
@click.option("--message", required=True, help="The user turn that starts the run.")
@click.option("--model", required=True, help="Model name sent to the provider.")
@click.option("--tool", "tools", multiple=True, help="A registered tool the model may call.")
@click.option("--api", type=click.Choice(["responses", "chat"]), default="responses")
@click.option("--base-url", help="OpenAI-compatible server (default: $OPENAI_BASE_URL).")
@click.option("--instructions", help="System instructions for the model.")
@click.option("--max-steps", type=int, help="Most model turns in this run.")
@click.option("--max-tokens", type=int, help="Token budget of this run.")
@click.option(
    "--max-cost",
    type=str,
    help="Budget of this run in money, by the model's price (`outbox prices set`).",
)
@click.option("--idempotency-key", help="Resending the same turn with this key returns the run.")
@click.option("--temperature", type=float, help="Sampling temperature, 0-2 (model option).")
@click.option("--top-p", type=float, help="Nucleus sampling, 0-1 (model option).")
@click.option("--reasoning-effort", help="none, minimal, low, medium, high or xhigh.")
@click.option("--reasoning-summary", help="auto, concise or detailed.")
@click.option("--max-output-tokens", type=int, help="Cap of each turn's output tokens.")
@click.option("--verbosity", help="low, medium or high.")
@click.option("--service-tier", help="auto, default, flex, scale or priority.")
@click.option("--prompt-cache-key", help="The provider's cache key (default: from the thread).")
@click.option("--safety-identifier", help="A stable hash of the end user, for abuse checks.")
@click.option("--top-logprobs", type=int, help="Log probabilities of the top N tokens, 0-20.")
@click.option("--include", "include", multiple=True, help="Extra output data to include.")
@click.option("--max-tool-calls", type=int, help="Most tool calls of the run (outbox enforces).")
@click.option(
    "--model-options",
    "more_options",
    help="Any other model options as a JSON object (docs/models.md), e.g. a format.",
)
@json_option
def runs_create(
    thread_id: uuid.UUID,
    tenant: str,
    tools: tuple[str, ...],
    include: tuple[str, ...],
    more_options: str | None,
    as_json: bool,
    **opts: Any,
) -> None:
    """Start a run on a thread: the user message and the first model turn, atomically.
    The model options (docs/models.md) reach the model on every turn of the run."""
    try:
        options = storable.loads(more_options, "--model-options") if more_options else {}
    except ValueError as err:
        raise InvalidInput(f"--model-options is not JSON: {err}") from None
    if not isinstance(options, dict):
        raise InvalidInput("--model-options is a JSON object of model options")
    for name in MODEL_OPTIONS:
        if opts.get(name) is not None:
            options[name] = opts.pop(name)
        opts.pop(name, None)
    effort, summary = opts.pop("reasoning_effort", None), opts.pop("reasoning_summary", None)
    if effort is not None or summary is not None:
        options["reasoning"] = {k: v for k, v in (("effort", effort), ("summary", summary)) if v}
    if include:
        options["include"] = list(include)
    fields = {k: v for k, v in opts.items() if v is not None}
    request = StartRun(
        tenant_id=tenant,
        thread_id=thread_id,
        tools=list(tools),
        model_options=ModelOptions.model_validate(options),
        **fields,
    )
    with connection() as conn:
        run = writer.start_run(conn, request)
    if as_json:
        echo_json({"id": run.id, "status": run.status, "created": run.created})
        return
    click.echo(f"{'created' if run.created else 'existing'} run {run.id} ({run.status})")


@runs_group.command("cancel")
@click.argument("run")
@actor_option
@json_option
def runs_cancel(run: str, actor: str, as_json: bool) -> None:
    """Cancel RUN: no new claims; in-flight tool calls finish into orphaned_results."""
    with connection() as conn:
        found = ops.resolve_run(conn, run)
        ended = lifecycle.cancel_run(conn, found["id"], found["tenant_id"], actor=actor)
    if as_json:
        echo_json({"id": ended["id"], "status": ended["status"]})
        return
    click.echo(f"run {ended['id']} cancelled")


@runs_group.command("submit-outputs")
@click.argument("run")
@click.argument("file", type=click.File())
@json_option
def runs_submit_outputs(run: str, file: Any, as_json: bool) -> None:
    """Submit client tool outputs for RUN from FILE (JSON list; '-' reads stdin).

    FILE holds [{"tool_call_id": "...", "output": ...} | {"tool_call_id": "...", "error": "..."}].
    Submitting the same outputs twice is a no-op.
    """
    outputs = read_json_file(file, "outputs file")
    with connection() as conn:
        found = ops.resolve_run(conn, run)
        status = lifecycle.submit_tool_outputs(conn, found["tenant_id"], found["id"], outputs)
    if as_json:
        echo_json({"id": found["id"], "status": status})
        return
    click.echo(f"run {found['id']}: {status}")
