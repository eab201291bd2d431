"""What the relay does for traces: name each attempt's span, and time it into the write it
already makes. It builds no span: the trace exporter (``outbox.trace_export``, ``outbox traces
export``) builds them later from what the database recorded.

Each attempt of a model turn or tool call has a span id that follows from its outbox row
and claim number (``outbox.trace_context.attempt_span_id``). The tool or model receives the
``traceparent`` naming it (``headers``), the same the exporter gives the ``chat`` or
``execute_tool`` span it builds, under the run's ``invoke_agent`` span; with traces not
wanted here, the run's span, so their own spans still join the run's trace. When they are,
the attempt's start, end, charged attempt and outcome travel in the journal event of its
completion write (``record``): the result's, the turn's, the retry's, the quarantine's,
the fence's.
Nothing a tool or model was given or answered is added: the exporter reads content from
the rows that hold it, and only when content capture is on.
"""

from __future__ import annotations

from typing import Any

from outbox import trace_context
from outbox.relay.outcomes import Claimed, Outcome

# What an outcome's action says, as the value of ``outbox.outcome``; the ones marked as
# errors set the span's status (``error.type``: that value).
ERRORS = {"retry", "unknown", "fail_run", "lost", "result_error"}
TRACED = ("tool_call", "model_turn")  # the kinds whose attempts have spans


def span_id(row: Claimed) -> int:
    return trace_context.attempt_span_id(row.id, row.attempt)


def headers(row: Claimed) -> dict[str, str]:
    """The ``traceparent``/``tracestate`` a tool or model receives for ``row``: its attempt's
    span's when traces are wanted, else its run's (the same dict for every request of the
    run: never change it)."""
    if trace_context.names_attempts():
        return trace_context.attempt_headers(
            row.run_id, row.traceparent, row.tracestate, span_id(row)
        )
    return trace_context.run_headers(row.run_id, row.traceparent, row.tracestate)


def outcome_of(outcome: Outcome) -> str:
    return f"result_{outcome.status}" if outcome.action == "result" else outcome.action


def record(outcome: Outcome) -> dict[str, Any] | None:
    """The attempt's span as the journal keeps it (None: traces are not wanted here, its
    kind has none, or it never started): its id, start and end (seconds since the epoch,
    this process's clock, as an in-process SDK would have stamped them), the charged
    attempt and the outcome. With traces not wanted, or the run sampled out, the journal's
    events are as they were (the exporter, if one runs, builds only the runs'
    ``invoke_agent`` spans; a sampled-out run's, not even that)."""
    row = outcome.row
    if row.kind not in TRACED or not outcome.started_at or not trace_context.names_attempts():
        return None
    if not trace_context.sampled(row.run_id, row.traceparent, row.tracestate):
        return None  # its spans are dropped whole: nothing to keep for them
    span: dict[str, Any] = {
        "id": f"{span_id(row):016x}",
        "start": round(outcome.started_at, 6),
        "end": round(outcome.started_at + outcome.duration_s, 6),
        "n": row.failures + 1,
        "outcome": outcome_of(outcome),
    }
    if row.kind == "model_turn" and row.payload is not None:
        span["step"] = row.payload.get("step_no")
    return span
