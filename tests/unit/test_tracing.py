"""outbox.tracing without a database: a run's ids, the headers it hands out, sampling."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import tracing

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
