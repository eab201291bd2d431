"""The trace exporter: a run's spans built from what the database recorded, after the run
ended, and exported over OTLP. The relay builds none (``relay.spans``).

When a run ends, whoever ends it (a last model turn, a failure, the expiry sweep, a
cancel), the ``runs_span_due`` trigger marks it ``agent_span_due`` in the transaction that
ends it. ``export_due`` leases a batch of marked runs (``spans_taken_until``, taken ``FOR
UPDATE SKIP LOCKED`` in a short transaction that also reads what their spans need: one
exporter per run, however many run, and no row lock held during the export), builds the
spans with the OpenTelemetry SDK, hands them to the exporter and, only once it accepted
them, clears the marks of the runs it still holds. So:

- every span comes from committed rows: a relay killed with -9 loses none, and a run that
  no relay ends (cancelled by its backend) needs no relay for its span;
- export is at least once: an exporter killed after its export and before the clearing
  leaves the marks, and once its lease has run out the next pass exports the same spans
  again, with the same ids (every id follows from the database: ``outbox.trace_context``),
  which a tracing backend keeps once;
- an export that fails gives its runs back: they are tried on the next pass.

The spans: ``invoke_agent`` from the run's row (its creation to its end), and for each
attempt of a model turn or tool call a ``chat`` or ``execute_tool`` span from the journal
event of its completion write, which carries the attempt's span id (the one its tool or
model was sent), start, end, charged attempt and outcome (``run_span_events_v1``). An
attempt that wrote nothing (its relay died mid-call, or found its lease gone) has no span;
the attempt that took over has its own.

Sampling is the SDK's (``OTEL_TRACES_SAMPLER``): a run's spans are kept or dropped whole,
as the relay decided for the ``traceparent`` it sent (the samplers decide by trace id).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from opentelemetry import context as otel_context
from opentelemetry import trace
from psycopg.rows import dict_row

from outbox import db, trace_context
from outbox.logs import log
from outbox.sql import queries

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("outbox.traces")
Q = queries("trace_export.sql")

BATCH = 200  # runs per export (about 5-10 spans each)
LEASE_S = 120.0  # how long a batch is an exporter's (past an OTLP export's retries)
INTERVAL_S = 1.0  # between passes that found nothing more to do
PROVIDER = "openai"  # the protocol the relay speaks to every model server (relay.model_turns)
ERRORS = {"retry", "unknown", "fail_run", "lost", "result_error"}  # outcomes of error status
SERVICE = "outbox-relay"  # the spans' service, unless OTEL_SERVICE_NAME says otherwise


class ExportFailed(Exception):
    """The exporter refused or could not send the spans: their runs stay marked."""


@dataclass
class Exported:
    runs: int = 0
    spans: int = 0
    pruned: int = 0  # runs whose journal events were pruned before they were exported


class SpanBuilder:
    """A tracer provider that hands out the ids it is told (every id of a run's spans
    follows from the database) and keeps the spans it ends for ``take``."""

    def __init__(self, service_name: str = SERVICE) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator

        builder = self

        class Told(IdGenerator):
            def generate_span_id(self) -> int:
                return builder.ids[1]

            def generate_trace_id(self) -> int:
                return builder.ids[0]

        class Keep(SpanProcessor):
            def on_end(self, span: ReadableSpan) -> None:
                builder.ended.append(span)

        self.ids: tuple[int, int] = (0, 0)
        self.ended: list[ReadableSpan] = []
        resource = Resource.create(
            {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
        )
        self.provider: TracerProvider = TracerProvider(resource=resource, id_generator=Told())
        self.provider.add_span_processor(Keep())
        self.tracer = self.provider.get_tracer(trace_context.SCOPE)
        self.capture = os.environ.get(trace_context.CAPTURE_CONTENT, "").strip().lower() == "true"

    def span(
        self,
        name: str,
        kind: trace.SpanKind,
        parent: Any,
        ids: tuple[int, int],
        start_s: float,
        end_s: float,
        attributes: dict[str, Any],
        error: str | None = None,
        description: str | None = None,
    ) -> None:
        self.ids = ids
        span = self.tracer.start_span(name, context=parent, kind=kind, start_time=_ns(start_s))
        if not span.is_recording():  # sampled out: the run's spans are all dropped
            return
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, description))
        span.end(end_time=_ns(max(start_s, end_s)))

    def take(self) -> list[ReadableSpan]:
        ended, self.ended = self.ended, []
        return ended


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def export_due(
    conn: psycopg.Connection[Any],
    exporters: Sequence[SpanExporter],
    builder: SpanBuilder | None = None,
    limit: int = BATCH,
    after_export: Callable[[], None] | None = None,
    lease_s: float = LEASE_S,
) -> Exported:
    """One batch: lease up to ``limit`` ended runs whose spans are due for ``lease_s``
    and read what their spans need (one short transaction), build the spans, export them
    to every exporter, then clear the marks (another). An exporter that fails
    (``ExportFailed``) clears nothing: the runs are taken again when the lease runs out.
    ``after_export`` runs between the export and the clearing (tests die there)."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    builder = builder or SpanBuilder()
    done = Exported()
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        runs = cur.execute(Q.take_due, {"limit": limit, "lease_s": lease_s}).fetchall()
        if not runs:
            return done
        run_ids = [r["id"] for r in runs]
        since = min(r["created_at"] for r in runs)
        events = cur.execute(Q.events, {"run_ids": run_ids, "since": since}).fetchall()
        refs = sorted({e["tool_call_ref"] for e in events if e["tool_call_ref"] is not None})
        calls = {
            c["id"]: c
            for c in cur.execute(Q.calls, {"refs": refs, "content": builder.capture}).fetchall()
        }
        turns = {
            (t["run_id"], t["step_no"]): t
            for t in cur.execute(
                Q.turns, {"run_ids": run_ids, "content": builder.capture}
            ).fetchall()
        }
        by_run: dict[uuid.UUID, list[dict[str, Any]]] = {}
        for event in events:
            by_run.setdefault(event["run_id"], []).append(event)
    held = {"run_ids": run_ids, "leases": [r["spans_taken_until"] for r in runs]}
    try:
        for run in runs:
            mine = by_run.get(run["id"], [])
            if not any(e["event"] == "run.created" for e in mine):
                done.pruned += 1
            run_spans(builder, run, mine, calls, turns)
        spans = builder.take()
        if spans:
            for exporter in exporters:
                if exporter.export(spans) is not SpanExportResult.SUCCESS:
                    name = type(exporter).__name__
                    raise ExportFailed(f"{name} did not take {len(spans)} spans")
    except Exception:
        builder.take()  # nothing of this batch goes with the next
        if not conn.broken:
            with conn.transaction():
                conn.execute(Q.release, held)
        raise
    if after_export is not None:
        after_export()
    with conn.transaction():
        conn.execute(Q.clear, held)
    done.runs, done.spans = len(runs), len(spans)
    return done


