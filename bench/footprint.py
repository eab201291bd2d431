"""Footprint per completed tool call: journal rows, WAL bytes and table bytes.

``python -m bench.footprint [--runs N] [--per-turn K]`` (and a section of ``python -m
bench``): a fixed workload on a fresh database, in two phases measured apart:

* **write**: the backend's side, through the writer API: per run, a thread, the run, and
  one model turn asking for K calls of an in-process no-op tool (``bench.seed``, as a
  backend writes them);
* **relay**: one relay process executes every call and delivers every batch (results,
  fencing, journal, the tool messages, the submission, the next model turn enqueued).

Around each phase: ``pg_current_wal_lsn()`` (the WAL the server wrote; a CHECKPOINT first,
so each phase starts with the same full-page-image debt), ``pg_total_relation_size`` of
every table of the schema (heap, indexes, TOAST; a partitioned table through its
partitions), and the journal's rows by event. Each figure is divided by the number of
calls completed. The WAL of a phase is the whole server's; nothing else runs on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import psycopg

from bench import db as bdb
from bench import seed, throughput
from outbox import db

TOOL = "bench_noop"
RUNS = 500
PER_TURN = 4  # parallel calls per model turn: a typical agent turn, not the bench's 128


def _state(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()  # type: ignore[misc]
        tables: dict[str, Any] = dict(
            conn.execute(
                "SELECT coalesce(p.relname, c.relname), sum(pg_total_relation_size(c.oid)) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_inherits i ON i.inhrelid = c.oid "
                "LEFT JOIN pg_class p ON p.oid = i.inhparent "
                "WHERE n.nspname = 'outbox' AND c.relkind = 'r' GROUP BY 1"
            ).fetchall()
        )
        events: dict[str, int] = dict(
            conn.execute("SELECT event, count(*) FROM outbox.journal GROUP BY 1").fetchall()
        )
    return {"lsn": lsn, "tables": {k: int(v) for k, v in tables.items()}, "events": events}


def _wal_bytes(url: str, before: str, after: str) -> int:
    value = bdb.scalar(url, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", [after, before])
    return int(value)


def _phase(url: str, a: dict[str, Any], b: dict[str, Any], calls: int) -> dict[str, Any]:
    events = {
        e: (b["events"].get(e, 0) - a["events"].get(e, 0)) / calls
        for e in sorted(set(a["events"]) | set(b["events"]))
        if b["events"].get(e, 0) != a["events"].get(e, 0)
    }
    grown = {
        t: (b["tables"].get(t, 0) - a["tables"].get(t, 0)) / calls
        for t in sorted(set(a["tables"]) | set(b["tables"]))
        if b["tables"].get(t, 0) != a["tables"].get(t, 0)
    }
    return {
        "journal_rows": sum(events.values()),
        "journal_events": events,
        "wal_bytes": _wal_bytes(url, a["lsn"], b["lsn"]) / calls,
        "table_bytes": sum(grown.values()),
        "journal_bytes": grown.get("journal", 0.0),
        "tables": grown,
    }


def run(
    server: str, runs: int = RUNS, per_turn: int = PER_TURN, log: Path | None = None
) -> dict[str, Any]:
    """The workload on a fresh database; figures per completed tool call, per phase."""
    calls = runs * per_turn
    with bdb.scratch(server, "footprint") as url:
        seed.register_python_tool(url, TOOL, "bench.tools:noop")
        start = _state(url)
        seed.seed_calls(url, TOOL, calls, per_turn=per_turn)
        written = _state(url)
        throughput.drain_relay(url, calls, 1, None, log or Path("/dev/null"))
        throughput.check_relay_outcome(url, calls)
        drained = _state(url)
        write = _phase(url, start, written, calls)
        relay = _phase(url, written, drained, calls)
        total = _phase(url, start, drained, calls)
    return {
        "runs": runs,
        "per_turn": per_turn,
        "calls": calls,
        "write": write,
        "relay": relay,
        "total": total,
    }


def lines(result: dict[str, Any]) -> list[str]:
    """The markdown table of a ``run``: one row per phase, then the journal's events."""
    out = [
        f"Per completed tool call ({result['calls']:,} calls: {result['runs']:,} runs of one "
        f"turn of {result['per_turn']} calls, one relay process):",
        "",
        "| phase | journal rows | WAL bytes | table bytes | of which journal |",
        "|---|---:|---:|---:|---:|",
    ]
    for phase in ("write", "relay", "total"):
        f = result[phase]
        out.append(
            f"| {phase} | {f['journal_rows']:.2f} | {f['wal_bytes']:,.0f} | "
            f"{f['table_bytes']:,.0f} | {f['journal_bytes']:,.0f} |"
        )
    out += ["", "| journal event | rows per call |", "|---|---:|"]
    for event, n in sorted(result["total"]["journal_events"].items(), key=lambda e: -e[1]):
        out.append(f"| {event} | {n:.2f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__)
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs ({RUNS})")
    parser.add_argument("--per-turn", type=int, default=PER_TURN, help=f"calls a turn ({PER_TURN})")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    result = run(db.database_url(start=True), args.runs, args.per_turn)
    print("\n".join(lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
