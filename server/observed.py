"""Traces and metrics of ``outbox serve``'s requests.

Metrics, in this process's registry (``REGISTRY``), served by ``outbox serve
--metrics-port``: ``outbox_serve_request_seconds`` by method, route (the path's template,
so ids do not make a series each) and status; the database calls waiting for a thread
(``outbox_serve_queued_calls``), how long each waited (``outbox_serve_queue_wait_seconds``)
and the requests refused for it (``outbox_serve_shed_requests_total``: server.thread_pool).

Traces: a server span per HTTP request, continuing the caller's trace.

The caller's ``traceparent`` (and ``tracestate``) headers name the trace a request belongs
to. The request's span (``{method} {route}``, kind server, with the semantic conventions'
``http.*`` attributes) is its child and is current while the request is handled, so a run
the request starts stores it (``outbox.calls.start_run``) and every span of that run joins
the caller's trace. With tracing off the caller's context alone is made current: the run
still continues it. Handlers run on the server's thread pool (``server.thread_pool``), which
carries the context.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outbox import trace_context

CONTEXT_HEADERS = (b"traceparent", b"tracestate")
METHODS = {"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"}  # others: "other"
REGISTRY = CollectorRegistry()
REQUEST_SECONDS = Histogram(
    "outbox_serve_request_seconds",
    "Requests to outbox serve, from their arrival to their answer (a stream: to its end), "
    "by method, route and status",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
QUEUED_CALLS = Gauge(
    "outbox_serve_queued_calls",
    "Database calls of requests waiting for one of the server's threads (a connection each)",
    registry=REGISTRY,
)
QUEUE_WAIT_SECONDS = Histogram(
    "outbox_serve_queue_wait_seconds",
    "How long each database call of a request waited for a thread",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
SHED_REQUESTS = Counter(
    "outbox_serve_shed_requests",
    "Requests refused with 503 because their first call waited past --queue-timeout",
    registry=REGISTRY,
)
QUEUED_GONE = Gauge(
    "outbox_serve_queued_calls_of_gone_clients",
    "Calls queued for a thread whose client has left: dropped when their turn comes",
    registry=REGISTRY,
)
GONE_REQUESTS = Counter(
    "outbox_serve_abandoned_requests",
    "Requests dropped, nothing of them done, because their client left while they queued",
    registry=REGISTRY,
)


class Observed:
    """ASGI middleware: each HTTP request in a span of its own (``outbox.trace_context``), and
    counted with its duration."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in CONTEXT_HEADERS
        }
        started = time.perf_counter()
        method = scope["method"] if scope["method"] in METHODS else "other"
        attributes = {"http.request.method": method, "url.path": scope["path"]}
        with trace_context.server_span(method, carrier, attributes) as span:
            status = 500

            async def answer(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, answer)
            finally:
                route = getattr(scope.get("route"), "path", None)
                REQUEST_SECONDS.labels(method, route or "unmatched", str(status)).observe(
                    time.perf_counter() - started
                )
                if span.is_recording():
                    if route:
                        span.update_name(f"{method} {route}")
                        span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                    tenant = scope.get("state", {}).get("tenant_id")
                    if tenant:
                        span.set_attribute("outbox.tenant.id", tenant)
