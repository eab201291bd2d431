"""``outbox db``: start and stop the embedded PostgreSQL, say which database is in use, and
migrate its schema.

``db start`` (with ``outbox demo``) is the only command that starts the embedded server:
every other command uses it while it runs and otherwise says how to start it, so nothing
leaves a PostgreSQL running that the user did not ask for.

``outbox.migrate`` is imported by the three commands that use it, not with the module: it
loads Alembic and SQLAlchemy, which were half the start-up time of every ``outbox`` command.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from outbox import budgets, config, db
from outbox.commands.common import OutboxGroup, connection, echo_json, format_fields, json_option
from outbox.errors import InvalidInput


@click.group("db", cls=OutboxGroup)
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
    from outbox import migrate

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
    from outbox import migrate

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
    from outbox import migrate

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
