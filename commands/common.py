"""What every command of ``outbox`` shares: the connection, the output, the options and the
way a refusal is reported.

Every command resolves the database the same way (``OUTBOX_DATABASE_URL``, else the
embedded server), prints tables for people and JSON with ``--json``, and reports every
refusal the same way: ``error: ...`` plus ``hint: ...`` on stderr, never a traceback. That
covers the library's ``OutboxError``, input the library's models refuse (a pydantic
``ValidationError``, summed up one line per field) and click's usage errors (a malformed
uuid, a missing option); input is checked before anything is written, so a refusal changes
nothing. The exit status says what a script or a process manager should do (sysexits'):
2 the command or its input was refused (fix it), 75 the database did not answer (try again
later), 78 the settings do not fit the database (fix OUTBOX_DATABASE_URL or migrate).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import psycopg
from pydantic import ValidationError

from outbox import db, storable
from outbox.errors import (
    DatabaseConfigError,
    DatabaseUnavailable,
    InvalidInput,
    MigrationsBehind,
    OutboxError,
)

F = TypeVar("F", bound=Callable[..., Any])
# A group called without a command prints its help through this exception (click 8.2+).
NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())

EXIT_REFUSED = 2  # the command or its input: fix it
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: the database did not answer; the same command may work later
EXIT_CONFIG = 78  # EX_CONFIG: the settings do not fit the database; waiting will not mend it


def refuse(message: str, hint: str = "", status: int = EXIT_REFUSED) -> NoReturn:
    """Print ``error:`` (and ``hint:``) on stderr and exit with ``status``."""
    # One line each, whatever the message quotes (a server's error spans lines), so every
    # line a refusal prints starts with what it is.
    message = " ".join(line.strip() for line in message.splitlines())
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"hint: {hint}", err=True)
    sys.exit(status)


def usage_hint(err: click.UsageError) -> str:
    path = err.ctx.command_path if err.ctx is not None else "outbox"
    return f"see `{path} --help`"


def validation_message(err: ValidationError) -> str:
    """A pydantic error as one line per problem: ``field: what is wrong``."""
    problems = []
    for e in err.errors():
        where = ".".join(str(part) for part in e["loc"])
        text = str(e["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {text}" if where else text)
    return "; ".join(problems)


class OutboxGroup(click.Group):
    """A click group that reports every refusal as ``error:``/``hint:`` lines with the exit
    status that says what to do (its subgroups are OutboxGroups too, so the hint names the
    command that refused)."""

    group_class = type

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except NO_ARGS_IS_HELP:
            raise
        except click.UsageError as err:
            refuse(err.format_message(), usage_hint(err))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (DatabaseConfigError, MigrationsBehind) as err:
            refuse(err.args[0], err.hint, EXIT_CONFIG)
        except DatabaseUnavailable as err:
            refuse(err.args[0], err.hint, EXIT_TEMPFAIL)
        except OutboxError as err:
            refuse(err.args[0], err.hint)
        except psycopg.errors.UndefinedTable as err:
            refuse(
                f"the database has no outbox tables in schema {db.schema_name()!r}:"
                f" {str(err).splitlines()[0]}",
                "run `outbox db upgrade`, or set OUTBOX_SCHEMA to the schema it migrated",
                EXIT_CONFIG,
            )
        except psycopg.OperationalError as err:
            refuse(
                f"the database connection failed: {err}".strip(),
                "the server may be restarting: run the command again (what it had not"
                " committed was not written)",
                EXIT_TEMPFAIL,
            )
        except ValidationError as err:
            command = f"{ctx.command_path} {ctx.invoked_subcommand or ''}".strip()
            refuse(validation_message(err), f"see `{command} --help`")
        except NO_ARGS_IS_HELP:
            raise
        except click.UsageError as err:
            refuse(err.format_message(), usage_hint(err))


def read_json(text: str, what: str) -> Any:
    """Parse ``text`` as JSON that can be stored (``outbox.storable``: no NaN, NUL or nesting
    past its limit), or refuse naming ``what`` it was and what is wrong."""
    try:
        return storable.loads(text, what)
    except storable.NotStorable:
        raise
    except ValueError as err:
        raise InvalidInput(f"{what} is not JSON: {err}", hint="check its syntax") from err


def read_json_file(file: Any, what: str) -> Any:
    """Parse an open click file as JSON, or refuse naming the file."""
    try:
        text = file.read()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInput(f"{what} {file.name} cannot be read: {err}") from err
    return read_json(text, f"{what} {file.name}")


def inline_or_file(value: str, option: str) -> Any:
    """JSON given inline, or in a file as ``@path``, for ``option``."""
    if not value.startswith("@"):
        return read_json(value, option)
    try:
        text = Path(value[1:]).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInput(
            f"{option} {value}: cannot read the file: {err}",
            hint="give JSON inline, or @ followed by the path of a JSON file",
        ) from err
    return read_json(text, f"{option} {value}")


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


def format_fields(values: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()
    )
