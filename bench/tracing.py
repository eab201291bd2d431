"""Tracing's cost: the runs-in-flight case with tracing off, then on and exporting; and
what one run's spans cost each process, in this process (``python -m bench.tracing``).

The same case as ``bench.inflight`` (N runs, model turn -> K tool calls -> model turn, one
relay process), run alternately with tracing off and with it on: the relay's environment
then points ``OTEL_EXPORTER_OTLP_ENDPOINT`` at a sink on loopback in this process, which
reads each OTLP/HTTP export and answers it as a collector would (its CPU is not the
relay's), and the relay starts its trace exporter (``outbox traces export``) beside it.
The figures, per run, from runs taken in turn (off, on, off, on...), so a drift of the
machine falls on both: the relay's CPU (its process, not the exporter's), the trace
exporter's CPU until it has exported every run, and the whole PostgreSQL server's CPU over
the same window (the relay's statements, the exporter's, this bench's polling).

On a machine shared with other work, a run's relay CPU moves by more than tracing costs,
so ``span_cost`` also measures, for one run (two turns, two calls), what tracing adds to
the relay where nothing else moves (naming each attempt's span to its tool or model and
timing it for the journal), and what the exporter spends building the run's five spans
from rows like the ones it reads and encoding them as OTLP would send them (no database,
no network). ``OTEL_TRACES_SAMPLER`` applies as in the relay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench import inflight, report
from bench.throughput import stderr
from outbox import db, trace_context, trace_export
from outbox.relay import spans
from outbox.relay.outcomes import Claimed, Outcome

SPAN_COST_RUNS = 3_000  # runs a span_cost measures (a mean over them)


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
    """``rounds`` measurements each way, alternating; the relay's, the exporter's and the
    database's CPU a run both ways."""
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
                    server,
                    runs,
                    model_s,
                    tool_s,
                    calls,
                    concurrency,
                    log,
                    env=env,
                    drain_spans=way == "on",
                )
                stderr(
                    f"  relay {f['cpu_ms_per_run']} ms CPU a run, exporter "
                    f"{f['exporter_cpu_ms_per_run']} ms, database "
                    f"{round(1000 * f['postgres_cpu_s'] / runs, 2)} ms, "
                    f"wall {f['wall_s']} s (spans drained {f['spans_drained_after_s']} s after)"
                )
                figures[way].append(f)
    finally:
        sink.close()

    def of(way: str, key: str) -> list[float]:
        return [f[key] for f in figures[way]]

    off, on = of("off", "cpu_ms_per_run"), of("on", "cpu_ms_per_run")
    return {
        "case": {"runs": runs, "model_s": model_s, "tool_s": tool_s, "calls": calls},
        "off_ms_per_run": off,
        "on_ms_per_run": on,
        "on_vs_off": round(statistics.median(on) / statistics.median(off), 3),
        "exporter_ms_per_run": of("on", "exporter_cpu_ms_per_run"),
        "db_off_ms_per_run": [round(1000 * s / runs, 2) for s in of("off", "postgres_cpu_s")],
        "db_on_ms_per_run": [round(1000 * s / runs, 2) for s in of("on", "postgres_cpu_s")],
        "spans_drained_after_s": of("on", "spans_drained_after_s"),
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


def _relay_side(turn_row: Claimed, tool_row: Claimed, now: float) -> list[dict[str, Any] | None]:
    """What the relay does for the traces of one run: a header for each attempt and its
    span's record for the journal (two turns, two calls)."""
    made = []
    for step in (1, 2):
        row = turn_row._replace(payload={"step_no": step})
        spans.headers(row)
        made.append(spans.record(Outcome(row, "turn", started_at=now, duration_s=1.0)))
    for name in ("send_email", "create_ticket"):
        row = tool_row._replace(tool_name=name)
        spans.headers(row)
        made.append(spans.record(Outcome(row, "result", "ok", {"ok": True}, started_at=now)))
    return made


def _rows(runs: int) -> list[tuple[Claimed, Claimed]]:
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
    return rows


def span_cost(on: bool, runs: int = SPAN_COST_RUNS) -> tuple[float, float]:
    """Microseconds of CPU, for one run: what the relay does for traces (with tracing off:
    the run's header, looked up), and with tracing on what the exporter spends building
    and encoding the run's spans from rows as it reads them (0 off)."""
    saved = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if on:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    else:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    trace_context.shutdown()  # forget what was decided under the other setting
    try:
        rows = _rows(runs)
        now = time.time()
        started = time.process_time()
        records = [_relay_side(turn_row, tool_row, now) for turn_row, tool_row in rows]
        relay = (time.process_time() - started) / runs * 1e6
        if not on:
            return relay, 0.0
        builder, encoder = trace_export.SpanBuilder(), _Encoding()
        started = time.process_time()
        for (turn_row, tool_row), made in zip(rows, records, strict=True):
            _exporter_side(builder, turn_row, tool_row, made)
            if len(builder.ended) >= 5 * trace_export.BATCH:
                encoder.export(builder.take())
        encoder.export(builder.take())
        return relay, (time.process_time() - started) / runs * 1e6
    finally:
        if saved is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        else:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
        trace_context.shutdown()


def _exporter_side(
    builder: trace_export.SpanBuilder,
    turn_row: Claimed,
    tool_row: Claimed,
    made: list[dict[str, Any] | None],
) -> None:
    """The exporter's work for one run, from rows shaped as its queries return them."""
    run = {
        "id": turn_row.run_id, "thread_id": turn_row.thread_id, "tenant_id": "acme",
        "model": "gpt-5", "traceparent": None, "tracestate": None, "status": "completed",
        "cancelled_by": None, "created_s": time.time() - 5, "ended_s": time.time(),
    }  # fmt: skip
    events: list[dict[str, Any]] = [
        {"event": "run.created", "tool_call_ref": None, "attempt": None, "detail": {}}
    ]
    calls: dict[int, dict[str, Any]] = {}
    for i, span in enumerate(made):
        ref = None if i < 2 else (tool_row.tool_call_ref or 0) * 2 + i
        detail: dict[str, Any] = {"span": span}
        if ref is None:
            detail.update(step_no=i + 1, input_tokens=10, output_tokens=5)
        else:
            calls[ref] = {
                "tool_call_id": f"call_{i}", "tool_name": "send_email",
                "idempotency_mode": "key", "idempotency_key": tool_row.idempotency_key,
                "approved_by": None, "approval_wait_s": None,
            }  # fmt: skip
        event = "model_turn.recorded" if ref is None else "tool_result.stored"
        events.append({"event": event, "tool_call_ref": ref, "attempt": 1, "detail": detail})
    turns = {(run["id"], s): {"response_id": "resp_1", "content": None} for s in (1, 2)}
    trace_export.run_spans(builder, run, events, calls, turns)


def trigger_cost(server: str, runs: int = 4_000, rounds: int = 6) -> dict[str, float]:
    """Microseconds of PostgreSQL a run's end costs with and without the trigger that marks
    it for the trace exporter (``runs_span_due``, every run, tracing on or off): ``runs``
    runs' ``ended_at`` set in one UPDATE, in turn with the trigger enabled and disabled;
    the medians, a row."""
    from bench import db as bdb
    from bench import seed

    took: dict[str, list[float]] = {"with": [], "without": []}
    with bdb.scratch(server, "tracing_trigger") as url:
        seed.register_http_tool(url, inflight.TOOL, "http://127.0.0.1:9/tools/x", timeout_s=60)
        inflight.start_runs(url, runs, "http://127.0.0.1:9/v1")
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(rounds):
                for way in ("without", "with"):
                    conn.execute("UPDATE outbox.runs SET ended_at = NULL, agent_span_due = false")
                    conn.execute("VACUUM outbox.runs")
                    switch = "ENABLE" if way == "with" else "DISABLE"
                    conn.execute(f"ALTER TABLE outbox.runs {switch} TRIGGER runs_span_due")
                    started = time.perf_counter()
                    conn.execute("UPDATE outbox.runs SET ended_at = now()")
                    took[way].append((time.perf_counter() - started) / runs * 1e6)
    return {way: round(statistics.median(v), 1) for way, v in took.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.tracing [ROUNDS]``: one run's tracing work in one process, off and
    on, in turn; ``--relay RUNS:M:T:K``: instead, the runs-in-flight case alone, as ``make
    bench`` runs it (ROUNDS measurements each way); ``--trigger``: instead, what marking a
    run that ends costs the database (ROUNDS each way)."""
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=main.__doc__)
    parser.add_argument("rounds", type=int, nargs="?", default=3, help="rounds (3)")
    parser.add_argument(
        "--relay", metavar="RUNS:M:T:K", help="the runs-in-flight case, e.g. 2000:2:0.5:2"
    )
    parser.add_argument(
        "--trigger",
        action="store_true",
        help="instead, what the trigger marking an ended run costs PostgreSQL (us a run)",
    )
    args = parser.parse_args(argv)
    if args.trigger:
        cost = trigger_cost(db.database_url(start=True), rounds=args.rounds)
        print(f"a run's end: {cost['without']} us without the mark, {cost['with']} us with it")
        return 0
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
        (off, _), (on, exporter) = span_cost(False), span_cost(True)
        print(
            f"one run: relay off {off:.1f} us, relay on {on:.1f} us, "
            f"exporter {exporter:.0f} us CPU",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
