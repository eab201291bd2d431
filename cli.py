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

from outbox import db, migrate, registry
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


# -- demo -------------------------------------------------------------------------------


@main.command("demo")
def demo() -> None:
    """Run the end-to-end demo on the embedded PostgreSQL (or OUTBOX_DATABASE_URL)."""
    from relay import demo as demo_module

    sys.exit(demo_module.run())


if __name__ == "__main__":
    main()
