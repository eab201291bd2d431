"""An OTLP/HTTP receiver on loopback for tests: it records the spans processes export to it.

A relay run as a process of its own exports its spans over OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``
pointed here), exactly as it would to a collector; the test reads what arrived. Spans are
decoded with OpenTelemetry's own protobuf messages (``opentelemetry-proto``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, ids as integers (as the SDK's ``ReadableSpan`` has them)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    attributes: dict[str, Any]
    service: str | None
    status_code: int


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


class OtlpReceiver:
    """Collects spans POSTed to ``/v1/traces``; ``endpoint`` is the base URL to export to."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                None,
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=int.from_bytes(span.trace_id, "big"),
                            span_id=int.from_bytes(span.span_id, "big"),
                            parent_span_id=(
                                int.from_bytes(span.parent_span_id, "big")
                                if span.parent_span_id
                                else None
                            ),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            service=service,
                            status_code=span.status.code,
                        )
                    )
        with self.lock:
            self.spans.extend(found)
            self.requests += 1

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        receiver.thread.join(timeout=10)
