"""Run the Alembic migrations programmatically (``outbox db upgrade`` and the test harness)."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command
from outbox import db

ALEMBIC_DIR = Path(__file__).resolve().parent.parent / "alembic"


def _config(url: str, schema: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    config.attributes["url"] = url
    config.attributes["schema"] = schema
    return config


def schema_sql(template: str) -> str:
    """Migration SQL with ``{s}`` replaced by the quoted name of the schema being migrated
    (inside an Alembic migration: the schema comes from the migration context)."""
    from alembic import op

    config = op.get_context().config
    assert config is not None, "schema_sql runs inside an Alembic migration"
    return template.replace("{s}", db.quote_ident(config.attributes["schema"]))


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config("", "outbox")).get_current_head()
    assert head is not None
    return head


def upgrade(url: str | None = None, revision: str = "head", schema: str | None = None) -> None:
    command.upgrade(_config(url or db.database_url(), schema or db.schema_name()), revision)


def downgrade(url: str | None, revision: str, schema: str | None = None) -> None:
    command.downgrade(_config(url or db.database_url(), schema or db.schema_name()), revision)


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
