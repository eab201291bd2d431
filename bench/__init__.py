"""``python -m bench``: the relay's throughput and latency beside a raw baseline and a peer.

Everything runs in one process tree against one PostgreSQL server (``OUTBOX_DATABASE_URL``
or the embedded one), and every measurement gets a scratch database of its own
(``bench_<name>``, migrated with Alembic, dropped afterwards), so measurements cannot leak
into each other and a crashed run leaves nothing behind that the next run trips over.

Design choices:

- Intents are seeded once with the writer API itself (``record_model_turn`` with large
  batches) into a template database; each relay measurement clones it with
  ``CREATE DATABASE ... TEMPLATE``. The rows are therefore exactly what a backend writes,
  and seeding is paid once, not once per process count.
- The relay runs as real processes (``python -m outbox.commands relay --processes P``), the way
  users run it. The clock starts when the first row is leased (interpreter start-up excluded)
  and stops when no ``tool_call`` row is left in the outbox.
- The baselines run the same number of no-op jobs: a raw psycopg ``SKIP LOCKED`` loop (the
  ceiling of the pattern on this machine) and PgQueuer with its asyncpg driver.
"""
