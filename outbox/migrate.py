"""Run the Alembic migrations programmatically (``outbox db upgrade`` and the test harness).

The history is package data of ``outbox.migrations``, found with ``importlib.resources``,
so an installed wheel migrates without a checkout. ``alembic.ini`` at the top of a checkout
points at the same folder for people who run ``alembic`` by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from outbox import db


@contextmanager
def _config(url: str, schema: str) -> Iterator[Config]:
    # as_file: the folder as a real path for Alembic (it already is one unless the package
    # was imported from a zip file, then it is extracted for the duration).
    with resources.as_file(resources.files("outbox.migrations")) as location:
        config = Config()
        config.set_main_option("script_location", str(location))
        config.attributes["url"] = url
        config.attributes["schema"] = schema
        yield config


def schema_sql(template: str) -> str:
    """Migration SQL with ``{s}`` replaced by the quoted name of the schema being migrated
    (inside an Alembic migration: the schema comes from the migration context)."""
    from alembic import op

    config = op.get_context().config
    assert config is not None, "schema_sql runs inside an Alembic migration"
    return template.replace("{s}", db.quote_ident(config.attributes["schema"]))


def run_sql(template: str) -> None:
    """Run migration SQL (``{s}`` substituted) exactly as written, on the psycopg
    connection under the migration's transaction: text such as ``':1'`` or ``'%s'`` is
    never taken for a bind parameter."""
    from alembic import op

    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.execute(schema_sql(template).encode())


def frozen_sql(migration_file: str, name: str) -> str:
    """The SQL file ``name`` kept beside a migration (``frozen_sql(__file__, "0002_views.sql")``):
    the text that revision applies, frozen when it was written."""
    return (Path(migration_file).parent / name).read_text()


def revisions() -> list[str]:
    """Every revision id, oldest first."""
    with _config("", "outbox") as config:
        script = ScriptDirectory.from_config(config)
        return [s.revision for s in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    with _config("", "outbox") as config:
        head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def upgrade(url: str | None = None, revision: str = "head", schema: str | None = None) -> None:
    with _config(url or db.database_url(), schema or db.schema_name()) as config:
        command.upgrade(config, revision)


def downgrade(url: str | None, revision: str, schema: str | None = None) -> None:
    with _config(url or db.database_url(), schema or db.schema_name()) as config:
        command.downgrade(config, revision)


def current(url: str | None = None, schema: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, pool
    from sqlalchemy.engine import Connection

    url = url or db.database_url()
    schema = schema or db.schema_name()
    engine = create_engine(db.sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as connection:
        conn: Connection = connection
        context = MigrationContext.configure(conn, opts={"version_table_schema": schema})
        rev = context.get_current_revision()
    engine.dispose()
    return rev
