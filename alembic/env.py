"""Alembic environment: one migration history for the outbox schema.

The schema name is a setting (``OUTBOX_SCHEMA``), so migrations write DDL against
``{schema}`` placeholders and the version table lives inside that schema. The URL comes
from the caller (``outbox db upgrade`` passes it in ``config.attributes``) or the same
resolution the rest of the project uses.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from outbox import db, orm

config = context.config
schema: str = config.attributes.get("schema") or db.schema_name()
url: str = config.attributes.get("url") or db.database_url()


def run_migrations_online() -> None:
    engine = create_engine(db.sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {db.quote_ident(schema)}"))
        connection.commit()
        context.configure(
            connection=connection,
            target_metadata=orm.metadata_for(schema),
            version_table_schema=schema,
            include_schemas=False,
            transaction_per_migration=True,
        )
        context.config.attributes["schema"] = schema
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported: run against a database")
run_migrations_online()
