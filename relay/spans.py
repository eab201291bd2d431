"""The relay's spans, per OpenTelemetry's GenAI conventions: ``chat {model}`` for a model turn,
``execute_tool {name}`` for a tool call, ``invoke_agent`` for a run when it ends.

Each is a child of its run's ``invoke_agent`` span, found from the claimed row alone
(``outbox.tracing``), so spans of one run recorded by different relay processes, before and
after a crash, form one trace. The tool or model receives the ``traceparent`` of its span
(``headers``); with tracing off, that of the run's span, so its own spans still join the
run's trace. ``gen_ai.*`` attributes are the conventions'; ``outbox.*`` ones are ours.
Nothing a tool or model was given or answered goes into a span unless content capture is
on (``outbox.tracing.capture_content``); an error's text neither, since it quotes what a
tool or model sent.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from outbox import tracing
from outbox.relay.outcomes import Claimed, Outcome
from outbox.schemas import ModelTurnIn

PROVIDER = "openai"  # the protocol the relay speaks to every model server (relay.model)
# What an outcome's action says, as the value of ``outbox.outcome``; the ones marked as
# errors set the span's status (``error.type``: that value).
ERRORS = {"retry", "unknown", "fail_run", "lost", "result_error"}


def _common(row: Claimed) -> dict[str, Any]:
    """The attributes every span of a claimed row has. Few on purpose: each costs the relay
    about 4 us to set and encode, against a span's 35 us (docs/benchmarks.md, "Tracing")."""
    return {
        gen_ai.GEN_AI_CONVERSATION_ID: str(row.thread_id),
        "outbox.tenant.id": row.tenant_id,
        "outbox.run.id": str(row.run_id),
        "outbox.attempt": row.failures + 1,  # the charged attempt this is: 1st, 2nd...
        "outbox.fencing_token": row.attempt,  # the claim's number, every write fenced on
    }


def parent(row: Claimed) -> Any:
    return tracing.run_context(row.run_id, row.traceparent, row.tracestate)


def headers(row: Claimed, span: trace.Span | None) -> dict[str, str]:
    """The ``traceparent``/``tracestate`` a tool or model receives for ``row``: its span's,
    or with tracing off (or its run sampled out) its run's (the same dict for every request:
    never change it)."""
    if span is None or not span.is_recording():
        return tracing.run_headers(row.run_id, row.traceparent, row.tracestate)
    return tracing.span_headers(span)


def _start(
    row: Claimed, name: str, kind: trace.SpanKind, start_time: int | None = None
) -> trace.Span:
    """A span of ``row``, started under its run's span with no attributes: the caller sets
    them once, only on a span that records (the SDK cleans attributes given at the start
    twice, once for the sampler; the samplers ``OTEL_TRACES_SAMPLER`` names read none)."""
    return tracing.tracer().start_span(name, context=parent(row), kind=kind, start_time=start_time)


def outcome_of(outcome: Outcome) -> str:
    return f"result_{outcome.status}" if outcome.action == "result" else outcome.action


def _end(
    span: trace.Span,
    outcome: Outcome,
    attributes: dict[str, Any] | None = None,
    end_time: int | None = None,
) -> None:
    """End ``span`` with its outcome and ``attributes``, set at once (one lock, not one
    per attribute)."""
    if not span.is_recording():  # sampled out: nothing to set, nothing exported
        span.end(end_time=end_time)
        return
    what = outcome_of(outcome)
    attributes = attributes or {}
    attributes["outbox.outcome"] = what
    if what in ERRORS:
        attributes["error.type"] = what
        description = outcome.error if tracing.capture_content() else None
        span.set_status(trace.Status(trace.StatusCode.ERROR, description))
    span.set_attributes(attributes)
    span.end(end_time=end_time)


# -- tool calls -------------------------------------------------------------------------


def tool_started(row: Claimed, start_time: int | None = None) -> trace.Span | None:
    """The ``execute_tool`` span of a call about to run (None: tracing is off, or its run
    is sampled out)."""
    if not tracing.records(row.run_id, row.traceparent, row.tracestate):
        return None
    span = _start(row, f"execute_tool {row.tool_name}", trace.SpanKind.INTERNAL, start_time)
    if not span.is_recording():
        return span
    attributes = _common(row)
    attributes.update(
        {
            gen_ai.GEN_AI_OPERATION_NAME: "execute_tool",
            gen_ai.GEN_AI_TOOL_NAME: row.tool_name or "",
            gen_ai.GEN_AI_TOOL_CALL_ID: row.tool_call_id or "",
            "outbox.idempotency.mode": row.idempotency_mode or "",
            "outbox.idempotency.key": row.idempotency_key or "",
        }
    )
    if row.approved_by is not None:
        # It waited for a reviewer: who approved it, and how long it waited for that.
        attributes["outbox.approval.decided_by"] = row.approved_by
        attributes["outbox.approval.wait_s"] = row.approval_wait_s or 0.0
    if tracing.capture_content():
        attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = json.dumps(row.arguments)
    span.set_attributes(attributes)
    return span