def run_spans(
    builder: SpanBuilder,
    run: dict[str, Any],
    events: list[dict[str, Any]],
    calls: dict[int, dict[str, Any]],
    turns: dict[tuple[Any, int], dict[str, Any]],
) -> None:
    run_id, tp, ts = run["id"], run["traceparent"], run["tracestate"]
    parent = trace_context.caller_span(tp, ts)
    agent_ids = (
        parent.trace_id if parent else trace_context.own_trace_id(run_id),
        trace_context.agent_span_id(run_id),
    )
    status = run["status"]
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": str(run["thread_id"]),
        "outbox.tenant.id": run["tenant_id"],
        "outbox.run.id": str(run_id),
        "outbox.run.status": status,
        "outbox.outcome": status,
    }
    if run["model"]:
        attributes["gen_ai.request.model"] = run["model"]
    if run["cancelled_by"] and status == "cancelled":
        attributes["outbox.run.ended_by"] = run["cancelled_by"]
    error = None if status == "completed" else status
    builder.span(
        "invoke_agent",
        trace.SpanKind.INTERNAL,
        trace.set_span_in_context(trace.NonRecordingSpan(parent))
        if parent
        else otel_context.Context(),
        agent_ids,
        run["created_s"],
        run["ended_s"],
        attributes,
        error,
        error,
    )
    under = trace_context.run_context(run_id, tp, ts)
    for event in events:
        span = event["detail"].get("span")
        if span is not None:
            _attempt_span(builder, run, event, span, under, calls, turns)


