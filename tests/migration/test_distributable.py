"""The schema stays distributable by tenant (docs/scale.md): every primary key, unique
constraint, unique index and foreign key of a table that is to be distributed by
``tenant_id`` includes it, paired with the referenced table's ``tenant_id``. The tables
exempt are the reference tables of ``bench.citus.REFERENCE_TABLES`` (copied to every node);
a new table is distributed unless it is listed there, and one without ``tenant_id`` must be.
"""

from __future__ import annotations

from typing import Any

import psycopg

from bench.citus import REFERENCE_TABLES

SCHEMA = "outbox"

TABLES = """
SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                          AND a.attname = 'tenant_id' AND NOT a.attisdropped)
FROM pg_class c
WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""
# Unique indexes, whether a constraint's or not, with their key columns' names.
UNIQUE = """
SELECT t.relname, i.relname,
       ARRAY(SELECT a.attname::text FROM unnest(x.indkey) k
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relnamespace = %(s)s::regnamespace AND x.indisunique AND NOT t.relispartition
"""
# Foreign keys, with their columns and the referenced columns, paired in order.
FOREIGN = """
SELECT t.relname, c.conname, r.relname,
       ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i),
       ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i)
FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_class r ON r.oid = c.confrelid
WHERE c.contype = 'f' AND c.connamespace = %(s)s::regnamespace AND c.conparentid = 0
"""


def distributed(conn: psycopg.Connection[Any]) -> set[str]:
    tables = dict(conn.execute(TABLES, {"s": SCHEMA}).fetchall())
    untenanted = sorted(t for t, tenant in tables.items() if not tenant)
    unlisted = [t for t in untenanted if t not in REFERENCE_TABLES]
    assert unlisted == [], (
        f"tables without tenant_id: {unlisted}; give each a tenant_id, or list it in "
        "bench.citus.REFERENCE_TABLES with the reason it is copied to every node"
    )
    return {t for t, tenant in tables.items() if tenant and t not in REFERENCE_TABLES}


def test_every_unique_key_of_a_distributed_table_includes_tenant_id(
    conn: psycopg.Connection[Any],
) -> None:
    tables = distributed(conn)
    missing = sorted(
        f"{table}.{index} {columns}"
        for table, index, columns in conn.execute(UNIQUE, {"s": SCHEMA}).fetchall()
        if table in tables and "tenant_id" not in columns
    )
    assert missing == [], (
        "a unique key of a table distributed by tenant_id must include tenant_id "
        f"(docs/scale.md): {missing}"
    )


def test_every_foreign_key_between_distributed_tables_pairs_tenant_id(
    conn: psycopg.Connection[Any],
) -> None:
    tables = distributed(conn)
    wrong = []
    for table, name, target, columns, referenced in conn.execute(FOREIGN, {"s": SCHEMA}):
        if table not in tables:
            # A reference table's key may not point into a distributed table.
            if target in tables:
                wrong.append(f"{table}.{name}: a reference table referencing {target}")
            continue
        if target in tables and ("tenant_id", "tenant_id") not in zip(
            columns, referenced, strict=True
        ):
            wrong.append(f"{table}.{name} {columns} -> {target} {referenced}")
    assert wrong == [], (
        "a foreign key between tables distributed by tenant_id must pair tenant_id with "
        f"tenant_id (docs/scale.md): {wrong}"
    )
