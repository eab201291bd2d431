"""Tracing's cost: the runs-in-flight case with tracing off, then on and exporting; and
the spans of one run alone, in this process (``python -m bench.tracing``).

The same case as ``bench.inflight`` (N runs, model turn -> K tool calls -> model turn, one
relay process), run alternately with tracing off and with it on: the relay's environment
then points ``OTEL_EXPORTER_OTLP_ENDPOINT`` at a sink on loopback in this process, which
reads each OTLP/HTTP export and answers it as a collector would (its CPU is not the
relay's). The figure is the relay's CPU per run, on against off, from runs taken in turn
(off, on, off, on...), so a drift of the machine falls on both.

On a machine shared with other work, a run's relay CPU moves by more than tracing costs,
so ``span_cost`` also measures what tracing adds to a run where nothing else moves: the
relay's own span calls for one run (two turns, two calls, its ``invoke_agent`` span), as
the executors and the completer make them, encoded as OTLP would send them, in one
process, without the network. ``OTEL_TRACES_SAMPLER`` applies as in the relay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench import inflight, report
from bench.throughput import stderr
from outbox import db, tracing
from outbox.relay import spans
from outbox.relay.outcomes import Claimed, Outcome
from outbox.schemas import ModelTurnIn

SPAN_COST_RUNS = 3_000


class Sink:
    """An OTLP/HTTP endpoint on loopback that reads what it is sent and keeps counts."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with sink.lock:
                    sink.requests += 1
                    sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_case(
    server: str, case: tuple[int, float, float, int], rounds: int, log: Path
) -> dict[str, Any]:
    """``rounds`` measurements each way, alternating; the relay's CPU a run both ways."""
    runs, model_s, tool_s, calls = case
    concurrency = inflight.concurrency_for(runs, calls)
    figures: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    sink = Sink()
    try:
        for i in range(rounds):
            for way in ("off", "on"):
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url} if way == "on" else {}
                stderr(f"tracing {way} ({i + 1}/{rounds}): {runs} runs in flight")
                f = inflight.measure(
                    server, runs, model_s, tool_s, calls, concurrency, log, env=env
                )
                stderr(f"  relay {f['cpu_ms_per_run']} ms CPU a run, wall {f['wall_s']} s")
                figures[way].append(f)
    finally:
        sink.close()
    off = [f["cpu_ms_per_run"] for f in figures["off"]]
    on = [f["cpu_ms_per_run"] for f in figures["on"]]
    return {
        "case": {"runs": runs, "model_s": model_s, "tool_s": tool_s, "calls": calls},
        "off_ms_per_run": off,
        "on_ms_per_run": on,
        "on_vs_off": round(sum(on) / sum(off), 3) if sum(off) else None,
        "exports": sink.requests,
        "exported_bytes": sink.bytes,
        "measurements": figures,
    }


class _Encoding(SpanExporter):
    """Encodes spans as the OTLP exporter does, and sends them nowhere."""

    def export(self, batch: Any) -> SpanExportResult:
        encode_spans(batch).SerializeToString()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _one_run(turn_row: Claimed, tool_row: Claimed, run: dict[str, Any]) -> None:
    for step in (1, 2):
        span = spans.chat_started(turn_row, run, step, [])
        spans.headers(turn_row, span)
        turn = ModelTurnIn(
            tenant_id=turn_row.tenant_id,
            run_id=turn_row.run_id,
            step_no=step,
            response_id="resp_1",
            input_tokens=10,
            output_tokens=5,
        )
        spans.chat_ended(span, Outcome(turn_row, "turn", output=turn))
    for name in ("send_email", "create_ticket"):
        row = tool_row._replace(tool_name=name)
        span = spans.tool_started(row)
        spans.headers(row, span)
        spans.tool_ended(span, Outcome(row, "result", "ok", {"ok": True}))
    spans.run_ended(turn_row, "completed")


def span_cost(on: bool, runs: int = SPAN_COST_RUNS) -> float:
    """Microseconds of CPU the span calls of one run take (with tracing off: the calls
    alone, which then make nothing), ModelTurnIn's construction included both ways."""
    if on:
        # A queue that holds every span of the loop: none is dropped unencoded.
        os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(6 * runs)
        tracing.install(_Encoding(), service_name="bench")
    rows = []
    for i in range(runs):
        run_id = uuid.uuid4()
        tool_row = Claimed(
            id=i, kind="tool_call", tenant_id="acme", thread_id=uuid.uuid4(), run_id=run_id,
            batch_id=1, tool_call_ref=i, correlation_id="c", attempt=1, failures=0,
            max_attempts=5, payload=None, lag_s=0.0, tool_call_id="call_1",
            idempotency_key="ob-" + "a" * 40, idempotency_mode="key", executor="http",
            run_started_at=time.time(), model="gpt-5",
        )  # fmt: skip
        rows.append((tool_row._replace(kind="model_turn"), tool_row))
    run = {"model": "gpt-5", "api": "responses", "base_url": None}
    started = time.process_time()
    for turn_row, tool_row in rows:
        _one_run(turn_row, tool_row, run)
    tracing.shutdown()  # the last batches are encoded here: counted
    return (time.process_time() - started) / runs * 1e6


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.tracing [ROUNDS]``: the span calls of a run, off and on, in turn;
    ``--relay RUNS:M:T:K``: instead, the runs-in-flight case alone, as ``make bench`` runs
    it (ROUNDS measurements each way)."""
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=main.__doc__)
    parser.add_argument("rounds", type=int, nargs="?", default=3, help="rounds (3)")
    parser.add_argument(
        "--relay", metavar="RUNS:M:T:K", help="the runs-in-flight case, e.g. 2000:2:0.5:2"
    )
    args = parser.parse_args(argv)
    if args.relay:
        r, m, t, k = args.relay.split(":")
        server = db.database_url(start=True)
        report.RESULTS.mkdir(exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        log = report.RESULTS / f"tracing-{stamp}.log"
        result = run_case(server, (int(r), float(m), float(t), int(k)), args.rounds, log)
        result.pop("measurements")
        print(json.dumps(result), flush=True)
        return 0
    for _ in range(args.rounds):
        off, on = span_cost(False), span_cost(True)
        print(f"span calls of one run: off {off:.0f} us, on {on:.0f} us CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
