"""The ``outbox`` command line: thin wrappers that parse arguments and call the library.

Every command resolves the database the same way (``OUTBOX_DATABASE_URL``, else the
embedded server), prints tables for people and JSON with ``--json``, and turns an
``OutboxError`` into ``error: ...`` plus ``hint: ...`` on stderr with exit status 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg

from outbox import db, migrate, ops, registry
from outbox.errors import OutboxError

F = TypeVar("F", bound=Callable[..., Any])


class OutboxGroup(click.Group):
    """A click group that reports our errors as a message and a hint, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OutboxError as err:
            click.echo(f"error: {err.args[0]}", err=True)
            if err.hint:
                click.echo(f"hint: {err.hint}", err=True)
            sys.exit(2)


@contextmanager
def connection() -> Iterator[psycopg.Connection[Any]]:
    """A connection to the configured database, committed when the block succeeds."""
    with db.connect() as conn:
        yield conn


def emit(rows: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    click.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        click.echo("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        func
    )


@click.group(cls=OutboxGroup)
@click.version_option(package_name="agent-outbox")
def main() -> None:
    """agent-outbox: tool-using AI agent runs on Postgres, effectively once.

    The database is OUTBOX_DATABASE_URL, or an embedded PostgreSQL kept in
    $OUTBOX_HOME/pgdata (default ./.outbox) when that variable is not set.
    """


# -- db ---------------------------------------------------------------------------------


@main.group("db")
def db_group() -> None:
    """Provision and migrate the database."""


@db_group.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Migrate the schema up to REVISION (default: the newest)."""
    url = db.database_url()
    migrate.upgrade(url, revision)
    click.echo(f"schema {db.schema_name()!r} at {migrate.current(url)} on {db.redact(url)}")


@db_group.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the schema down to REVISION ('base' removes every table)."""
    url = db.database_url()
    migrate.downgrade(url, revision)
    click.echo(f"schema {db.schema_name()!r} at {migrate.current(url) or 'base'}")


@db_group.command("current")
def db_current() -> None:
    """Print the schema's migration revision and whether it is the newest."""
    current = migrate.current(db.database_url())
    head = migrate.head_revision()
    state = (
        "up to date" if current == head else f"behind (newest is {head}): run `outbox db upgrade`"
    )
    click.echo(f"{current or 'none'} ({state})")


@db_group.command("url")
def db_url() -> None:
    """Print the database URL in use (starting the embedded server if needed)."""
    click.echo(db.database_url())


@db_group.command("start")
def db_start() -> None:
    """Start the embedded PostgreSQL (reused when already running)."""
    click.echo(db.EmbeddedServer.default().start())


@db_group.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    server = db.EmbeddedServer.default()
    click.echo("stopped" if server.stop() else f"not running ({server.pgdata})")


@db_group.command("status")
def db_status() -> None:
    """Say which database is in use and whether it answers."""
    import os

    if os.environ.get("OUTBOX_DATABASE_URL"):
        url = os.environ["OUTBOX_DATABASE_URL"]
        with db.connect(url) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        click.echo(f"OUTBOX_DATABASE_URL {db.redact(url)}: up, PostgreSQL {version and version[0]}")
        return
    server = db.EmbeddedServer.default()
    running = server.url()
    click.echo(f"embedded {server.pgdata}: {'running at ' + running if running else 'stopped'}")


# -- tools ------------------------------------------------------------------------------


@main.group("tools")
def tools_group() -> None:
    """The tool registry: register versions, list, show, enable, disable."""


@tools_group.command("register")
@click.argument("name")
@click.option("--executor", type=click.Choice(["http", "client", "python"]), default="http")
@click.option("--endpoint", help="URL the relay POSTs arguments to (http tools).")
@click.option("--lookup-endpoint", help="URL that answers 'did this key happen?' (lookup mode).")
@click.option("--callable", "callable_", help="'package.module:function' (python tools).")
@click.option(
    "--idempotency",
    type=click.Choice(["key", "lookup", "none"]),
    default="key",
    show_default=True,
    help="key: honours Idempotency-Key; lookup: offers a lookup endpoint; none: neither "
    "(never re-executed after an ambiguous attempt).",
)
@click.option("--schema", "schema_", help="JSON Schema of the arguments: inline JSON or @file.")
@click.option(
    "--timeout", "timeout_s", type=float, default=30.0, show_default=True, help="Seconds."
)
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option("--risk", type=click.Choice(["low", "medium", "high"]), default="low")
@click.option("--credential-ref", help="Name of a secret the relay resolves at call time.")
@click.option("--description", default="")
@click.option("--tenant", default="*", show_default=True, help="'*' = shared by all tenants.")
@click.option("--disabled", is_flag=True, help="Register the version disabled.")
def tools_register(name: str, schema_: str | None, callable_: str | None, **opts: Any) -> None:
    """Register a new version of tool NAME."""
    schema: dict[str, Any] = {"type": "object"}
    if schema_:
        text = Path(schema_[1:]).read_text() if schema_.startswith("@") else schema_
        schema = json.loads(text)
    try:
        spec = registry.ToolSpec(
            name=name,
            json_schema=schema,
            callable=callable_,
            executor=opts["executor"],
            endpoint=opts["endpoint"],
            lookup_endpoint=opts["lookup_endpoint"],
            idempotency_mode=opts["idempotency"],
            timeout_s=opts["timeout_s"],
            max_attempts=opts["max_attempts"],
            risk_tier=opts["risk"],
            credential_ref=opts["credential_ref"],
            description=opts["description"],
            tenant_id=opts["tenant"],
            enabled=not opts["disabled"],
        )
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    with connection() as conn:
        row = registry.register(conn, spec)
    click.echo(
        f"registered {row['name']} v{row['version']} ({row['executor']}, {row['idempotency_mode']})"
    )


TOOL_COLUMNS = [
    "tenant_id",
    "name",
    "version",
    "executor",
    "idempotency_mode",
    "enabled",
    "endpoint",
]


@tools_group.command("list")
@json_option
def tools_list(as_json: bool) -> None:
    """List every tool's newest version."""
    with connection() as conn:
        emit(registry.list_tools(conn), as_json, TOOL_COLUMNS)


@tools_group.command("show")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@json_option
def tools_show(name: str, tenant: str, as_json: bool) -> None:
    """Show every version of tool NAME."""
    with connection() as conn:
        rows = registry.versions(conn, name, tenant)
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    for row in rows:
        click.echo(f"{row['name']} v{row['version']}")
        for key, value in row.items():
            if key not in ("name", "version"):
                click.echo(f"  {key}: {json.dumps(value, default=str)}")


@tools_group.command("disable")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
def tools_disable(name: str, tenant: str) -> None:
    """Disable tool NAME: new calls to it become error results the model sees."""
    with connection() as conn:
        registry.set_enabled(conn, name, False, tenant)
    click.echo(f"disabled {name}")


@tools_group.command("enable")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
def tools_enable(name: str, tenant: str) -> None:
    """Enable tool NAME again."""
    with connection() as conn:
        registry.set_enabled(conn, name, True, tenant)
    click.echo(f"enabled {name}")


# -- relay ------------------------------------------------------------------------------


@main.command("relay")
@click.option("--concurrency", default=16, show_default=True, help="Execution slots per process.")
@click.option("--processes", default=1, show_default=True, help="Worker processes to supervise.")
@click.option("--lease", "lease_s", default=30.0, show_default=True, help="Lease length, s.")
@click.option("--poll-interval", "poll_s", default=1.0, show_default=True, help="Fallback poll, s.")
@click.option(
    "--no-listen", is_flag=True, help="Poll only (for poolers in transaction mode: no LISTEN)."
)
@click.option("--grace", "grace_s", default=20.0, show_default=True, help="SIGTERM grace, s.")
@click.option(
    "--retry-base", "retry_base_s", default=0.5, show_default=True, help="First retry delay, s."
)
@click.option(
    "--rescue-interval", "rescue_s", default=2.0, show_default=True, help="Sweep period, s."
)
@click.option("--kind", "kinds", multiple=True, help="Only these kinds (repeatable); default all.")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics (port + process index).")
@click.option("--log-level", default="INFO", show_default=True)
def relay_command(processes: int, log_level: str, kinds: tuple[str, ...], **opts: Any) -> None:
    """Run relay workers: claim outbox rows, call tools and models, record the outcomes.

    Logs are JSON lines on stderr. SIGTERM or Ctrl-C stops claiming, lets in-flight work
    finish within the grace period and releases the rest; a second signal exits at once.
    """
    from relay import logs, supervisor, worker
    from relay.config import ALL_KINDS, RelayConfig

    url = db.database_url()
    with db.connect(url) as conn:
        db.check_schema_current(conn)
    cfg = RelayConfig(
        database_url=url,
        schema=db.schema_name(),
        concurrency=opts["concurrency"],
        lease_s=opts["lease_s"],
        poll_interval_s=opts["poll_s"],
        listen=not opts["no_listen"],
        grace_s=opts["grace_s"],
        retry_base_s=opts["retry_base_s"],
        rescue_interval_s=opts["rescue_s"],
        kinds=kinds or ALL_KINDS,
        metrics_port=opts["metrics_port"],
    )
    logs.setup(log_level)
    if processes > 1:
        sys.exit(supervisor.supervise(cfg, processes, log_level))
    sys.exit(worker.run_worker(cfg))


# -- operate: queue, runs, requeue, quarantine, release, reconcile, journal, prune -------


def default_actor() -> str:
    """Who is acting, for the journal: the OS user."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def actor_option(func: F) -> F:
    return click.option(
        "--actor",
        default=default_actor,
        show_default="the OS user",
        help="Who is acting (recorded in the journal).",
    )(func)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))


def echo_changes(changes: list[ops.Change], as_json: bool) -> None:
    if as_json:
        echo_json([c.as_dict() for c in changes])
        return
    if not changes:
        click.echo("nothing matched")
    for c in changes:
        verb = c.action if c.applied else f"would {c.action}"
        if not c.applied and c.note and c.note != "dry run":
            click.echo(f"skipped {c.target}: {c.note}")
            continue
        click.echo(f"{verb} {c.target}: {c.from_state} -> {c.to_state}")


@main.group("queue")
def queue_group() -> None:
    """Inspect the work queue."""


@queue_group.command("stats")
@click.option(
    "--window",
    "window_min",
    type=int,
    default=15,
    show_default=True,
    help="Minutes of claims to compute claim-to-start latency over.",
)
@json_option
def queue_stats(window_min: int, as_json: bool) -> None:
    """Ready, delayed, in flight and quarantined work per kind and tool; lag; claim latency."""
    with connection() as conn:
        stats = ops.queue_stats(conn, window_min)
    if as_json:
        echo_json(stats)
        return
    emit(stats["by_kind"], False, ["kind", "ready", "delayed", "in_flight", "quarantined", "lag_s"])
    if stats["by_tool"]:
        click.echo("")
        emit(stats["by_tool"], False, ["tool", "ready", "delayed", "in_flight", "quarantined"])
    claim = stats["claim_to_start"]
    click.echo(f"\noldest ready row waits: {stats['oldest_ready_lag_s']}s")
    click.echo(
        f"claim-to-start over {claim['window_min']} min: p50 {claim['p50_s'] or 0}s, "
        f"p99 {claim['p99_s'] or 0}s ({claim['samples']} claims)"
    )


@main.group("runs")
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
    """Show RUN (its id or a prefix) and its timeline of journal events."""
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


@main.command("requeue")
@click.argument("ident", metavar="[ID]", required=False)
@click.option("--tool", help="Bulk: only calls of this tool.")
@click.option("--status", "state", help="Bulk: quarantined or delayed rows.")
@click.option("--since", help="Bulk: last claimed (or queued) since an age or ISO time.")
@click.option("--dry-run", is_flag=True, help="Say what would change, change nothing.")
@actor_option
@json_option
def requeue_cmd(
    ident: str | None,
    tool: str | None,
    state: str | None,
    since: str | None,
    dry_run: bool,
    actor: str,
    as_json: bool,
) -> None:
    """Put quarantined or delayed work back in the queue, due now.

    ID is a tool call (12 or call:12) or an outbox row (outbox:7); or select many with
    --status (and --tool, --since). Attempts stay counted.
    """
    if (ident is None) == (state is None):
        raise click.UsageError("give an ID, or --status (with --tool/--since) for many")
    if ident is not None and (tool or since):
        raise click.UsageError("--tool and --since select many rows: use them with --status")
    with connection() as conn:
        if ident is not None:
            changes = [ops.requeue(conn, ident, actor=actor, dry_run=dry_run)]
        else:
            assert state is not None
            when = ops.parse_since(since) if since else None
            changes = ops.requeue_matching(
                conn, state=state, tool=tool, since=when, actor=actor, dry_run=dry_run
            )
    echo_changes(changes, as_json)


@main.command("quarantine")
@click.argument("ident", metavar="ID")
@click.option("--reason", required=True, help="Why (recorded on the row and in the journal).")
@actor_option
@json_option
def quarantine_cmd(ident: str, reason: str, actor: str, as_json: bool) -> None:
    """Hold queued work (a tool call or outbox:N) so no worker claims it."""
    with connection() as conn:
        change = ops.quarantine(conn, ident, reason=reason, actor=actor)
    echo_changes([change], as_json)


@main.command("release")
@click.argument("ident", metavar="ID")
@actor_option
@json_option
def release_cmd(ident: str, actor: str, as_json: bool) -> None:
    """Take quarantined work (a tool call or outbox:N) out of quarantine."""
    with connection() as conn:
        change = ops.release(conn, ident, actor=actor)
    echo_changes([change], as_json)


@main.command("reconcile")
@click.argument("ident", metavar="TOOL_CALL")
@click.option(
    "--happened/--not-happened",
    default=None,
    required=True,
    help="Whether the call's side effect took place.",
)
@click.option("--result", "result_text", help="The call's output as JSON (or @file).")
@actor_option
@json_option
def reconcile_cmd(
    ident: str, happened: bool, result_text: str | None, actor: str, as_json: bool
) -> None:
    """Settle an outcome_unknown TOOL_CALL: record its result, or run it again."""
    result: Any = None
    if happened:
        if result_text is None:
            raise click.UsageError("--happened needs --result JSON (the call's output)")
        text = Path(result_text[1:]).read_text() if result_text.startswith("@") else result_text
        try:
            result = json.loads(text)
        except ValueError as err:
            raise click.BadParameter(f"not JSON: {err}", param_hint="--result") from err
    elif result_text is not None:
        raise click.UsageError("--result goes with --happened")
    with connection() as conn:
        change = ops.reconcile(conn, ident, happened=happened, result=result, actor=actor)
    echo_changes([change], as_json)


@main.group("journal")
def journal_group() -> None:
    """Read the append-only journal."""


@journal_group.command("tail")
@click.option("--run", help="Only this run's events (id or prefix).")
@click.option("-n", "--lines", "limit", type=int, default=20, show_default=True)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events (Ctrl-C stops).")
@json_option
def journal_tail(run: str | None, limit: int, follow: bool, as_json: bool) -> None:
    """Print the newest journal events, oldest first (JSON: one object per line)."""
    with db.connect(autocommit=True) as conn:
        try:
            for event in ops.tail(conn, run=run, limit=limit, follow=follow):
                if as_json:
                    click.echo(json.dumps(event, default=str))
                    continue
                where = " ".join(
                    f"{k}={event[k]}"
                    for k in ("run_id", "batch_id", "tool_call_ref", "attempt", "worker", "actor")
                    if event[k] is not None
                )
                detail = json.dumps(event["detail"], default=str) if event["detail"] else ""
                click.echo(
                    f"{event['at']:%Y-%m-%d %H:%M:%S.%f}  {event['event']:28} {where} {detail}"
                )
        except KeyboardInterrupt:
            pass


@main.command("prune")
@click.option("--older-than", "older_than", required=True, help="Age, e.g. 30d.")
@actor_option
@json_option
def prune_cmd(older_than: str, actor: str, as_json: bool) -> None:
    """Delete journal events older than an age (the schema owner only; journaled)."""
    age = ops.parse_age(older_than)
    with connection() as conn:
        removed = ops.prune(conn, age, actor=actor)
    if as_json:
        echo_json({"removed": removed, "older_than": older_than})
    else:
        click.echo(f"pruned {removed} journal events older than {older_than}")


# -- demo -------------------------------------------------------------------------------


@main.command("demo")
def demo() -> None:
    """Run the end-to-end demo on the embedded PostgreSQL (or OUTBOX_DATABASE_URL)."""
    from relay import demo as demo_module

    sys.exit(demo_module.run())


if __name__ == "__main__":
    main()
