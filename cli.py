"""The ``outbox`` command line: thin wrappers that parse arguments and call the library.

Every command resolves the database the same way (``OUTBOX_DATABASE_URL``, else the
embedded server), prints tables for people and JSON with ``--json``, and reports every
refusal the same way: ``error: ...`` plus ``hint: ...`` on stderr with exit status 2, never
a traceback. That covers the library's ``OutboxError``, input the library's models refuse
(a pydantic ``ValidationError``, summed up one line per field) and click's usage errors
(a malformed uuid, a missing option); input is checked before anything is written, so a
refusal changes nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from commands import (
    journal,
    keys,
    limits,
    platform,
    prices,
    queue,
    relay,
    runs,
    serve,
    tenants,
    threads,
    tools,
    webhooks,
)
from commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    format_fields,
    json_option,
    refuse,
)
from outbox import approvals, budgets, config, credentials, db, migrate, ops, policy
from outbox.errors import InvalidInput, OutboxError


@click.group(cls=OutboxGroup)
@click.version_option(package_name="agent-outbox")
def main() -> None:
    """agent-outbox: tool-using AI agent runs on Postgres, effectively once.

    The database is OUTBOX_DATABASE_URL, or, when that variable is not set, an embedded
    PostgreSQL kept in $OUTBOX_HOME/pgdata (default ./.outbox) that `outbox db start`
    starts (other commands never start it).
    """


# -- db ---------------------------------------------------------------------------------


@main.group("db")
def db_group() -> None:
    """Provision and migrate the database."""


@contextmanager
def revision_refused(revision: str) -> Iterator[None]:
    """Alembic's refusal of a revision as our error (nothing was migrated)."""
    from alembic.util import CommandError

    try:
        yield
    except CommandError as err:
        raise InvalidInput(
            f"cannot migrate to revision {revision!r}: {err}",
            hint="give a revision such as head, base or 0001; `outbox db current` "
            "shows where the schema is",
        ) from err


RUN_DEFAULTS_REVISION = "0030"  # the revision that made outbox.run_defaults


@db_group.command("upgrade")
@click.argument("revision", default="head")
@json_option
def db_upgrade(revision: str, as_json: bool) -> None:
    """Migrate the schema up to REVISION (default: the newest). Then store the defaults of
    new runs that OUTBOX_DEFAULT_MAX_STEPS, OUTBOX_LOOP_LIMIT and OUTBOX_ACTION_TIMEOUT_S
    set, if any (`outbox platform defaults`)."""
    url = db.database_url()
    with revision_refused(revision):
        migrate.upgrade(url, revision)
    at = migrate.current(url)
    stored: dict[str, Any] = {}
    revisions = migrate.revisions()
    if (
        config.run_defaults_from_environment()
        and at in revisions
        and revisions.index(at) >= revisions.index(RUN_DEFAULTS_REVISION)
    ):
        with connection() as conn:
            stored = budgets.apply_environment(conn, actor="outbox db upgrade (environment)")
    if as_json:
        echo_json(
            {"schema": db.schema_name(), "revision": at, "url": db.redact(url)}
            | ({"run_defaults_stored": stored} if stored else {})
        )
        return
    click.echo(f"schema {db.schema_name()!r} at {at} on {db.redact(url)}")
    if stored:
        click.echo("defaults of new runs from the environment: " + format_fields(stored))


@db_group.command("downgrade")
@click.argument("revision")
@json_option
def db_downgrade(revision: str, as_json: bool) -> None:
    """Migrate the schema down to REVISION ('base' removes every table)."""
    url = db.database_url()
    with revision_refused(revision):
        migrate.downgrade(url, revision)
    at = migrate.current(url)
    if as_json:
        echo_json({"schema": db.schema_name(), "revision": at})  # null: base
        return
    click.echo(f"schema {db.schema_name()!r} at {at or 'base'}")


@db_group.command("current")
@json_option
def db_current(as_json: bool) -> None:
    """Print the schema's migration revision and whether it is the newest."""
    current = migrate.current(db.database_url())
    head = migrate.head_revision()
    if as_json:
        echo_json({"revision": current, "head": head, "up_to_date": current == head})
        return
    state = (
        "up to date" if current == head else f"behind (newest is {head}): run `outbox db upgrade`"
    )
    click.echo(f"{current or 'none'} ({state})")


@db_group.command("url")
@json_option
def db_url(as_json: bool) -> None:
    """Print the database URL in use (the embedded server's only while it runs)."""
    url = db.database_url()
    if as_json:
        echo_json({"url": url})
        return
    click.echo(url)


