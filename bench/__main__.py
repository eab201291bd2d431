"""``python -m bench [--quick] [--calls N] [--json PATH]``: run every measurement, print
the markdown table on stdout (progress on stderr), keep JSON and a PNG in bench/results/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench import db as bdb
from bench import (
    fairness,
    footprint,
    http,
    inflight,
    mcp,
    notify,
    poster,
    report,
    seed,
    serve,
    throughput,
    tracing,
)
from bench.throughput import stderr
from outbox import db

PYTHON_TOOL = "bench_noop"
HTTP_TOOL = "noop"
SEED_PROCESSES = 4  # writer processes seeding the template


FAIRNESS_TOOL_S = 0.5  # seconds each call of the backlog takes
POSTER_AT_ONCE = 400  # requests open at once when the HTTP clients' CPU is measured


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small numbers (about a minute)")
    parser.add_argument("--calls", type=int, help="in-process calls to drain (200,000)")
    parser.add_argument("--http-calls", type=int, help="HTTP tool calls per run (10,000)")
    parser.add_argument("--processes", default="1,2,4", help="relay process counts")
    parser.add_argument(
        "--concurrency",
        type=int,
        help="the relays' --concurrency (default: theirs, derived from each machine's limits)",
    )
    parser.add_argument("--latency-intents", type=int, help="intents for the latency (500)")
    parser.add_argument("--notify-commits", type=int, help="commits per writer thread (250)")
    parser.add_argument(
        "--inflight",
        default=None,
        help="runs-in-flight cases RUNS:M:T:K, comma-separated "
        "(2000:2:0.5:2,10000:10:1:2; --quick: 200:1:0.2:2); 'none' skips them",
    )
    parser.add_argument(
        "--fairness-backlog",
        type=int,
        help="calls of one tenant queued ahead of another's (10,000; --quick: 1,000; 0 skips)",
    )
    parser.add_argument(
        "--serve-runs",
        type=int,
        help="runs started through outbox serve and through the writer API (500; --quick: "
        "100; 0 skips)",
    )
    parser.add_argument(
        "--poster-requests",
        type=int,
        help="POSTs through the relay's HTTP client and httpx2's, for CPU per request "
        "(8,000; --quick: 1,000; 0 skips)",
    )
    parser.add_argument(
        "--mcp-calls",
        type=int,
        help="MCP calls one at a time beside HTTP tool calls, then that many x2 in flight "
        "(500; --quick: 100; 0 skips)",
    )
    parser.add_argument(
        "--tracing",
        default=None,
        help="the runs-in-flight case RUNS:M:T:K run with tracing off and on, alternately "
        "(2000:2:0.5:2; --quick: 200:1:0.2:2); 'none' skips it",
    )
    parser.add_argument("--tracing-rounds", type=int, help="measurements each way (3; --quick: 1)")
    parser.add_argument(
        "--footprint-runs",
        type=int,
        help="runs of one turn of 4 calls for journal rows, WAL and table bytes per call "
        "(500; --quick: 100; 0 skips)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    quick = args.quick
    args.calls = args.calls or (5_000 if quick else 200_000)
    args.http_calls = args.http_calls or min(args.calls, 1_000 if quick else 10_000)
    args.latency_intents = args.latency_intents or (100 if quick else 500)
    args.notify_commits = args.notify_commits or (25 if quick else 250)
    if args.poster_requests is None:
        args.poster_requests = 1_000 if quick else 8_000
    args.process_counts = [int(p) for p in args.processes.split(",")]
    if args.fairness_backlog is None:
        args.fairness_backlog = 1_000 if quick else 10_000
    if args.mcp_calls is None:
        args.mcp_calls = 100 if quick else 500
    if args.serve_runs is None:
        args.serve_runs = 100 if quick else 500
    if args.footprint_runs is None:
        args.footprint_runs = 100 if quick else footprint.RUNS
    cases = args.inflight or ("200:1:0.2:2" if quick else "2000:2:0.5:2,10000:10:1:2")
    args.inflight_cases = (
        []
        if cases == "none"
        else [
            (int(r), float(m), float(t), int(k))
            for r, m, t, k in (case.split(":") for case in cases.split(","))
        ]
    )
    traced = args.tracing or ("200:1:0.2:2" if quick else "2000:2:0.5:2")
    args.tracing_case = None
    if traced != "none":
        r, m, t, k = traced.split(":")
        args.tracing_case = (int(r), float(m), float(t), int(k))
    args.tracing_rounds = args.tracing_rounds or (1 if quick else 3)
    return args


def seeded_template(server: str, name: str, tool: str, calls: int, register: Any) -> str:
    """A database holding ``calls`` writer-made intents of ``tool``; returns its name."""
    url = bdb.create(server, bdb.name_for(name))
    register(url)
    seed.seed_calls(
        url,
        tool,
        calls,
        processes=SEED_PROCESSES if calls >= 2_000 else 1,
        progress=seed.progress_printer(f"seeding {name}", calls),
    )
    with bdb.admin(url) as conn:
        # The step-1 model turns are a model relay's work, which is not measured here.
        conn.execute("DELETE FROM outbox.outbox WHERE kind = 'model_turn'")
        conn.execute("VACUUM ANALYZE")
    return bdb.name_for(name)


def relay_overhead(server: str, args: argparse.Namespace, log: Path, out: dict[str, Any]) -> None:
    n = args.calls
    template = seeded_template(
        server,
        "tpl",
        PYTHON_TOOL,
        n,
        lambda url: seed.register_python_tool(url, PYTHON_TOOL, "bench.tools:noop"),
    )
    try:
        for p in args.process_counts:
            with bdb.scratch(server, f"relay_{p}", template=template) as url:
                drain = throughput.drain_relay(url, n, p, args.concurrency, log)
                throughput.check_relay_outcome(url, n)
            out["relay"][str(p)] = drain.rate
            stderr(f"  relay, {p} process(es): {drain.rate:,.0f} calls/s ({drain.seconds:.1f} s)")
    finally:
        bdb.drop(server, template)
    for p in args.process_counts:
        with bdb.scratch(server, f"raw_{p}", migrated=False) as url:
            drain = throughput.drain_raw(url, n, p)
        out["raw"][str(p)] = drain.rate
        stderr(f"  raw loop, {p} process(es): {drain.rate:,.0f} rows/s")
    try:
        with bdb.scratch(server, "pgqueuer", migrated=False) as url:
            drain = throughput.drain_pgqueuer(url, n)
        out["pgqueuer"] = drain.rate
        stderr(f"  PgQueuer: {drain.rate:,.0f} jobs/s")
    except ImportError:
        stderr("  PgQueuer is not installed: pip install -e '.[bench]'")


def end_to_end(server: str, args: argparse.Namespace, log: Path, out: dict[str, Any]) -> None:
    n = args.http_calls
    tools = http.ToolServer()
    out["http"] = {"calls": n, "relay": {}, "server": {}}
    try:
        template = seeded_template(
            server,
            "http_tpl",
            HTTP_TOOL,
            n,
            lambda url: seed.register_http_tool(url, HTTP_TOOL, tools.endpoint(), timeout_s=30),
        )
        try:
            for p in args.process_counts:
                tools.reset()
                with bdb.scratch(server, f"http_{p}", template=template) as url:
                    concurrency = args.concurrency or http.RELAY_CONCURRENCY
                    drain = throughput.drain_relay(url, n, p, concurrency, log)
                    throughput.check_relay_outcome(url, n)
                alone = http.server_alone(tools, n, p, args.concurrency or http.CLIENTS)
                out["http"]["relay"][str(p)] = drain.rate
                out["http"]["server"][str(p)] = alone.rate
                stderr(
                    f"  http, {p} process(es): relay {drain.rate:,.0f}/s, "
                    f"server alone {alone.rate:,.0f}/s"
                )
        finally:
            bdb.drop(server, template)
        with bdb.scratch(server, "latency") as url:
            out["latency_rate"] = 50.0
            out["latency"] = http.latency(url, tools, args.latency_intents, 50.0, log)
        stderr(
            f"  latency: p50 {out['latency']['p50_ms']:.1f} ms, "
            f"p99 {out['latency']['p99_ms']:.1f} ms"
        )
    finally:
        tools.close()


def notify_cost(server: str, args: argparse.Namespace, out: dict[str, Any]) -> None:
    threads = 8
    with bdb.scratch(server, "notify") as url:
        seed.register_python_tool(url, PYTHON_TOOL, "bench.tools:noop")
        off = notify.commits_per_s(url, PYTHON_TOOL, threads, args.notify_commits, False)
        on = notify.commits_per_s(url, PYTHON_TOOL, threads, args.notify_commits, True)
    out["notify"] = {"threads": threads, "on": on, "off": off}
    stderr(f"  NOTIFY: on {on:,.0f} commits/s, off {off:,.0f} commits/s")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    server = db.database_url(start=True)
    report.RESULTS.mkdir(exist_ok=True)
    log = report.RESULTS / f"relay-{stamp}.log"
    out: dict[str, Any] = {
        "calls": args.calls,
        "processes": args.process_counts,
        "concurrency": args.concurrency,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "server": _server_version(server),
        "relay": {},
        "raw": {},
    }
    started = time.monotonic()
    stderr(f"relay overhead: {args.calls:,} calls")
    relay_overhead(server, args, log, out)
    stderr(f"end to end over HTTP: {args.http_calls:,} calls")
    end_to_end(server, args, log, out)
    stderr("NOTIFY cost")
    notify_cost(server, args, out)
    if args.footprint_runs:
        stderr(f"footprint: {args.footprint_runs:,} runs of {footprint.PER_TURN} calls")
        out["footprint"] = footprint.run(server, args.footprint_runs, log=log)
    out["inflight"] = inflight.run_cases(server, args.inflight_cases, log)
    if args.tracing_case is not None:
        out["tracing"] = tracing.run_case(server, args.tracing_case, args.tracing_rounds, log)
    if args.fairness_backlog:
        out["fairness"] = fairness.run(server, args.fairness_backlog, FAIRNESS_TOOL_S, log)
    if args.serve_runs:
        out["serve"] = serve.run(server, args.serve_runs)
    if args.poster_requests:
        stderr(f"HTTP client: {args.poster_requests:,} POSTs per client")
        out["poster"] = poster.run(args.poster_requests, POSTER_AT_ONCE)
    if args.mcp_calls:
        stderr(f"MCP tools: {args.mcp_calls:,} calls, then {2 * args.mcp_calls:,} in flight")
        out["mcp"] = {
            answers: mcp.run(args.mcp_calls, 2 * args.mcp_calls, 1.0, answers)
            for answers in ("sse", "json", "raw")
        }
    out["seconds"] = round(time.monotonic() - started, 1)
    table = report.markdown(out)
    print(table)
    if not args.no_chart:
        json_path, png = report.write(out, stamp)
        stderr(f"results: {json_path}" + (f", {png}" if png else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _server_version(server: str) -> str:
    return str(bdb.scalar(server, "SHOW server_version"))


if __name__ == "__main__":
    sys.exit(main())
