"""outbox.tracing without a database: a run's ids, the headers it hands out, sampling."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import traces, tracing

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_runs_context_is_the_same_in_every_call_and_continues_the_callers():
    run = uuid.uuid4()
    own = tracing.headers(tracing.run_context(run, None, None))["traceparent"]
    assert own == f"00-{tracing.own_trace_id(run):032x}-{tracing.agent_span_id(run):016x}-01"
    assert tracing.run_headers(run, None, None)["traceparent"] == own
    continued = tracing.headers(tracing.run_context(run, CALLER, "k=v"))
    assert continued == {
        "traceparent": f"00-4bf92f3577b34da6a3ce929d0e0e4736-{tracing.agent_span_id(run):016x}-01",
        "tracestate": "k=v",
    }


def test_a_ratio_sampler_keeps_about_its_share_of_runs_of_their_own(monkeypatch):
    """A run's own trace id is spread over the bits a ratio sampler reads (a uuid4's own
    bits are not: every run would be kept, or none)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    tracing.install(InMemorySpanExporter(), batch=False)
    try:
        kept = sum(
            tracing.run_headers(uuid.uuid4(), None, None)["traceparent"].endswith("1")
            for _ in range(400)
        )
    finally:
        tracing.shutdown()
    assert 120 < kept < 280  # binomial(400, 0.5): outside this once in 10^15


@pytest.mark.parametrize(
    "value",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    ],
)
def test_only_a_w3c_traceparent_of_version_00_is_accepted(value):
    assert not tracing.TRACEPARENT.fullmatch(value)
    assert tracing.TRACEPARENT.fullmatch(CALLER)


def test_off_unless_opentelemetrys_variables_ask(monkeypatch):
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    assert not tracing.wanted()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not tracing.wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin' is not supported"):
        tracing.setup("outbox-relay")
    assert not tracing.enabled()


def test_a_relay_without_the_sdk_names_attempts_as_the_exporter_samples_them(monkeypatch):
    """No tracer provider in the relay: the sampled flag it sends with an attempt's span is
    the decision the trace exporter's sampler (the same variables) makes for the run, and
    the span id it sends is the one the exporter gives the span."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    tracing.shutdown()  # forget what was decided under other variables
    try:
        assert tracing.names_attempts() and not tracing.enabled()
        builder = traces.SpanBuilder()
        kept = 0
        for _ in range(200):
            run_id = uuid.uuid4()
            span_id = tracing.attempt_span_id(7, 1)
            sent = tracing.attempt_headers(run_id, None, None, span_id)["traceparent"]
            run = {
                "id": run_id, "thread_id": uuid.uuid4(), "tenant_id": "acme", "model": "m",
                "traceparent": None, "tracestate": None, "status": "completed",
                "cancelled_by": None, "created_s": 1.0, "ended_s": 2.0,
            }  # fmt: skip
            event = {
                "event": "tool_result.stored", "tool_call_ref": 1, "attempt": 1,
                "detail": {"span": {"id": f"{span_id:016x}", "start": 1.1, "end": 1.2,
                                    "n": 1, "outcome": "result_ok"}},
            }  # fmt: skip
            call = {
                "tool_call_id": "c", "tool_name": "t", "idempotency_mode": "key",
                "idempotency_key": "k", "approved_by": None, "approval_wait_s": None,
            }  # fmt: skip
            traces.run_spans(builder, run, [event], {1: call}, {})
            made = builder.take()
            assert sent.endswith("-01") == bool(made)
            assert sent.split("-")[1] == f"{tracing.own_trace_id(run_id):032x}"
            if made:
                tool = next(s for s in made if s.name == "execute_tool t")
                assert tool.context is not None and tool.context.span_id == span_id
                assert tool.parent is not None
                assert tool.parent.span_id == tracing.agent_span_id(run_id)
            kept += bool(made)
        assert 50 < kept < 150
    finally:
        tracing.shutdown()