def _attempt_span(
    builder: SpanBuilder,
    run: dict[str, Any],
    event: dict[str, Any],
    span: dict[str, Any],
    under: Any,
    calls: dict[int, dict[str, Any]],
    turns: dict[tuple[Any, int], dict[str, Any]],
) -> None:
    detail = event["detail"]
    outcome = span.get("outcome", "")
    attributes: dict[str, Any] = {
        "gen_ai.conversation.id": str(run["thread_id"]),
        "outbox.tenant.id": run["tenant_id"],
        "outbox.run.id": str(run["id"]),
        "outbox.attempt": span.get("n", 1),
        "outbox.fencing_token": event["attempt"],
        "outbox.outcome": outcome,
    }
    error_text = detail.get("error")
    ref = event["tool_call_ref"]
    if ref is not None:
        call = calls.get(ref)
        if call is None:  # its call is gone (retention): no span to name it by
            return
        name = f"execute_tool {call['tool_name']}"
        kind = trace.SpanKind.INTERNAL
        attributes.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call["tool_name"] or "",
                "gen_ai.tool.call.id": call["tool_call_id"] or "",
                "outbox.idempotency.mode": call["idempotency_mode"] or "",
                "outbox.idempotency.key": call["idempotency_key"] or "",
            }
        )
        if call["approved_by"] is not None:
            attributes["outbox.approval.decided_by"] = call["approved_by"]
            attributes["outbox.approval.wait_s"] = call["approval_wait_s"] or 0.0
        if builder.capture:
            attributes["gen_ai.tool.call.arguments"] = json.dumps(call["arguments"])
            if outcome == "result_ok":
                attributes["gen_ai.tool.call.result"] = json.dumps(call["output"])
            error_text = error_text or call["error"]
    else:
        step = detail.get("step_no", span.get("step"))
        # A recorded turn names the model that answered it (a fallback's, a routing
        # rule's: outbox.routing); another attempt, the run's.
        recorded = turns.get((run["id"], step)) if event["event"] == "model_turn.recorded" else None
        model = (recorded or {}).get("model") or run["model"]
        name = f"chat {model}"
        kind = trace.SpanKind.CLIENT
        attributes.update(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": model or "",
                "outbox.step": step if step is not None else 0,
            }
        )
        if event["event"] == "model_turn.recorded":
            attributes["gen_ai.usage.input_tokens"] = detail.get("input_tokens", 0)
            attributes["gen_ai.usage.output_tokens"] = detail.get("output_tokens", 0)
            attributes["gen_ai.usage.cache_read.input_tokens"] = detail.get("cached_tokens", 0)
            turn = turns.get((run["id"], step))
            if turn is not None and turn["response_id"]:
                attributes["gen_ai.response.id"] = turn["response_id"]
            if turn is not None and turn["through_seq"] is not None:
                # The turn summarised the oldest turns before its request (outbox.context).
                attributes["outbox.context.compacted"] = True
                attributes["outbox.context.through_seq"] = turn["through_seq"]
                attributes["outbox.context.tokens_before"] = turn["tokens_before"]
                attributes["outbox.context.tokens_after"] = turn["tokens_after"]
            if builder.capture and turn is not None:
                attributes["gen_ai.output.messages"] = json.dumps({"content": turn["content"]})
    error = None
    if outcome in ERRORS:
        attributes["error.type"] = outcome
        error = outcome
    builder.span(
        name,
        kind,
        under,
        (0, int(span["id"], 16)),
        span["start"],
        span["end"],
        attributes,
        error,
        error_text if builder.capture else None,
    )


# -- the exporter process ----------------------------------------------------------------


def lag(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """How many ended runs wait for their spans, and how long the oldest has (seconds)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.lag).fetchone()
    conn.commit()
    assert row is not None
    return row


def run(
    url: str | None = None,
    exporters: Sequence[SpanExporter] | None = None,
    interval_s: float = INTERVAL_S,
    limit: int = BATCH,
    stop: threading.Event | None = None,
    once: bool = False,
    parent_pid: int | None = None,
) -> Exported:
    """Export due runs' spans until ``stop`` is set (or, ``once``, until none is due), a
    batch at a time; between passes, wait ``interval_s``. A database or exporter failure
    is logged and tried again on the next pass. With ``parent_pid``, stop when that
    process is gone (an exporter started by a relay that was killed)."""
    stop = stop or threading.Event()
    exporters = list(exporters) if exporters is not None else trace_context.span_exporters()
    builder = SpanBuilder()
    total = Exported()
    conn: psycopg.Connection[Any] | None = None
    last_lag = -math.inf  # the first pass logs the lag, however long the machine has been up
    try:
        while not stop.is_set():
            if parent_pid is not None and os.getppid() != parent_pid:
                log(logger, logging.WARNING, "traces.orphaned", parent_pid=parent_pid)
                break
            try:
                if conn is None or conn.closed:
                    conn = db.connect(url)
                done = export_due(conn, exporters, builder, limit)
            except Exception as err:  # the database, the collector, or a run it cannot build
                # Logged and tried again: an exporter that stopped would let the lag grow
                # unseen but by its gauge.
                log(logger, logging.ERROR, "traces.export_failed", error=repr(err))
                if conn is not None and conn.broken:
                    conn = None
                if once:
                    raise
                stop.wait(interval_s)
                continue
            total.runs += done.runs
            total.spans += done.spans
            total.pruned += done.pruned
            if done.runs:
                level = logging.WARNING if done.pruned else logging.DEBUG
                log(
                    logger,
                    level,
                    "traces.exported",
                    runs=done.runs,
                    spans=done.spans,
                    journal_pruned=done.pruned,
                )
            if time.monotonic() - last_lag >= 60.0 and conn is not None:
                log(logger, logging.INFO, "traces.lag", **lag(conn))
                last_lag = time.monotonic()
            if done.runs < limit:
                if once:
                    break
                stop.wait(interval_s)
    finally:
        if conn is not None:
            conn.close()
        for exporter in exporters:
            exporter.shutdown()
        builder.provider.shutdown()
    return total