@db_group.command("start")
@json_option
def db_start(as_json: bool) -> None:
    """Start the embedded PostgreSQL (reused when already running); prints its URL.

    The only command that starts it (with `outbox demo`): every other command uses it
    while it runs and otherwise says how to start it. With OUTBOX_DATABASE_URL set there
    is nothing to start: that database is used.
    """
    import os

    if os.environ.get("OUTBOX_DATABASE_URL"):
        url = db.redact(os.environ["OUTBOX_DATABASE_URL"])
        if as_json:
            echo_json({"url": url, "embedded": False})
            return
        click.echo(f"OUTBOX_DATABASE_URL is set ({url}): using it, the embedded server stays off")
        return
    started = db.EmbeddedServer.default().start()
    if as_json:
        echo_json({"url": started, "embedded": True})
        return
    click.echo(started)


@db_group.command("stop")
@json_option
def db_stop(as_json: bool) -> None:
    """Stop the embedded PostgreSQL."""
    server = db.EmbeddedServer.default()
    stopped = server.stop()
    if as_json:
        echo_json({"stopped": stopped, "pgdata": str(server.pgdata)})
        return
    click.echo("stopped" if stopped else f"not running ({server.pgdata})")


@db_group.command("status")
@json_option
def db_status(as_json: bool) -> None:
    """Say which database is in use and whether it answers."""
    import os

    if os.environ.get("OUTBOX_DATABASE_URL"):
        url = os.environ["OUTBOX_DATABASE_URL"]
        with db.connect(url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = row and row[0]
        if as_json:
            echo_json(
                {"source": "OUTBOX_DATABASE_URL", "url": db.redact(url), "up": True,
                 "server_version": version}
            )  # fmt: skip
            return
        click.echo(f"OUTBOX_DATABASE_URL {db.redact(url)}: up, PostgreSQL {version}")
        return
    server = db.EmbeddedServer.default()
    running = server.url()
    if as_json:
        echo_json(
            {"source": "embedded", "pgdata": str(server.pgdata), "up": running is not None,
             "url": running}
        )  # fmt: skip
        return
    click.echo(f"embedded {server.pgdata}: {'running at ' + running if running else 'stopped'}")


@main.group("credentials")
def credentials_group() -> None:
    """The secrets tool calls carry, per tenant: by reference, or encrypted."""


@credentials_group.command("set")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True, help="'*': every tenant's default.")
@click.option("--env", help="The relay reads the secret from this environment variable.")
@click.option("--file", "file_", help="The relay reads a line NAME=value of this file.")
@click.option(
    "--value-stdin",
    is_flag=True,
    help="Read the secret from stdin and store it encrypted with $OUTBOX_CREDENTIALS_KEY.",
)
@click.option("--header", default="Authorization", show_default=True)
@click.option("--scheme", default="Bearer", show_default=True, help="'' sends the bare value.")
@actor_option
@json_option
def credentials_set(
    name: str,
    tenant: str,
    env: str | None,
    file_: str | None,
    value_stdin: bool,
    header: str,
    scheme: str,
    actor: str,
    as_json: bool,
) -> None:
    """Create or rotate credential NAME (the --credential-ref of a tool) for TENANT.

    \b
    The database keeps where the secret is, never the secret: an environment variable or
    a file the relay reads at call time, or (--value-stdin) the value encrypted with a key
    only the relay and you hold ($OUTBOX_CREDENTIALS_KEY; `outbox credentials new-key`).
    Setting it again rotates it: calls claimed from then on carry the new secret. The
    relay sends it in HEADER ("SCHEME value") to that tool only, and cuts it from
    whatever the tool answers.
    """
    value = sys.stdin.read().strip() if value_stdin else None
    if value_stdin and not value:
        refuse(
            "--value-stdin read nothing", hint="pipe the secret in: ... | outbox credentials set"
        )
    with connection() as conn:
        row = credentials.set_credential(
            conn, name, tenant_id=tenant, env=env, file=file_, value=value, header=header,
            scheme=scheme, actor=actor,
        )  # fmt: skip
    if as_json:
        echo_json(row)
        return
    verb = "set" if row["version"] == 1 else f"rotated to version {row['version']}"
    click.echo(f"credential {name} of tenant {tenant}: {verb} ({row['source']})")


