"""outbox.trace_context without a database: a run's ids, the headers it hands out, sampling."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import trace_context, trace_export

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_runs_context_is_the_same_in_every_call_and_continues_the_callers():
    run = uuid.uuid4()
    own = trace_context.headers(trace_context.run_context(run, None, None))["traceparent"]
    assert (
        own
        == f"00-{trace_context.own_trace_id(run):032x}-{trace_context.agent_span_id(run):016x}-01"
    )
    assert trace_context.run_headers(run, None, None)["traceparent"] == own
    continued = trace_context.headers(trace_context.run_context(run, CALLER, "k=v"))
    assert continued == {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-"
        f"{trace_context.agent_span_id(run):016x}-01",
        "tracestate": "k=v",
    }


def test_a_runs_headers_are_kept_without_its_context():
    """With tracing off a request costs a look-up of its run's headers; the run's context
    behind them is not kept as well (thousands of runs in flight would keep both)."""
    trace_context.run_context.cache_clear()
    run = uuid.uuid4()
    headers = trace_context.run_headers(run, CALLER, None)
    assert trace_context.run_headers(run, CALLER, None) is headers
    assert trace_context.run_context.cache_info().currsize == 0


def test_a_relay_with_traces_off_never_imports_the_sdk():
    """A megabyte of a relay's memory, which its runs in flight would seem to hold."""
    code = (
        "import sys, uuid\n"
        "from outbox import trace_context\n"
        "trace_context.run_headers(uuid.uuid4(), None, None)\n"
        "assert 'opentelemetry.sdk.trace' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_a_ratio_sampler_keeps_about_its_share_of_runs_of_their_own(monkeypatch):
    """A run's own trace id is spread over the bits a ratio sampler reads (a uuid4's own
    bits are not: every run would be kept, or none)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    trace_context.install(InMemorySpanExporter(), batch=False)
    try:
        kept = sum(
            trace_context.run_headers(uuid.uuid4(), None, None)["traceparent"].endswith("1")
            for _ in range(400)
        )
    finally:
        trace_context.shutdown()
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
    assert not trace_context.TRACEPARENT.fullmatch(value)
    assert trace_context.TRACEPARENT.fullmatch(CALLER)


def test_off_unless_opentelemetrys_variables_ask(monkeypatch):
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    assert not trace_context.wanted()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert trace_context.wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not trace_context.wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not trace_context.wanted()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin' is not supported"):
        trace_context.setup("outbox-relay")
    assert not trace_context.enabled()


def test_a_relay_without_the_sdk_names_attempts_as_the_exporter_samples_them(monkeypatch):
    """No tracer provider in the relay: the sampled flag it sends with an attempt's span is
    the decision the trace exporter's sampler (the same variables) makes for the run, and
    the span id it sends is the one the exporter gives the span."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    trace_context.shutdown()  # forget what was decided under other variables
    try:
        assert trace_context.names_attempts() and not trace_context.enabled()
        builder = trace_export.SpanBuilder()
        kept = 0
        for _ in range(200):
            run_id = uuid.uuid4()
            span_id = trace_context.attempt_span_id(7, 1)
            sent = trace_context.attempt_headers(run_id, None, None, span_id)["traceparent"]
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
            trace_export.run_spans(builder, run, [event], {1: call}, {})
            made = builder.take()
            assert sent.endswith("-01") == bool(made)
            assert sent.split("-")[1] == f"{trace_context.own_trace_id(run_id):032x}"
            if made:
                tool = next(s for s in made if s.name == "execute_tool t")
                assert tool.context is not None and tool.context.span_id == span_id
                assert tool.parent is not None
                assert tool.parent.span_id == trace_context.agent_span_id(run_id)
            kept += bool(made)
        assert 50 < kept < 150
    finally:
        trace_context.shutdown()
