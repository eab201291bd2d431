"""Traces of agent runs: OpenTelemetry ids, one trace per run across processes and restarts.

A run outlives any process that works on it (its turns and calls are claimed by whichever
relay is free, a killed relay's rows by another), so no process holds its span open, and
no relay builds a span at all: the trace exporter (``outbox.trace_export``) builds a run's spans
from the database once it has ended. What holds them together is that every id follows
from what is stored. The run's ``invoke_agent`` span: its trace id is that of the context
current when a backend started the run (``runs.traceparent``: the backend's span through
the Python API, the ``p_traceparent`` argument of ``start_run_v2``, the ``traceparent``
header of a request to ``outbox serve``), or a hash of the run id when there was none; its
span id is another hash of the run id. An attempt's ``chat`` or ``execute_tool`` span: a
hash of its outbox row and claim number (``attempt_span_id``). So a relay writes the
``traceparent`` a tool or model receives without the SDK (``attempt_headers``, or with
tracing off ``run_headers``), and the exporter later gives the span those very ids.

The spans follow OpenTelemetry's GenAI semantic conventions (``gen_ai.*``); ours are
``outbox.*``. Nothing a model or tool said or was given (messages, arguments, results,
error bodies) goes into a span unless ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
is true, the conventions' opt-in; credentials never do.

Spans are made in this process only by ``outbox serve`` (its HTTP server spans,
``server_span``) and by whoever calls ``install`` (tests, a backend's own spans); the SDK
is imported only then, or for the sampler's decision when OpenTelemetry's variables ask for
traces. This module uses OpenTelemetry's API and SDK only; it writes no tracing of its own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# A W3C traceparent of version 00, as start_run_v2 accepts it (lower case, ids not zero).
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE = 512  # characters of a tracestate stored with a run
SCOPE = "outbox"  # the instrumentation scope of our spans

_propagator = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


# -- the run's trace --------------------------------------------------------------------


def caller_context() -> tuple[str | None, str | None]:
    """The ``traceparent`` and ``tracestate`` of the span current here (a backend's, when it
    starts a run), or ``(None, None)`` when there is none."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None, None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")


def agent_span_id(run_id: uuid.UUID) -> int:
    """The span id of a run's ``invoke_agent`` span: the same in every process."""
    return int.from_bytes(hashlib.blake2b(run_id.bytes, digest_size=8).digest(), "big") or 1


def own_trace_id(run_id: uuid.UUID) -> int:
    """The trace id of a run started without a trace context: a hash of the run id, the
    same in every process. Not the run id's own bits: a uuid4's fixed variant bits fall
    in the half of the id that ratio samplers read, and they would keep every such run
    or none."""
    digest = hashlib.blake2b(run_id.bytes, digest_size=16, person=b"outbox-trace").digest()
    return int.from_bytes(digest, "big") or 1


@functools.lru_cache(maxsize=16_384)
def _parent(traceparent: str | None, tracestate: str | None) -> trace.SpanContext | None:
    """The caller's span stored with a run, parsed once for the runs of the moment."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = trace.get_current_span(_propagator.extract(carrier)).get_span_context()
    return context if context.is_valid else None


def caller_span(traceparent: str | None, tracestate: str | None) -> trace.SpanContext | None:
    """The span a run's stored context names (the parent of its ``invoke_agent`` span), or
    None for a run that is a trace of its own."""
    return _parent(traceparent, tracestate)


@functools.lru_cache(maxsize=16_384)
def run_context(run_id: uuid.UUID, traceparent: str | None, tracestate: str | None) -> Any:
    """``new_run_context``, kept for the runs of the moment (every span of a run has the
    same parent): a span costs a look-up, not a parse."""
    return new_run_context(run_id, traceparent, tracestate)


def new_run_context(run_id: uuid.UUID, traceparent: str | None, tracestate: str | None) -> Any:
    """The context whose current span is the run's ``invoke_agent`` span (remote: another
    process records it): the parent of every span of the run.

    A run that continues a caller's trace is sampled as the caller said (its flags). One
    that starts its own is sampled as this process's sampler decides for its trace id,
    which every process decides alike (``OTEL_TRACES_SAMPLER``: a ratio samples by trace
    id), so with sampling on, all of a run's spans are kept or none; off, tools and models
    are told it is sampled, for their own spans' sake."""
    parent = _parent(traceparent, tracestate)
    span = trace.SpanContext(
        trace_id=parent.trace_id if parent else own_trace_id(run_id),
        span_id=agent_span_id(run_id),
        is_remote=True,
        trace_flags=parent.trace_flags if parent else _root_flags(own_trace_id(run_id)),
        trace_state=parent.trace_state if parent else None,
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span))


