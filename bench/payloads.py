"""``python -m bench.payloads [--calls N] [--bytes B] [--small B]``: what a completed tool
call costs in table bytes and WAL bytes, with its result inline and by reference, for
results of ``--bytes`` (64 KiB) that differ per call or are the same in every call, and for
small results (``--small``, 200 bytes: what it costs them).

Each case writes ``--calls`` (200) completed tool calls through the writer API into a fresh
database: a thread, a run, a model turn asking for one call (small arguments), the call's
result, the batch's delivery (the tool message), all in one transaction per call, as a
backend or the relay does. "inline" sets ``outbox.payload_inline_max`` past any body, so
every body stays in its row (the reference columns are NULL: they cost no byte); "by
reference" leaves the default (8192). Reported per call: the growth of every table of the
schema with its TOAST and indexes (``pg_total_relation_size``), the WAL written
(``pg_current_wal_lsn`` before and after, autovacuum off in the measured database: the
WAL position is the cluster's, so other work on the server adds to it), and the wall
time (a figure of this machine, not a target). Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

import psycopg

from bench import db as bdb
from outbox import db, registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn, ToolResultIn

TENANT = "bench"
WORDS = [f"w{i:03d}{'abcdefghij'[i % 10]}" for i in range(1000)]
INLINE_EVERYTHING = 1 << 30


def body(size: int, rng: random.Random) -> dict[str, Any]:
    """A JSON result of about ``size`` bytes of text: words of a small vocabulary (JSON an
    API answers compresses about as well)."""
    words: list[str] = []
    n = 0
    while n < size - 16:
        word = rng.choice(WORDS)
        words.append(word)
        n += len(word) + 1
    return {"text": " ".join(words)}


def schema_bytes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'outbox' AND c.relkind = 'r'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def one_call(conn: psycopg.Connection[Any], output: Any) -> None:
    thread = writer.create_thread(conn, TENANT)
    run = writer.start_run(
        conn,
        StartRun(tenant_id=TENANT, thread_id=thread.id, model="m", message="go", tools=["fetch"]),
    )
    writer.record_model_turn(
        conn,
        ModelTurnIn(
            tenant_id=TENANT,
            run_id=run.id,
            step_no=1,
            tool_calls=[ToolCallIn(tool_call_id="c1", name="fetch", arguments={"id": "7"})],
            input_tokens=10,
            output_tokens=5,
        ),
    )
    ref, batch = conn.execute(
        "SELECT id, batch_id FROM outbox.tool_calls WHERE run_id = %s", [run.id]
    ).fetchone() or (0, 0)
    writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output=output)
    )
    writer.deliver_batch(conn, batch)
    conn.commit()


def case(server: str, name: str, calls: int, size: int, same: bool, inline: bool) -> dict[str, Any]:
    rng = random.Random(7)
    shared = body(size, rng)
    with bdb.scratch(server, f"payloads_{name}") as url, psycopg.connect(url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(
                name="fetch", executor="http", endpoint="http://127.0.0.1:9/tools/fetch"
            ),
        )
        # No autovacuum in the measured database: its WAL would land in the figures.
        for (table,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'outbox' AND c.relkind = 'r'"
        ).fetchall():
            conn.execute(f"ALTER TABLE outbox.{table} SET (autovacuum_enabled = false)")
        conn.commit()
        if inline:
            conn.execute(f"SET outbox.payload_inline_max = '{INLINE_EVERYTHING}'")
        one_call(conn, body(size, rng))  # warm: first pages of every table and index
        conn.execute("CHECKPOINT")
        tables, lsn = schema_bytes(conn), wal_lsn(conn)
        conn.commit()
        started = time.perf_counter()
        for _ in range(calls):
            one_call(conn, shared if same else body(size, rng))
        wall = time.perf_counter() - started
        grown = schema_bytes(conn) - tables
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn]).fetchone()
        wal = int(row[0]) if row else 0
        stored = conn.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM outbox.payloads")
        bodies, body_bytes = stored.fetchone() or (0, 0)
        conn.commit()
    return {
        "case": name,
        "result_bytes": len(json.dumps(shared)),
        "same_body": same,
        "storage": "inline" if inline else "by reference",
        "calls": calls,
        "table_bytes_per_call": round(grown / calls),
        "wal_bytes_per_call": round(wal / calls),
        "ms_per_call": round(wall / calls * 1000, 2),
        "payload_rows": int(bodies),
        "payload_body_bytes": int(body_bytes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.payloads", description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--bytes", type=int, default=64 * 1024)
    parser.add_argument("--small", type=int, default=200)
    args = parser.parse_args(argv)
    server = db.database_url(start=True)
    results = []
    for name, size, same in (
        ("large_distinct", args.bytes, False),
        ("large_same", args.bytes, True),
        ("small", args.small, False),
    ):
        for inline in (True, False):
            label = f"{name}_{'inline' if inline else 'ref'}"
            print(f"{label} ...", file=sys.stderr, flush=True)
            results.append(case(server, label, args.calls, size, same, inline))
    print(
        "| case | result bytes | storage | table bytes/call | WAL bytes/call | ms/call "
        "| payload rows |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['case']} | {r['result_bytes']} | {r['storage']} | "
            f"{r['table_bytes_per_call']} | {r['wal_bytes_per_call']} | {r['ms_per_call']} | "
            f"{r['payload_rows']} |"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
