"""Migrations go up, down and up again, and the models equal the migrated schema."""

from __future__ import annotations

import re

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, pool

from outbox import db, migrate, orm

# The journal's partitions (0036): made by the database at runtime, never by the models.
PARTITION = re.compile(r"^journal_(\d{8}|upto_\d{8}|default)$")


def tables(url: str, schema: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_downgrade_upgrade(empty_db_url):
    migrate.upgrade(empty_db_url, schema="outbox")
    assert {"runs", "outbox", "journal", "tool_calls"} <= tables(empty_db_url, "outbox")
    migrate.downgrade(empty_db_url, "base", schema="outbox")
    assert tables(empty_db_url, "outbox") == {"alembic_version"}
    migrate.upgrade(empty_db_url, schema="outbox")
    assert migrate.current(empty_db_url, schema="outbox") == migrate.head_revision()


def test_models_equal_the_migrated_schema(empty_db_url):
    migrate.upgrade(empty_db_url, schema="outbox")
    diff = _diff(empty_db_url, "outbox")
    assert diff == [], diff


def test_custom_schema_name(empty_db_url):
    migrate.upgrade(empty_db_url, schema="agents")
    assert "runs" in tables(empty_db_url, "agents")
    assert _diff(empty_db_url, "agents") == []


def _diff(url: str, schema: str) -> list[object]:
    engine = create_engine(db.sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "version_table_schema": schema,
                "include_name": lambda name, type_, _parent: (
                    (type_ != "schema" or name == schema)
                    and not (type_ == "table" and PARTITION.match(name or ""))
                ),
            },
        )
        diff = compare_metadata(context, orm.metadata_for(schema))
    engine.dispose()
    return [d for d in diff if not (isinstance(d, tuple) and "alembic_version" in str(d))]