def _root_flags(trace_id: int) -> trace.TraceFlags:
    """Whether a run of its own trace is sampled: as the installed sampler decides, else as
    the one ``OTEL_TRACES_SAMPLER`` names when traces are wanted (a relay that only names
    the spans the trace exporter builds decides as the exporter will: the samplers decide
    by trace id alone), else sampled (for the tools' and models' own spans). With no
    sampler the SDK is not imported: a relay with traces off never needs it (a megabyte)."""
    sampler = _provider.sampler if _provider is not None else _env_sampler()
    sampled = sampler is None
    if not sampled:
        from opentelemetry.sdk.trace.sampling import Decision

        decision = sampler.should_sample(otel_context.Context(), trace_id, "invoke_agent")
        sampled = decision.decision is Decision.RECORD_AND_SAMPLE
    return trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT)


@functools.lru_cache(maxsize=1)
def _env_sampler() -> Any:
    """The sampler OpenTelemetry's variables name, when they ask for traces (None: not)."""
    if not wanted():
        return None
    from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

    return _get_from_env_or_default()


def attempt_span_id(outbox_id: int, attempt: int) -> int:
    """The span id of one attempt (the claim ``attempt`` of outbox row ``outbox_id``): its
    ``chat`` or ``execute_tool`` span, the same in the relay that names it to the tool or
    model and in the trace exporter that builds it from the journal."""
    key = outbox_id.to_bytes(8, "big", signed=True) + attempt.to_bytes(4, "big", signed=True)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") or 1


def attempt_headers(
    run_id: uuid.UUID, traceparent: str | None, tracestate: str | None, span_id: int
) -> dict[str, str]:
    """``traceparent``/``tracestate`` naming the attempt span ``span_id`` of the run, written
    without the SDK: its trace and sampled flag are the run's."""
    context = trace.get_current_span(run_context(run_id, traceparent, tracestate))
    ids = context.get_span_context()
    carrier = {"traceparent": f"00-{ids.trace_id:032x}-{span_id:016x}-{ids.trace_flags:02x}"}
    if ids.trace_state:
        carrier["tracestate"] = ids.trace_state.to_header()
    return carrier


def sampled(run_id: uuid.UUID, traceparent: str | None, tracestate: str | None) -> bool:
    """Whether the run's spans are kept (its context's sampled flag: the caller's, or the
    sampler's decision for its own trace id); a look-up for the runs of the moment."""
    span = trace.get_current_span(run_context(run_id, traceparent, tracestate))
    return bool(span.get_span_context().trace_flags.sampled)


def names_attempts() -> bool:
    """Whether a relay names each attempt's span to its tool or model (``attempt_headers``):
    when traces are wanted here (OpenTelemetry's variables, or ``install``), so that the
    trace exporter's spans are the parents of theirs. Otherwise they get the run's span."""
    return _provider is not None or _env_sampler() is not None


@functools.lru_cache(maxsize=16_384)
def run_headers(
    run_id: uuid.UUID, traceparent: str | None, tracestate: str | None
) -> dict[str, str]:
    """``headers`` of the run's own context, the same for every request of the run: what
    tools and models receive with tracing off (kept for the runs of the moment, so a
    request costs a look-up; never change the dict returned). Its context is not kept
    too: with tracing off nothing else asks for it, and a relay with thousands of runs in
    flight would keep both for each (half a kilobyte a run)."""
    return headers(new_run_context(run_id, traceparent, tracestate))


