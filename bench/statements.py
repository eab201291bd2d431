"""``python -m bench.statements [CASES]``: what each statement costs per run and per call as
the runs in flight grow.

Wall-clock and CPU figures move with the machine's load; buffers and rows do not. This runs
the cases of ``bench.inflight`` (``RUNS:M:T:K``, default ``1000:1:0.2:2,10000:10:1:2``) on an
embedded PostgreSQL of its own (``$OUTBOX_HOME``, default ``.outbox-statements``) started with
``pg_stat_statements`` preloaded, resets the statistics at the relay's first lease, and prints
for every statement the relay ran until the last run completed: its name (the ``-- name:``
of the query files, or the start of its text), calls per run, shared buffers (hit + read)
and rows per call, WAL bytes per run, and whether it ran at the top level or inside a
function (``pg_stat_statements.track = all``: a top-level call's buffers include those of
the statements of the functions it calls). ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench import db as bdb
from bench import inflight
from bench.throughput import REPO, stderr
from outbox.sql import parse

DEFAULT_CASES = "1000:1:0.2:2,10000:10:1:2"
QUERY_DIRS = ("relay/queries", "outbox/queries", "server/queries", "sql")
SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "10000",
}
STATS = """
SELECT s.query, s.toplevel, sum(s.calls)::bigint,
       sum(s.shared_blks_hit + s.shared_blks_read)::bigint, sum(s.rows)::bigint,
       sum(s.wal_bytes)::bigint, sum(s.total_exec_time)::float8
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY s.query, s.toplevel
"""


def server() -> str:
    """The URL of this bench's own embedded server, with pg_stat_statements loaded."""
    home = Path(os.environ.get("OUTBOX_HOME") or REPO / ".outbox-statements")
    return bdb.own_server(home, SETTINGS)


def collapsed(text: str) -> str:
    """``text`` without comments, its whitespace collapsed, its parameters as ``?``."""
    text = re.sub(r"--[^\n]*", "", text)
    text = re.sub(r"%\(\w+\)s|\$\d+", "?", text)
    return re.sub(r"\s+", " ", text).strip()


def names() -> dict[str, str]:
    """The start of each named query's text (up to its first parameter) -> file:name."""
    found: dict[str, str] = {}
    for folder in QUERY_DIRS:
        for path in sorted((REPO / folder).glob("*.sql")):
            text = path.read_text().replace("{s}", '"outbox"')
            for name, body in parse(text).items():
                start = collapsed(body).split("?")[0][:120]
                if len(start) >= 20:
                    found.setdefault(start, f"{path.stem}:{name}")
    return found


def label(query: str, known: dict[str, str]) -> str:
    text = collapsed(query)
    matches = [start for start in known if text.startswith(start)]
    if matches:
        return known[max(matches, key=len)]
    return text[:70]


def snapshot(url: str) -> Iterator[tuple[str, bool, int, int, int, int, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        for row in conn.execute(STATS):
            calls, blocks, returned, wal = (int(x or 0) for x in row[2:6])
            yield str(row[0]), bool(row[1]), calls, blocks, returned, wal, float(row[6])


def measure_case(
    server_url: str, runs: int, model_s: float, tool_s: float, calls: int, log: Path
) -> dict[str, Any]:
    """One case of bench.inflight; its figures and its statements' costs."""
    watch = inflight._watch
    taken: list[tuple[str, bool, int, int, int, int, float]] = []

    def watched(url: str, relay: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            inflight._until(
                conn,
                "EXISTS (SELECT 1 FROM outbox.outbox WHERE status = 'leased')",
                relay,
                log,
            )
        reset(url)
        figures = watch(url, relay, *args, **kwargs)
        taken.extend(snapshot(url))
        return figures

    inflight._watch = watched
    try:
        concurrency = inflight.concurrency_for(runs, calls)
        figures = inflight.measure(server_url, runs, model_s, tool_s, calls, concurrency, log)
    finally:
        inflight._watch = watch
    return {"figures": figures, "statements": costs(taken, runs)}


def reset(url: str) -> None:
    """Statistics from now on (the extension made if it is not)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


def costs(
    taken: list[tuple[str, bool, int, int, int, int, float]], runs: int
) -> list[dict[str, Any]]:
    """Per statement (by name), what it cost per run and per call, the most buffers first."""
    known = names()
    rows: dict[tuple[str, bool], list[float]] = {}
    for query, toplevel, n, blocks, returned, wal, ms in taken:
        key = (label(query, known), toplevel)
        acc = rows.setdefault(key, [0, 0, 0, 0, 0.0])
        for i, value in enumerate((n, blocks, returned, wal, ms)):
            acc[i] += value
    statements = [
        {
            "statement": name,
            "toplevel": toplevel,
            "calls_per_run": round(n / runs, 3),
            "buffers_per_call": round(blocks / n, 1) if n else 0,
            "rows_per_call": round(returned / n, 1) if n else 0,
            "wal_bytes_per_run": round(wal / runs),
            "exec_ms_per_run": round(ms / runs, 3),
        }
        for (name, toplevel), (n, blocks, returned, wal, ms) in rows.items()
    ]
    statements.sort(key=lambda s: -float(s["buffers_per_call"]) * float(s["calls_per_run"]))
    return statements


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.statements")
    parser.add_argument("cases", nargs="?", default=DEFAULT_CASES)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    url = server()
    log = REPO / ".outbox-statements" / "relay.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for case in args.cases.split(","):
        runs, model_s, tool_s, calls = case.split(":")
        stderr(f"case {case}")
        result = measure_case(url, int(runs), float(model_s), float(tool_s), int(calls), log)
        out.append({"case": case, **result})
        figures = result["figures"]
        print(
            f"\n{case}: wall {figures['wall_s']} s ({figures['vs_ideal']}x), "
            f"relay {figures['cpu_ms_per_run']} ms/run, "
            f"{figures['kb_per_run_in_flight']} kB/run in flight, "
            f"{figures['duplicates']} duplicates"
        )
        print(
            f"{'statement':<44} {'top':>3} {'calls/run':>9} {'buf/call':>9} "
            f"{'rows/call':>9} {'WAL B/run':>9} {'buf/run':>9}"
        )
        for s in result["statements"][: args.top]:
            print(
                f"{s['statement'][:44]:<44} {'y' if s['toplevel'] else 'n':>3} "
                f"{s['calls_per_run']:>9} {s['buffers_per_call']:>9} {s['rows_per_call']:>9} "
                f"{s['wal_bytes_per_run']:>9} "
                f"{round(s['buffers_per_call'] * s['calls_per_run'], 1):>9}"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
