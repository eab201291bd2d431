"""Tracing's cost: the runs-in-flight case with tracing off, then on and exporting.

The same case as ``bench.inflight`` (N runs, model turn -> K tool calls -> model turn, one
relay process), run alternately with tracing off and with it on: the relay's environment
then points ``OTEL_EXPORTER_OTLP_ENDPOINT`` at a sink on loopback in this process, which
reads each OTLP/HTTP export and answers it as a collector would (its CPU is not the
relay's). The figure is the relay's CPU per run, on against off, from runs taken in turn
(off, on, off, on...), so a drift of the machine falls on both.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import inflight
from bench.throughput import stderr


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
