"""Run the Alembic migrations programmatically (``outbox db upgrade`` and the test harness).

The history is package data (``outbox.revisions`` finds it), so an installed wheel migrates
without a checkout. ``alembic.ini`` at the top of a checkout points at the same folder for
people who run ``alembic`` by hand.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command

from outbox import db
from outbox.revisions import alembic_config

# The migrations' revisions, read from the history (outbox.revisions), beside the upgrade
# they name: `outbox db` and the tests ask this module for both.
from outbox.revisions import head_revision as head_revision
from outbox.revisions import revisions as revisions


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


def upgrade(url: str | None = None, revision: str = "head", schema: str | None = None) -> None:
    with alembic_config(url or db.database_url(), schema or db.schema_name()) as config:
        command.upgrade(config, revision)


def downgrade(url: str | None, revision: str, schema: str | None = None) -> None:
    with alembic_config(url or db.database_url(), schema or db.schema_name()) as config:
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
