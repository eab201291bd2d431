"""The benchmark's outputs: a markdown table with ratios, JSON, and a PNG chart."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from bench import footprint

RESULTS = Path(__file__).resolve().parent / "results"


def fmt(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def markdown(results: dict[str, Any]) -> str:
    """The table printed to stdout and kept in ``docs/benchmarks.md``."""
    lines: list[str] = []
    relay = results["relay"]
    raw = results["raw"]
    pgq = results.get("pgqueuer")
    n = results["calls"]
    lines += [
        f"### Relay overhead: drain {n:,} in-process tool calls (per second)",
        "",
        "| processes | relay | raw SKIP LOCKED loop | PgQueuer 1.6 "
        "| relay / raw | relay / PgQueuer |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for p in results["processes"]:
        r, b = relay.get(str(p)), raw.get(str(p))
        q = pgq if p == 1 else None
        lines.append(f"| {p} | {fmt(r)} | {fmt(b)} | {fmt(q)} | {ratio(r, b)} | {ratio(r, pgq)} |")
    lines += ["", "Targets: relay ≥ 0.5x raw, ≥ 1.5x PgQueuer (one queue manager, batch 100).", ""]
    http = results.get("http")
    if http:
        lines += [
            f"### End to end over HTTP: {http['calls']:,} calls to a no-op tool (per second)",
            "",
            "| processes | relay | tool server alone | relay / server |",
            "|---:|---:|---:|---:|",
        ]
        for p in results["processes"]:
            r, s = http["relay"].get(str(p)), http["server"].get(str(p))
            lines.append(f"| {p} | {fmt(r)} | {fmt(s)} | {ratio(r, s)} |")
        lines += ["", "Target: relay ≥ 60 % of the tool server's own rate.", ""]
    latency = results.get("latency")
    if latency:
        lines += [
            f"### Latency: intent commit → tool request ({int(latency['n'])} intents at "
            f"{results['latency_rate']:.0f}/s, NOTIFY on, 1 process)",
            "",
            "| p50 | p99 | max |",
            "|---:|---:|---:|",
            f"| {latency['p50_ms']:.1f} ms | {latency['p99_ms']:.1f} ms | "
            f"{latency['max_ms']:.1f} ms |",
            "",
            "Target: p50 ≤ 3 ms, p99 ≤ 10 ms.",
            "",
        ]
    inflight = results.get("inflight")
    if inflight:
        lines += [
            "### Runs in flight: model turn (M) → K tool calls (T) → model turn, 1 relay process",
            "",
            "| runs | M | T | K | wall | ideal 2M+T | ideal / wall | DB connections "
            "| relay CPU per run | kB per run in flight | duplicates |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for f in inflight:
            lines.append(
                f"| {f['runs']:,} | {f['model_s']:g} s | {f['tool_s']:g} s | {f['calls']} "
                f"| {f['wall_s']:.1f} s | {f['ideal_s']:g} s | {f['vs_ideal']:.2f}x "
                f"| {f['max_db_connections']} | {f['cpu_ms_per_run']:.1f} ms "
                f"| {f['kb_per_run_in_flight']:.0f} | {f['duplicates']} |"
            )
        lines += ["", "Targets: ideal / wall ≥ 0.5x, ≤ 10 database connections.", ""]
    traced = results.get("tracing")
    if traced:
        case = traced["case"]
        lines += [
            "### Tracing off and on (the trace exporter beside the relay, exporting over "
            "OTLP/HTTP to a sink on loopback)",
            "",
            "| runs | M | T | K | relay CPU a run, off | on | on / off (medians) "
            "| exporter CPU a run | PostgreSQL CPU a run, off | on | exports |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {case['runs']:,} | {case['model_s']:g} s | {case['tool_s']:g} s "
            f"| {case['calls']} | {_ms(traced['off_ms_per_run'])} | {_ms(traced['on_ms_per_run'])} "
            f"| {traced['on_vs_off']}x | {_ms(traced['exporter_ms_per_run'])} "
            f"| {_ms(traced['db_off_ms_per_run'])} | {_ms(traced['db_on_ms_per_run'])} "
            f"| {traced['exports']} |",
            "",
            "Target: on ≤ 1.10x off.",
            "",
        ]
    fair = results.get("fairness")
    if fair:
        lines += [
            "### Fairness: one call of a second tenant behind another tenant's backlog",
            "",
            "| backlog | tool latency | older calls ready ahead | its wait to be claimed |",
            "|---:|---:|---:|---:|",
            f"| {fair['backlog']:,} | {fair['tool_s']:g} s | {fair['ready_ahead']:,} "
            f"| {fair['wait_ms']:.1f} ms |",
            "",
            "Target: under 100 ms at the relay's defaults.",
            "",
        ]
    served = results.get("serve")
    if served:
        lines += [
            f"### Starting a run: `outbox serve` beside the writer API ({served['runs']:,} runs "
            "each, one after the other)",
            "",
            "| how | p50 | p99 | runs/s |",
            "|---|---:|---:|---:|",
        ]
        for key, name in (
            ("writer", "writer API (Python, in process)"),
            ("api", "POST /v1/threads/runs, to the JSON answer"),
            ("api_stream", "the same with stream=true, to the first SSE event"),
        ):
            row = served[key]
            lines.append(
                f"| {name} | {row['p50_ms']:.1f} ms | {row['p99_ms']:.1f} ms | {row['per_s']:.0f} |"
            )
        lines += [
            "",
            f"The API adds {served['api_adds_p50_ms']:.1f} ms p50 (target: under 5 ms).",
            "",
        ]
    if results.get("footprint"):
        lines += ["### Journal rows, WAL bytes and table bytes per completed tool call", ""]
        lines += [*footprint.lines(results["footprint"]), ""]
    if results.get("poster"):
        lines += poster_lines(results["poster"])
    if results.get("mcp"):
        lines += mcp_lines(results["mcp"])
    notify = results.get("notify")
    if notify:
        lines += [
            f"### NOTIFY cost: commits/s of {notify['threads']} concurrent writers "
            "(start_run + record_model_turn per transaction)",
            "",
            "| NOTIFY on | NOTIFY off | on / off |",
            "|---:|---:|---:|",
            f"| {fmt(notify['on'])} | {fmt(notify['off'])} "
            f"| {ratio(notify['on'], notify['off'])} |",
            "",
        ]
    return "\n".join(lines)


def poster_lines(clients: dict[str, Any]) -> list[str]:
    """The HTTP clients' CPU per request (``bench.poster``)."""
    lines = [
        f"### CPU per request of the relay's HTTP client ({clients['requests']:,} POSTs, "
        f"{clients['at_once']} at once, kept-alive connections)",
        "",
        "| client | CPU per request |",
        "|---|---:|",
    ]
    for client, values in clients["cpu_ms"].items():
        lines.append(f"| `{client}` | {' · '.join(f'{v:.3f} ms' for v in values)} |")
    return [*lines, ""]


