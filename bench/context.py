"""``python -m bench.context [--steps 40] [--bytes 8192] [--window 32768] [--chart FILE]
[--runs 200] [--cpu-only]``: what a long run sends its model per turn, and what the relay
spends per run that needs no compaction.

Tokens per turn: one run per model API of ``--steps`` tool steps whose results are
``--bytes`` each, against the scripted model with a ``--window``-token context window and
the same window in the model catalogue (output 4096). Reported per turn: the tokens the
model was sent (its request's JSON characters over 4, as the scripted model counts them),
and the turns that compacted first; ``--chart`` draws them (matplotlib, ``make
setup-bench``).

Relay CPU: ``--runs`` runs of three tool steps with 1 KB results, all started at once, a
relay process (``outbox relay``) working them; its CPU seconds (user + system, psutil)
from its start to the last run's end, per run, the median of three rounds. Nothing in it
depends on compaction, so the same module measures a checkout without it (the figure to
compare with: ``--cpu-only``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import db as bdb
from outbox import db, registry, writer
from outbox.schemas import StartRun
from outbox.testing.relay import start_relay, stop_relay, wait_until
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService

TENANT = "bench"
MODEL = "bench-model"


def _register(conn: psycopg.Connection[Any], service: FakeToolService) -> None:
    registry.register(
        conn,
        registry.ToolSpec(
            name="fetch_page",
            endpoint=service.endpoint("fetch_page"),
            idempotency_mode="key",
            json_schema={"type": "object"},
        ),
    )


def _start(
    url: str, model: ScriptedModel, script: str, api: str, runs: int, max_steps: int
) -> list[Any]:
    with psycopg.connect(url) as conn:
        started = []
        for _ in range(runs):
            thread = writer.create_thread(conn, TENANT)
            started.append(
                writer.start_run(
                    conn,
                    StartRun(
                        tenant_id=TENANT,
                        thread_id=thread.id,
                        model=MODEL,
                        message=f"script:{script} go",
                        tools=["fetch_page"],
                        base_url=model.url + "/v1",
                        api=api,
                        max_steps=max_steps,
                    ),
                ).id
            )
        conn.commit()
    return started


def _ended(url: str, n: int) -> bool:
    done = bdb.scalar(
        url, "SELECT count(*) FROM outbox.runs WHERE status IN ('completed', 'failed')"
    )
    return int(done) >= n


def tokens_per_turn(
    server: str, api: str, steps: int, size: int, window: int
) -> list[dict[str, Any]]:
    """Every request of one long run: turn, tokens sent, whether it was a summary."""
    from outbox import context  # the catalogue and the summary instruction

    def page(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
        return {"page": arguments.get("page"), "text": "x" * size}

    turns = [
        {"tool_calls": [{"name": "fetch_page", "arguments": {"page": i}}]} for i in range(steps)
    ]
    with (
        bdb.scratch(server, f"context_{api}") as url,
        ScriptedModel(
            {"long": [*turns, {"text": "done"}]}, faults={"context_window": window}
        ) as model,
        FakeToolService() as service,
    ):
        service.add_tool("fetch_page", "key", page)
        with psycopg.connect(url) as conn:
            _register(conn, service)
            context.set_model(conn, MODEL, context_window=window, max_output=4096)
            conn.commit()
        _start(url, model, "long", api, 1, steps + 5)
        relay = start_relay(url, "--poll-interval", "0.1", log_path=Path("/dev/null"))
        try:
            wait_until(lambda: _ended(url, 1), timeout_s=600, what="the long run")
        finally:
            stop_relay(relay)
        status = bdb.scalar(url, "SELECT status FROM outbox.runs")
        summarising = context.SUMMARY_INSTRUCTION
        rows = []
        for r in model.requests:
            summary = bool(r.history) and r.history[0].text == summarising
            rows.append(
                {
                    "turn": r.turn_index,
                    "tokens": r.input_tokens,
                    "summary": summary,
                    "status": r.status,
                    "run": status,
                }
            )
        return rows


def relay_cpu_per_run(server: str, runs: int) -> float:
    """Relay CPU seconds per short run (no compaction), one round."""
    import psutil

    script = [{"tool_calls": [{"name": "fetch_page", "arguments": {"page": i}}]} for i in range(3)]
    with (
        bdb.scratch(server, "context_cpu") as url,
        ScriptedModel({"short": [*script, {"text": "done"}]}) as model,
        FakeToolService() as service,
    ):
        service.add_tool("fetch_page", "key", lambda a, e: {"text": "y" * 1024})
        with psycopg.connect(url) as conn:
            _register(conn, service)
            conn.commit()
        relay = start_relay(url, "--poll-interval", "0.1", log_path=Path("/dev/null"))
        try:
            process = psutil.Process(relay.pid)
            # the relay's start (imports, connections) is not the runs': measured from when
            # its CPU stops growing, idle
            wait_until(lambda: _idle(process), timeout_s=60, what="the relay to start")
            before = process.cpu_times()
            _start(url, model, "short", "responses", runs, 10)
            wait_until(lambda: _ended(url, runs), timeout_s=600, what="the short runs")
            after = process.cpu_times()
        finally:
            stop_relay(relay)
        spent = float((after.user - before.user) + (after.system - before.system))
        return spent / runs


def _idle(process: Any) -> bool:
    """Whether the process spent under 20 ms of CPU in the last half second."""
    first = process.cpu_times()
    time.sleep(0.5)  # the sampling interval of an idle check, not a wait for a condition
    second = process.cpu_times()
    return bool((second.user + second.system) - (first.user + first.system) < 0.02)


def chart(path: str, series: dict[str, list[dict[str, Any]]], window: int) -> None:
    # The bench extra's: imported by name, so the checks run without it.
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    fig, ax = plt.subplots(figsize=(8, 4))
    for api, rows in series.items():
        turns = [r for r in rows if not r["summary"] and r["status"] == 200]
        ax.plot(range(1, len(turns) + 1), [r["tokens"] for r in turns], marker=".", label=api)
    ax.axhline(window, color="grey", linestyle="--", label=f"window ({window})")
    ax.set_xlabel("model turn")
    ax.set_ylabel("tokens sent")
    ax.set_title("Tokens sent per turn, 40 steps of 8 KB results")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.context", description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--bytes", type=int, default=8192)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chart", help="a PNG of the tokens sent per turn")
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args(argv)
    server = db.database_url(start=True)
    result: dict[str, Any] = {}
    if not args.cpu_only:
        series = {
            api: tokens_per_turn(server, api, args.steps, args.bytes, args.window)
            for api in ("responses", "chat")
        }
        turns = {api: [r for r in rows if not r["summary"]] for api, rows in series.items()}
        print("| turn | responses: tokens sent | chat: tokens sent |")
        print("|---|---|---|")
        for i in range(max(len(t) for t in turns.values())):
            cells = []
            for api in ("responses", "chat"):
                rows = turns[api]
                if i >= len(rows):
                    cells.append("")
                    continue
                # a turn that compacted first: its request follows a summary request
                before = series[api].index(rows[i]) - 1
                mark = " (compacted)" if before >= 0 and series[api][before]["summary"] else ""
                cells.append(f"{rows[i]['tokens']}{mark}")
            print(f"| {i + 1} | {cells[0]} | {cells[1]} |")
        for api, rows in series.items():
            sent = [r["tokens"] for r in turns[api]]
            result[api] = {
                "run": rows[0]["run"],
                "turns": len(sent),
                "summaries": sum(r["summary"] for r in rows),
                "max_tokens": max(sent),
                "over_window": sum(t > args.window for t in sent),
            }
        if args.chart:
            chart(args.chart, series, args.window)
    rounds = [relay_cpu_per_run(server, args.runs) for _ in range(args.rounds)]
    result["relay_cpu_ms_per_run"] = round(statistics.median(rounds) * 1000, 2)
    result["relay_cpu_ms_rounds"] = [round(r * 1000, 2) for r in rounds]
    print(f"relay CPU per short run: {result['relay_cpu_ms_per_run']} ms (median of {args.rounds})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
