"""Links from a run's timeline to its trace in a tracing UI (``outbox serve
--trace-url-template``).

The template is the operator's, checked once when the server starts: an http(s) URL with
``{trace_id}`` and, optionally, ``{span_id}`` (and no other placeholder). Only those two are
substituted, and only with hex digits computed here (``outbox.trace_context``: the run's
trace id, the run's ``invoke_agent`` span, an attempt's span from its journal event), so
nothing a model, tool or caller wrote reaches a link; the page escapes it too and marks it
``rel="noopener noreferrer"``.
"""

from __future__ import annotations

import re
import uuid

from outbox import trace_context
from outbox.schemas import url_problem

PLACEHOLDER = re.compile(r"\{[^{}]*\}")
FIELDS = ("{trace_id}", "{span_id}")
HEX_SPAN = re.compile(r"[0-9a-f]{16}")  # a span id as a journal event's detail keeps it


def template_problem(template: str) -> str | None:
    """Why ``template`` is no trace URL template, or None when it is one."""
    others = sorted({p for p in PLACEHOLDER.findall(template) if p not in FIELDS})
    if "{trace_id}" not in template:
        return f"{template!r} has no {{trace_id}}: e.g. 'https://jaeger.example/trace/{{trace_id}}'"
    if others or template.count("{") != template.count("}") or "{{" in template:
        return f"{template!r} holds placeholders other than {{trace_id}} and {{span_id}}"
    return url_problem(link(template, "0" * 32, "0" * 16))


def link(template: str, trace_id: str, span_id: str) -> str:
    """``template`` with the ids (hex digits) substituted."""
    return template.replace("{trace_id}", trace_id).replace("{span_id}", span_id)


def run_trace(run_id: uuid.UUID, traceparent: str | None, tracestate: str | None) -> str:
    """The trace id (32 hex digits) of a run: its caller's, or its own (outbox.trace_context)."""
    parent = trace_context.caller_span(traceparent, tracestate)
    return f"{parent.trace_id if parent else trace_context.own_trace_id(run_id):032x}"


def run_span(run_id: uuid.UUID) -> str:
    """The span id of the run's ``invoke_agent`` span (16 hex digits)."""
    return f"{trace_context.agent_span_id(run_id):016x}"


def event_span(detail: object) -> str | None:
    """The span id of the attempt a journal event completed (its ``detail.span.id``, as
    the trace exporter builds the span), or None."""
    span = detail.get("span") if isinstance(detail, dict) else None
    ident = span.get("id") if isinstance(span, dict) else None
    return ident if isinstance(ident, str) and HEX_SPAN.fullmatch(ident) else None