def mcp_lines(runs: dict[str, Any]) -> list[str]:
    """MCP calls through the relay's client beside HTTP tool calls (``bench.mcp``)."""
    lines = [
        "### MCP tool calls beside HTTP tool calls (loopback; the server: the SDK's MCPServer,"
        " or one that only answers: raw)",
        "",
        "| server answers | MCP p50 | HTTP p50 | extra p50 | relay CPU per call, MCP / HTTP "
        "| in flight | wall / ideal | server CPU per call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for answers, run in runs.items():
        calls, flight = run["overhead"], run["in_flight"]
        lines.append(
            f"| {answers} | {calls['mcp_p50_ms']:.1f} ms | {calls['http_p50_ms']:.1f} ms "
            f"| {calls['extra_p50_ms']:.1f} ms | {calls['mcp_client_cpu_ms_per_call']:.2f} / "
            f"{calls['http_client_cpu_ms_per_call']:.2f} ms "
            f"| {flight['in_flight']:,} x {flight['latency_s']:g} s "
            f"| {flight['x_ideal']:.1f}x | {flight['server_cpu_ms_per_call']:.2f} ms |"
        )
        sdk = run.get("sdk_baseline")
        if sdk:
            lines.append(
                f"| {answers}, the SDK's ClientSession (baseline) | {sdk['p50_ms']:.1f} ms "
                f"| | | {sdk['client_cpu_ms_per_call']:.2f} ms | {sdk['in_flight']:,} "
                f"| {sdk['x_ideal']:.1f}x | |"
            )
    return [*lines, "", "Targets: under 2 ms p50 extra; 1,000 in flight within 1.5x.", ""]


def write(results: dict[str, Any], stamp: str) -> tuple[Path, Path | None]:
    """JSON and, when matplotlib is there, a PNG chart into ``bench/results/``."""
    RESULTS.mkdir(exist_ok=True)
    json_path = RESULTS / f"bench-{stamp}.json"
    json_path.write_text(json.dumps(results, indent=2))
    try:
        png = chart(results, RESULTS / f"bench-{stamp}.png")
    except ImportError:
        png = None
    return json_path, png


def chart(results: dict[str, Any], path: Path) -> Path:
    # Imported by name: the bench extra is optional, and mypy must pass without it.
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    processes = results["processes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.25
    xs = range(len(processes))
    drain = axes[0]
    drain.bar(
        [x - width for x in xs],
        [results["relay"].get(str(p), 0) for p in processes],
        width,
        label="relay",
    )
    drain.bar(list(xs), [results["raw"].get(str(p), 0) for p in processes], width, label="raw loop")
    if results.get("pgqueuer"):
        drain.bar([width], [results["pgqueuer"]], width, label="PgQueuer (1 manager)")
    drain.set_xticks(list(xs), [str(p) for p in processes])
    drain.set_xlabel("processes")
    drain.set_ylabel("per second")
    drain.set_title(f"Drain {results['calls']:,} in-process calls")
    drain.legend()
    http = results.get("http")
    if http:
        e2e = axes[1]
        e2e.bar(
            [x - width / 2 for x in xs],
            [http["relay"].get(str(p), 0) for p in processes],
            width,
            label="relay",
        )
        e2e.bar(
            [x + width / 2 for x in xs],
            [http["server"].get(str(p), 0) for p in processes],
            width,
            label="server alone",
        )
        e2e.set_xticks(list(xs), [str(p) for p in processes])
        e2e.set_xlabel("processes")
        e2e.set_title("HTTP no-op tool calls per second")
        e2e.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _ms(values: list[float]) -> str:
    return " · ".join(f"{v:.2f}" for v in values) + " ms"