@credentials_group.command("revoke")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@actor_option
@json_option
def credentials_revoke(name: str, tenant: str, actor: str, as_json: bool) -> None:
    """Revoke credential NAME of TENANT: calls that need it end with an error result the
    model sees, never with the old secret. `credentials set` rotates it back in."""
    with connection() as conn:
        row = credentials.revoke(conn, name, tenant_id=tenant, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(f"revoked credential {name} of tenant {tenant}")


@credentials_group.command("list")
@json_option
def credentials_list(as_json: bool) -> None:
    """Every credential: where its secret is, its version, whether it is revoked."""
    with connection() as conn:
        rows = credentials.list_credentials(conn)
    emit(rows, as_json, ["name", "tenant_id", "source", "reference", "version", "revoked_at"])


@credentials_group.command("new-key")
@json_option
def credentials_new_key(as_json: bool) -> None:
    """Print a new key for $OUTBOX_CREDENTIALS_KEY (give it to the relays, keep it safe)."""
    key = credentials.new_key()
    if as_json:
        echo_json({"key": key})
        return
    click.echo(key)


# -- the action layer: risk policies and approvals --------------------------------------


@main.group("policy")
def policy_group() -> None:
    """Risk policies: per tenant and risk tier, whether a tool call runs, waits, or not."""


@policy_group.command("list")
@json_option
def policy_list(as_json: bool) -> None:
    """Every rule: the default ('*') and each tenant's own."""
    with connection() as conn:
        rows = policy.policies(conn)
    emit(
        rows,
        as_json,
        ["tenant_id", "risk_tier", "action", "approvers", "approval_timeout_s", "updated_by"],
    )


@policy_group.command("set")
@click.argument("tenant")
@click.argument("tier", type=click.Choice(policy.TIERS))
@click.argument("action", type=click.Choice(policy.ACTIONS))
@click.option(
    "--approver",
    "approvers",
    multiple=True,
    help="Who may decide (repeat; none: anyone who can run `outbox approvals`).",
)
@click.option(
    "--timeout", default="24h", show_default=True, help="How long a call waits: 90s, 15m, 12h."
)
@actor_option
@json_option
def policy_set(
    tenant: str,
    tier: str,
    action: str,
    approvers: tuple[str, ...],
    timeout: str,
    actor: str,
    as_json: bool,
) -> None:
    """Say what TENANT's ('*': every tenant's default) calls of risk TIER do.

    
    allow    the call runs;
    approve  the call waits for a reviewer's decision (`outbox approvals`); with no
             decision by --timeout it is denied, never run;
    deny     the call never runs: the model sees "denied by policy".
    Decided when a call is recorded and journaled with the rule that decided it. A tool
    registered with --requires-approval waits whatever its tier says.
    """
    timeout_s = ops.parse_age(timeout).total_seconds()
    with connection() as conn:
        row = policy.set_policy(
            conn,
            tenant,
            tier,
            action,
            approvers=list(approvers),
            approval_timeout_s=timeout_s,
            actor=actor,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(f"policy {tenant}/{tier}: {action}")


@policy_group.command("clear")
@click.argument("tenant")
@click.argument("tier", type=click.Choice(policy.TIERS))
@actor_option
@json_option
def policy_clear(tenant: str, tier: str, actor: str, as_json: bool) -> None:
    """Remove TENANT's own rule for TIER: the default ('*') applies again."""
    with connection() as conn:
        removed = policy.clear_policy(conn, tenant, tier, actor=actor)
    if as_json:
        echo_json({"tenant_id": tenant, "risk_tier": tier, "removed": removed})
        return
    click.echo(f"cleared {tenant}/{tier}" if removed else f"{tenant} had no rule for {tier}")


@main.group("approvals")
def approvals_group() -> None:
    """Tool calls waiting for a reviewer: list, show, approve, deny."""


APPROVAL_COLUMNS = ["id", "tenant_id", "tool_name", "status", "deadline", "approvers", "run_id"]


@approvals_group.command("list")
@click.option(
    "--status",
    type=click.Choice(["pending", "approved", "denied", "expired", "all"]),
    default="pending",
    show_default=True,
)
@click.option("--tenant", help="Only this tenant's.")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
def approvals_list(status: str, tenant: str | None, limit: int, as_json: bool) -> None:
    """Approvals, oldest first (by default the pending ones)."""
    with connection() as conn:
        rows = approvals.list_approvals(
            conn,
            None if status == "all" else status,
            tenant,
            limit,
        )
    emit(rows, as_json, APPROVAL_COLUMNS)


@approvals_group.command("show")
@click.argument("approval_id", type=int)
@json_option
def approvals_show(approval_id: int, as_json: bool) -> None:
    """One approval with the exact arguments it is for and their digest."""
    with connection() as conn:
        row = approvals.get(conn, approval_id)
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        shown = json.dumps(value, indent=2) if key == "arguments" else value
        click.echo(f"{key}: {shown}")


def _decide(
    approval_id: int, decision: str, actor: str, reason: str, digest: str | None, as_json: bool
) -> None:
    with connection() as conn:
        row = approvals.decide(
            conn,
            approval_id,
            decision,
            actor=actor,
            reason=reason,
            digest=digest,
        )
    if as_json:
        echo_json(row)
        return
    click.echo(f"approval {approval_id}: {row['status']} by {row['decided_by']}")


@approvals_group.command("approve")
@click.argument("approval_id", type=int)
@click.option(
    "--digest",
    help="The arguments digest you reviewed (from `approvals show`): refused if it differs.",
)
@click.option("--reason", default="", help="Recorded in the journal.")
@actor_option
@json_option
def approvals_approve(
    approval_id: int, digest: str | None, reason: str, actor: str, as_json: bool
) -> None:
    """Approve a waiting call: a relay runs it once.

    
    Decided once: approving again, or denying after, is refused. Only one of the
    approvers its policy lists may decide (as --actor), and only before its deadline.
    """
    _decide(approval_id, "approve", actor, reason, digest, as_json)


@approvals_group.command("deny")
@click.argument("approval_id", type=int)
@click.option("--reason", default="", help="Why: the model sees it, and the journal keeps it.")
@click.option("--digest", help="The arguments digest you reviewed (from `approvals show`).")
@actor_option
@json_option
def approvals_deny(
    approval_id: int, reason: str, digest: str | None, actor: str, as_json: bool
) -> None:
    """Deny a waiting call: it never runs; the model sees "denied by reviewer" and the run
    goes on."""
    _decide(approval_id, "deny", actor, reason, digest, as_json)


# -- demo -------------------------------------------------------------------------------


def _demo_module() -> Any:
    """``demo.run`` from the checkout this command runs from: the demo is not in the wheel
    (it would be a top-level ``demo`` package in everyone's site-packages)."""
    checkout = Path(__file__).resolve().parent
    if not (checkout / "demo" / "run.py").is_file():
        raise OutboxError(
            "`outbox demo` runs from a checkout of agent-outbox; the installed package "
            "does not include the demo",
            hint="clone the repository and run `make demo` there",
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    import importlib

    try:
        return importlib.import_module("demo.run")
    except ModuleNotFoundError as err:
        # The demo's naive side is an OpenAI SDK loop; the product itself does not need the
        # SDK, so a plain `pip install -e .` leaves it out.
        if err.name != "openai":
            raise
        raise OutboxError(
            "`outbox demo` needs the openai package, which agent-outbox installs only with "
            "its demo extra",
            hint=f"run `make demo`, or `pip install -e '{checkout}[demo]'`",
        ) from err


@main.command("demo")
@click.option("--runs", default=200, show_default=True, help="Conversations to drive.")
@click.option("--processes", default=3, show_default=True, help="Relay processes to run.")
@click.option("--seed", default=7, show_default=True, help="Seed of the scenario and faults.")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write JSON."
)
@click.option(
    "--database-url",
    help="Server to use (default OUTBOX_DATABASE_URL, else embedded); the demo drops and "
    "re-creates its own database `outbox_demo` there.",
)
@click.option("--database-name", default="outbox_demo", hidden=True)
@click.option("--no-naive", is_flag=True, help="Skip the naive coordinator's run.")
def demo(
    runs: int,
    processes: int,
    seed: int,
    json_path: Path | None,
    database_url: str | None,
    database_name: str,
    no_naive: bool,
) -> None:
    """Replay the duplicate-ticket incident under faults: the outbox beside a naive loop.

    Starts a scripted model and three audited tool services over HTTP, PROCESSES relay
    processes, and RUNS conversations with parallel tool calls, client-run approvals and
    double-submitted turns; injects stalls past the tool timeout, kill -9 of relay
    processes and duplicate callbacks. Prints what the services' own audits saw, for the
    outbox and for a naive coordinator under the same faults. Exit status 1 when the
    outbox side shows any duplicate side effect, orphan tool result or stuck run.
    """
    demo_module = _demo_module()
    if runs < 1 or processes < 1:
        raise click.BadParameter("--runs and --processes must be at least 1")
    if database_url is not None:
        db.check_url(database_url, "--database-url")
    cfg = demo_module.DemoConfig(
        runs=runs,
        processes=processes,
        seed=seed,
        server_url=database_url,
        database=database_name,
        naive=not no_naive,
    )
    sys.exit(demo_module.run(cfg, json_path))


main.add_command(tools.tools_group)

main.add_command(relay.relay_command)

main.add_command(serve.serve_command)

main.add_command(keys.keys_group)

main.add_command(webhooks.webhooks_group)

main.add_command(queue.queue_group)
main.add_command(queue.requeue_cmd)
main.add_command(queue.quarantine_cmd)
main.add_command(queue.release_cmd)
main.add_command(queue.reconcile_cmd)

main.add_command(journal.journal_group)
main.add_command(journal.prune_cmd)

main.add_command(runs.runs_group)

main.add_command(threads.threads_group)

main.add_command(tenants.tenants_group)

main.add_command(prices.prices_group)

main.add_command(platform.platform_group)

main.add_command(limits.limits_command)


if __name__ == "__main__":
    main()