def headers(context: Any) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) naming the current span of ``context``: what a
    tool or model receives, so its own spans join the run's trace."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=context)
    return carrier


# -- spans ------------------------------------------------------------------------------


def enabled() -> bool:
    """Whether spans are recorded in this process (``setup`` or ``install``)."""
    return _provider is not None


def tracer() -> trace.Tracer:
    return _tracer


@contextmanager
def server_span(
    name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any]
) -> Iterator[trace.Span]:
    """The span of a request to ``outbox serve``, continuing the caller's ``traceparent``;
    current while the request is handled, so a run it starts stores it. Off, the caller's
    context alone is made current (a run started then still continues it)."""
    context = _propagator.extract(carrier)
    if _provider is None:
        token = otel_context.attach(context)
        try:
            yield trace.INVALID_SPAN
        finally:
            otel_context.detach(token)
        return
    with _tracer.start_as_current_span(
        name, context=context, kind=trace.SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


# -- setting it up ----------------------------------------------------------------------


def wanted() -> bool:
    """Whether OpenTelemetry's variables ask for traces: an OTLP endpoint, or a traces
    exporter other than ``none``; never with ``OTEL_SDK_DISABLED=true``."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup(service_name: str) -> bool:
    """Record spans in this process and export them as OpenTelemetry's variables say
    (``OTEL_TRACES_EXPORTER``: ``otlp``, OTLP over HTTP/protobuf to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, or ``console``), in batches (``OTEL_BSP_*``), under
    ``OTEL_SERVICE_NAME`` (else ``service_name``); whether it did. A process that does
    not call it records nothing."""
    if not wanted():
        return False
    install(*span_exporters(), service_name=service_name)
    return True


def _exporter_names() -> list[str]:
    names = [
        n.strip().lower()
        for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        if n.strip()
    ]
    for name in names:
        if name not in ("otlp", "console"):
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={name!r} is not supported here: use otlp, console or none"
            )
    return names


def check_exporters() -> None:
    """Refuse an ``OTEL_TRACES_EXPORTER`` this project cannot export to (ValueError naming
    it), when traces are wanted."""
    if wanted():
        _exporter_names()


def span_exporters() -> list[SpanExporter]:
    """The exporters OpenTelemetry's variables name (``OTEL_TRACES_EXPORTER``: ``otlp``,
    OTLP over HTTP/protobuf to ``OTEL_EXPORTER_OTLP_ENDPOINT``, or ``console``)."""
    exporters: list[SpanExporter] = []
    for name in _exporter_names():
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        else:
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    return exporters


def install(
    *exporters: SpanExporter, service_name: str = "outbox", batch: bool = True
) -> TracerProvider:
    """Record spans in this process and hand them to ``exporters`` (in batches, or one by
    one with ``batch=False``, as tests want: the SDK's ``InMemorySpanExporter`` sees a span
    the moment it ends). Replaces what an earlier call installed."""
    global _provider, _tracer
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    class OneResource(Resource):
        """The SDK's resource, hashed once: OTLP's encoder groups every span it encodes by
        resource, and a ``Resource`` hashes by serializing its attributes to JSON (a tenth
        of a span's encoding). Immutable, like any ``Resource``."""

        @functools.cached_property
        def _hash(self) -> int:
            return super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    shutdown()
    _forget()  # the sampler decides them from now on
    created = Resource.create(
        {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    )
    resource = OneResource(created.attributes, created.schema_url)
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
    _provider, _tracer = provider, provider.get_tracer(SCOPE)
    return provider


def shutdown() -> None:
    """Export what is left and record no more spans (at a process's orderly exit)."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider, _tracer = None, trace.NoOpTracer()
    _forget()


def _forget() -> None:
    """Drop the contexts kept for the runs of the moment (their sampled flags came from the
    sampler installed then)."""
    run_headers.cache_clear()
    run_context.cache_clear()
    _env_sampler.cache_clear()
