"""``python -m bench.drain_cost [--calls N] [--concurrency K]``: what one call of the in-process
drain costs the database and the relay.

The drain of ``python -m bench`` (N no-op in-process calls, written by the writer API, drained
by one relay process with ``--concurrency K``), on an embedded PostgreSQL with
``pg_stat_statements`` (``bench.statements.server``). The statistics are reset at the relay's
first lease; when no ``tool_call`` or ``deliver_batch`` row is left, it prints per drained call:
the relay's and PostgreSQL's CPU (read with psutil, each process group whole), WAL bytes
(``pg_current_wal_lsn``), and per statement the relay ran (nested ones, ``top`` n, inside a
function or a foreign-key check) its calls, shared buffers, WAL and execution time. Buffers,
WAL and statements do not move with the machine's load; CPU and time do.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench import db as bdb
from bench import statements, throughput
from bench.__main__ import PYTHON_TOOL, seeded_template
from bench.seed import register_python_tool
from bench.throughput import REPO, stderr

LEASED = "EXISTS (SELECT 1 FROM outbox.outbox WHERE status = 'leased')"
LEFT = "EXISTS (SELECT 1 FROM outbox.outbox WHERE kind IN ('tool_call', 'deliver_batch'))"


def _cpu(processes: dict[int, psutil.Process]) -> dict[int, float]:
    seconds = {}
    for pid, process in processes.items():
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[pid] = times.user + times.system
    return seconds


def _tree(root: psutil.Process) -> dict[int, psutil.Process]:
    return {p.pid: p for p in [root, *root.children(recursive=True)]}


def _postmaster(url: str) -> psutil.Process:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
    assert row is not None
    parent = psutil.Process(row[0]).parent()
    assert parent is not None
    return parent


def _until(conn: psycopg.Connection[Any], condition: str, want: bool, relay: Any) -> None:
    while bool(conn.execute(f"SELECT {condition}").fetchone()[0]) is not want:  # type: ignore[index]
        if relay.poll() is not None:
            raise RuntimeError("the relay stopped; see its log")
        time.sleep(0.005)  # a drain check; the drain takes seconds


def measure(server: str, calls: int, concurrency: int, log: Path) -> dict[str, Any]:
    """Drain ``calls`` in-process calls once; the costs per call."""
    template = seeded_template(
        server,
        "cost_tpl",
        PYTHON_TOOL,
        calls,
        lambda url: register_python_tool(url, PYTHON_TOOL, "bench.tools:noop"),
    )
    postmaster = _postmaster(server)
    try:
        with bdb.scratch(server, "cost", template=template) as url:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                relay = throughput.start_relay(url, 1, concurrency, log)
                try:
                    _until(conn, LEASED, True, relay)
                    conn.execute("SELECT pg_stat_statements_reset()")
                    (wal_from,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
                    relays, servers = _tree(psutil.Process(relay.pid)), _tree(postmaster)
                    relay_from, server_from = _cpu(relays), _cpu(servers)
                    started = time.perf_counter()
                    while conn.execute(f"SELECT {LEFT}").fetchone()[0]:  # type: ignore[index]
                        for pid, process in _tree(postmaster).items():  # backends started since
                            if pid not in servers:
                                servers[pid], server_from[pid] = process, 0.0
                        time.sleep(0.05)  # a drain check
                    seconds = time.perf_counter() - started
                    relay_to, server_to = _cpu(relays), _cpu(servers)
                    (wal,) = conn.execute(  # type: ignore[misc]
                        "SELECT pg_current_wal_lsn() - %s::pg_lsn", [wal_from]
                    ).fetchone()
                    taken = list(statements.snapshot(url))
                finally:
                    throughput.stop_relay(relay)
            throughput.check_relay_outcome(url, calls)
    finally:
        bdb.drop(server, template)
    known = statements.names()
    rows: dict[tuple[str, bool], list[float]] = {}
    for query, toplevel, n, blocks, _returned, wal_bytes, ms in taken:
        text = statements.collapsed(query)
        if text.startswith("SELECT EXISTS (SELECT ? FROM outbox.outbox WHERE kind IN"):
            continue  # this bench's wait for the drain (LEFT)
        acc = rows.setdefault((statements.label(query, known), toplevel), [0, 0, 0, 0.0])
        for i, value in enumerate((n, blocks, wal_bytes, ms)):
            acc[i] += value
    top = [v for (_, toplevel), v in rows.items() if toplevel]
    return {
        "calls": calls,
        "concurrency": concurrency,
        "calls_per_s": round(calls / seconds),
        "relay_cpu_us": round(
            1e6 * sum(relay_to[p] - relay_from.get(p, 0.0) for p in relay_to) / calls, 1
        ),
        "postgres_cpu_us": round(
            1e6 * sum(server_to[p] - server_from.get(p, 0.0) for p in server_to) / calls, 1
        ),
        "wal_bytes": round(float(wal) / calls),
        "statements": round(sum(v[0] for v in top) / calls, 4),
        "buffers": round(sum(v[1] for v in top) / calls, 1),
        "exec_us": round(1000 * sum(v[3] for v in top) / calls, 1),
        "per_statement": sorted(
            (
                {
                    "statement": name,
                    "toplevel": toplevel,
                    "per_call": round(n / calls, 4),
                    "buffers": round(blocks / calls, 2),
                    "wal_bytes": round(wal_bytes / calls),
                    "exec_us": round(1000 * ms / calls, 2),
                }
                for (name, toplevel), (n, blocks, wal_bytes, ms) in rows.items()
            ),
            key=lambda s: -float(s["buffers"]),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=50_000, help="calls drained (50,000)")
    parser.add_argument("--concurrency", type=int, default=1000, help="the relay's (1000)")
    parser.add_argument("--top", type=int, default=25, help="statements listed (25)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    log = REPO / ".outbox-statements" / "relay.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    stderr(f"drain of {args.calls:,} in-process calls, --concurrency {args.concurrency}")
    out = measure(statements.server(), args.calls, args.concurrency, log)
    print(
        f"{out['calls_per_s']:,} calls/s; per call: relay CPU {out['relay_cpu_us']} us, "
        f"PostgreSQL CPU {out['postgres_cpu_us']} us, WAL {out['wal_bytes']:,} B, "
        f"statements {out['statements']}, buffers {out['buffers']}, "
        f"execution {out['exec_us']} us"
    )
    print(
        f"{'statement':<48} {'top':>3} {'per call':>9} {'buffers':>8} {'WAL B':>6} {'exec us':>8}"
    )
    for s in out["per_statement"][: args.top]:
        print(
            f"{s['statement'][:48]:<48} {'y' if s['toplevel'] else 'n':>3} {s['per_call']:>9} "
            f"{s['buffers']:>8} {s['wal_bytes']:>6} {s['exec_us']:>8}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
