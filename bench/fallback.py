"""``python -m bench.fallback [--runs N] [--relays P]``: N runs in flight while their
model's provider answers 503: every run completes on the fallback, how soon the circuit
opens, and the turns' latency during the outage.

Two ``bench.latency_server`` processes: the primary answers every model request 503 at
once (``--model-status 503``), the fallback answers after ``--model-latency`` seconds (a
tool call, then a final text, like ``bench.inflight``). N runs of the primary model are
queued, its fallback set (``outbox models fallback``, after ``--after`` failed attempts)
and its base URL's circuit left at its defaults (open after 5 failures within 10 s, probed
after 5 s); then ``outbox relay`` starts. Read from the database when every run completed:

- the turns recorded on each model (none may be on the primary) and turns recorded twice
  (must be 0);
- the requests the primary received: what the outage cost before the circuit opened, and
  the probes after;
- the time from the first failed call (the first ``model_turn.retry_scheduled`` naming the
  primary) to the circuit's ``model.circuit_opened``, both by the database's clock; 0 when
  the transaction that records the first failures opens the circuit (it journals the
  opening before the failures' retries);
- the turn latency: from the message a turn answers (the user's, or the tool result; for
  the first turns, queued before the relay started, from the relay's first failed call) to
  the turn's assistant message, p50/p95/max over every turn of the outage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench import db as bdb
from bench import seed
from bench.inflight import TOOL, LatencyServer, settle_sockets, start_runs
from bench.throughput import REPO, stderr
from outbox import db, routing
from outbox.sql import Queries

FALLBACK = "bench-fallback"

FIGURES = """
WITH t0 AS (
    SELECT min(at) AS at FROM outbox.journal WHERE event = 'model_turn.retry_scheduled'
), gaps AS (
    SELECT m.created_at - greatest((SELECT at FROM t0),
                                   lag(m.created_at) OVER (PARTITION BY m.thread_id
                                                           ORDER BY m.seq)) AS gap,
           m.role,
           lag(m.role) OVER (PARTITION BY m.thread_id ORDER BY m.seq) AS answers
    FROM outbox.messages m
)
SELECT (SELECT count(*) FROM outbox.runs WHERE status = 'completed') AS completed,
       (SELECT count(*) FROM outbox.model_turns WHERE model = %(fallback)s) AS on_fallback,
       (SELECT count(*) FROM outbox.model_turns WHERE model IS DISTINCT FROM %(fallback)s)
           AS on_primary,
       (SELECT count(*) FROM (SELECT 1 FROM outbox.model_turns GROUP BY run_id, step_no
                              HAVING count(*) > 1) d) AS recorded_twice,
       (SELECT extract(epoch FROM o.at - least(o.at, f.at))
        FROM (SELECT min(at) AS at FROM outbox.journal WHERE event = 'model.circuit_opened') o,
             (SELECT min(at) AS at FROM outbox.journal
              WHERE event = 'model_turn.retry_scheduled'
                AND detail->>'base_url' = %(primary)s) f) AS open_after_s,
       (SELECT count(*) FROM outbox.journal WHERE event = 'model.circuit_probe') AS probes,
       (SELECT extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY gap))
        FROM gaps WHERE role = 'assistant') AS turn_p50_s,
       (SELECT extract(epoch FROM percentile_cont(0.95) WITHIN GROUP (ORDER BY gap))
        FROM gaps WHERE role = 'assistant') AS turn_p95_s,
       (SELECT extract(epoch FROM max(gap)) FROM gaps WHERE role = 'assistant') AS turn_max_s,
       (SELECT extract(epoch FROM percentile_cont(0.95) WITHIN GROUP (ORDER BY gap))
        FROM gaps WHERE role = 'assistant' AND answers = 'tool') AS after_tools_p95_s
"""
STATE_READS = 2000  # reads of the routing state timed (relay/queries/relay.sql)


def state_read_us(url: str) -> float:
    """Median microseconds of the preparer's read of fallbacks and circuits
    (``model_routing_state``), one per batch of turns, with the outage's rows in place."""
    query = Queries(REPO / "relay" / "queries" / "relay.sql", "outbox").model_routing_state
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(STATE_READS):
            started = time.perf_counter()
            conn.execute(query).fetchone()
            times.append(time.perf_counter() - started)
    times.sort()
    return round(1e6 * times[len(times) // 2], 1)


def measure(
    server: str, runs: int, relays: int, model_s: float, tool_s: float, after: int
) -> dict[str, Any]:
    settle_sockets()
    primary = LatencyServer(model_s, tool_s, 1, model_status=503)
    backup = LatencyServer(model_s, tool_s, 1)
    try:
        with bdb.scratch(server, f"fallback_{runs}") as url:
            seed.register_http_tool(url, TOOL, backup.url + "/tools/" + TOOL, timeout_s=60)
            with psycopg.connect(url) as conn:
                routing.set_fallback(
                    conn, "bench", FALLBACK, to_base_url=backup.url + "/v1", after_attempts=after
                )
                conn.commit()
            start_runs(url, runs, primary.url + "/v1")
            env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
            command = [sys.executable, "-m", "outbox.commands", "relay", "--log-level", "WARNING"]
            command += ["--processes", str(relays)]
            log_path = REPO / "bench" / "results" / "fallback-relay.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            with open(log_path, "ab") as log:
                relay = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
            try:
                deadline = time.monotonic() + 600
                while bdb.scalar(
                    url, "SELECT count(*) FROM outbox.runs WHERE status <> 'completed'"
                ):
                    if relay.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the runs did not complete; see {log_path}")
                    time.sleep(0.1)
                wall = time.perf_counter() - started
            finally:
                relay.terminate()
                relay.wait(timeout=60)
            with psycopg.connect(url, autocommit=True) as conn:
                cur = conn.execute(FIGURES, {"fallback": FALLBACK, "primary": primary.url + "/v1"})
                names = [c.name for c in cur.description or []]
                row = cur.fetchone()
                assert row is not None
                figures = dict(zip(names, row, strict=True))
            figures["state_read_us"] = state_read_us(url)
        figures.update(
            runs=runs,
            relays=relays,
            wall_s=round(wall, 2),
            primary_requests=primary.stats()["model_requests"],
            fallback_requests=backup.stats()["model_requests"],
        )
    finally:
        primary.close()
        backup.close()
    return {k: round(float(v), 3) if not isinstance(v, int) else v for k, v in figures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fallback", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--relays", type=int, default=1, help="relay processes")
    parser.add_argument("--model-latency", type=float, default=0.5, help="the fallback's")
    parser.add_argument("--tool-latency", type=float, default=0.2)
    parser.add_argument("--after", type=int, default=2, help="failed attempts to fall back")
    args = parser.parse_args(argv)
    server = db.database_url(start=True)
    stderr(f"{args.runs} runs, primary down ...")
    r = measure(server, args.runs, args.relays, args.model_latency, args.tool_latency, args.after)
    print(
        "| runs | completed | on fallback | on primary | recorded twice | primary requests "
        "| circuit open after (s) | probes | turn p50 (s) | turn p95 (s) | turn max (s) "
        "| p95 after tool results (s) | wall (s) | state read (µs) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {r['runs']} | {r['completed']} | {r['on_fallback']} | {r['on_primary']} "
        f"| {r['recorded_twice']} | {r['primary_requests']} | {r['open_after_s']} "
        f"| {r['probes']} | {r['turn_p50_s']} | {r['turn_p95_s']} | {r['turn_max_s']} "
        f"| {r['after_tools_p95_s']} | {r['wall_s']} | {r['state_read_us']} |"
    )
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