def tool_ended(span: trace.Span | None, outcome: Outcome) -> None:
    """End a call's span with its outcome (its result too, when content capture is on)."""
    if span is not None:
        _end(span, outcome, _result(outcome))


def tool_ran(outcome: Outcome) -> None:
    """The span of an in-process call that already ran (a chunk of them, ``relay.inprocess``):
    recorded after the fact, over the time it took."""
    row = outcome.row
    if not tracing.records(row.run_id, row.traceparent, row.tracestate):
        return
    end = time.time_ns()
    span = tool_started(row, start_time=end - int(outcome.duration_s * 1e9))
    if span is not None:
        _end(span, outcome, _result(outcome), end_time=end)


def _result(outcome: Outcome) -> dict[str, Any]:
    """A call's result as an attribute, when content capture is on."""
    if tracing.capture_content() and outcome.action == "result" and outcome.status == "ok":
        return {gen_ai.GEN_AI_TOOL_CALL_RESULT: json.dumps(outcome.output)}
    return {}


# -- model turns ------------------------------------------------------------------------


def chat_started(
    row: Claimed, run: dict[str, Any], step_no: int, messages: Any
) -> trace.Span | None:
    """The ``chat`` span of a model turn about to be requested (None: tracing is off, or
    its run is sampled out)."""
    if not tracing.records(row.run_id, row.traceparent, row.tracestate):
        return None
    span = _start(row, f"chat {run['model']}", trace.SpanKind.CLIENT)
    if not span.is_recording():
        return span
    attributes = _common(row)
    attributes.update(
        {
            gen_ai.GEN_AI_OPERATION_NAME: "chat",
            gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
            gen_ai.GEN_AI_REQUEST_MODEL: run["model"],
            "outbox.step": step_no,
        }
    )
    if tracing.capture_content():
        attributes[gen_ai.GEN_AI_INPUT_MESSAGES] = json.dumps(messages, default=str)
    span.set_attributes(attributes)
    return span


def chat_ended(span: trace.Span | None, outcome: Outcome) -> None:
    if span is None:
        return
    if not span.is_recording():
        span.end()
        return
    turn = outcome.output
    attributes: dict[str, Any] = {}
    if isinstance(turn, ModelTurnIn):
        attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] = turn.input_tokens
        attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] = turn.output_tokens
        if turn.response_id:
            attributes[gen_ai.GEN_AI_RESPONSE_ID] = turn.response_id
        if tracing.capture_content():
            said = {
                "content": turn.content,
                "tool_calls": [c.model_dump(mode="json") for c in turn.tool_calls],
            }
            attributes[gen_ai.GEN_AI_OUTPUT_MESSAGES] = json.dumps(said)
    _end(span, outcome, attributes)


# -- runs -------------------------------------------------------------------------------


def run_ended(row: Claimed, status: str) -> None:
    """Record the ``invoke_agent`` span of ``row``'s run, which its outcome just ended."""
    if tracing.enabled() and row.run_started_at is not None:
        _record_run(
            row.run_id,
            row.thread_id,
            row.tenant_id,
            row.model,
            row.traceparent,
            row.tracestate,
            row.run_started_at,
            status,
        )


def run_expired(run: dict[str, Any]) -> None:
    """Record the ``invoke_agent`` span of a run the sweep expired (its row, ended)."""
    if tracing.enabled():
        _record_run(
            run["id"],
            run["thread_id"],
            run["tenant_id"],
            run["model"],
            run["traceparent"],
            run["tracestate"],
            run["created_at"].timestamp(),
            run["status"],
        )


def run_cancelled(run: dict[str, Any]) -> None:
    """Record the ``invoke_agent`` span of a run its backend or an operator cancelled (its
    row, taken by the sweep once the cancel committed: ``take_cancelled_runs``), from its
    creation to its end, naming who cancelled it."""
    if tracing.enabled():
        _record_run(
            run["id"],
            run["thread_id"],
            run["tenant_id"],
            run["model"],
            run["traceparent"],
            run["tracestate"],
            run["created_at"].timestamp(),
            run["status"],
            ended_at_s=run["ended_at"].timestamp() if run["ended_at"] else None,
            ended_by=run["cancelled_by"],
        )


def _record_run(
    run_id: uuid.UUID,
    thread_id: Any,
    tenant_id: str,
    model: str | None,
    traceparent: str | None,
    tracestate: str | None,
    started_at_s: float,
    status: str,
    ended_at_s: float | None = None,
    ended_by: str | None = None,
) -> None:
    attributes: dict[str, Any] = {
        gen_ai.GEN_AI_OPERATION_NAME: "invoke_agent",
        gen_ai.GEN_AI_CONVERSATION_ID: str(thread_id),
        "outbox.tenant.id": tenant_id,
        "outbox.run.id": str(run_id),
        "outbox.run.status": status,
        "outbox.outcome": status,  # as on chat and execute_tool: how the span ended
    }
    if model:
        attributes[gen_ai.GEN_AI_REQUEST_MODEL] = model
    if ended_by:
        attributes["outbox.run.ended_by"] = ended_by
    error = None if status == "completed" else status
    tracing.record_run(run_id, traceparent, tracestate, started_at_s, attributes, error, ended_at_s)
