"""The relay's Prometheus metrics by tool, model and tenant, scraped over HTTP as Prometheus
would: latency histograms, tokens, errors, and the work waiting for a person (a call waiting
for approval, a run parked for an operator)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from outbox import trace_context, trace_export, writer
from outbox.relay import metrics
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
REFUND = {"name": "refund", "arguments": {"order": 42}}
FLAKY = {"name": "flaky", "arguments": {}}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script("ticket", [{"tool_calls": [TICKET, REFUND]}, {"text": "done"}])
        server.add_script("flaky", [{"tool_calls": [FLAKY]}, {"text": "done"}])
        yield server


def start(
    conn: psycopg.Connection[Any],
    model: ScriptedModel,
    script: str,
    tenant: str = TENANT,
    tools: tuple[str, ...] = ("create_ticket", "refund", "flaky"),
) -> writer.RunRef:
    thread = writer.create_thread(conn, tenant)
    return writer.start_run(
        conn,
        StartRun(
            tenant_id=tenant,
            thread_id=thread.id,
            model="scripted-1",
            message=f"script:{script} go" if script else "hello",
            tools=list(tools),
            base_url=model.url + "/v1",
        ),
    )


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_latency_tokens_errors_and_work_waiting_for_people_by_tool_model_and_tenant(db_url, model):
    with FakeToolService(standard_tools=False) as service:
        service.add_tool("create_ticket", "key")
        service.add_tool("refund", "key")
        service.add_tool("flaky", "key").fail(status=503, n=None)
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "create_ticket", "key")
            register_tool(conn, service, "refund", "key", risk_tier="high")  # waits for a person
            register_tool(conn, service, "flaky", "key", max_attempts=1)  # parked at once
            start(conn, model, "ticket")
            start(conn, model, "flaky")
            plain = start(conn, model, "")
            conn.commit()
        port = free_port()
        with relay_thread(db_url, kinds=ALL_KINDS, metrics_port=port):
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [plain.id])
                    == "completed"
                    and scalar(
                        db_url, "SELECT count(*) FROM outbox.approvals WHERE status = 'pending'"
                    )
                    and scalar(
                        db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
                    )
                    and scalar(
                        db_url,
                        "SELECT status FROM outbox.tool_calls WHERE tool_name = 'create_ticket'",
                    )
                    == "succeeded"
                ),
                what="a completed run, a call waiting for approval, a parked call, a ticket",
            )
            samples = wait_until(
                lambda: (
                    (s := scrape(port))
                    and value(s, "outbox_approvals_waiting", tenant=TENANT)
                    and value(s, "outbox_runs_parked", tenant=TENANT)
                    and s
                ),
                what="the gauges of work waiting for people",
            )

    assert value(samples, "outbox_approvals_waiting", tenant=TENANT) == 1
    assert value(samples, "outbox_runs_parked", tenant=TENANT) == 1
    assert (value(samples, "outbox_approvals_oldest_waiting_seconds") or 0) > 0
    tool = {"tool": "create_ticket", "tenant": TENANT, "outcome": "result_ok"}
    assert value(samples, "outbox_relay_tool_call_seconds_count", **tool) == 1
    flaky = {"tool": "flaky", "tenant": TENANT, "outcome": "retry"}
    assert value(samples, "outbox_relay_tool_call_seconds_count", **flaky) == 1
    errors = {"kind": "tool_call", "tenant": TENANT, "outcome": "retry"}
    assert value(samples, "outbox_relay_errors_total", **errors) == 1
    turns = {"model": "scripted-1", "tenant": TENANT, "outcome": "turn"}
    assert (value(samples, "outbox_relay_model_turn_seconds_count", **turns) or 0) >= 3
    for kind in ("input", "output"):
        tokens = {"model": "scripted-1", "tenant": TENANT, "type": kind}
        assert (value(samples, "outbox_relay_tokens_total", **tokens) or 0) > 0
    # Counted beside input (the first turns of these runs have no prefix to read yet).
    cached = {"model": "scripted-1", "tenant": TENANT, "type": "cached_input"}
    assert value(samples, "outbox_relay_tokens_total", **cached) is not None
    ran = {"tenant": TENANT, "status": "completed"}
    assert value(samples, "outbox_relay_run_seconds_count", **ran) == 1


def test_claim_to_start_is_by_tenant_and_tenants_past_the_cap_share_one_label(
    db_url, model, monkeypatch
):
    # A process labels at most MAX_TENANT_LABELS tenants; here 2, and three tenants ran.
    monkeypatch.setattr(metrics, "MAX_TENANT_LABELS", 2)
    tenants = ("acme", "globex", "initech")
    with psycopg.connect(db_url) as conn:
        runs = [start(conn, model, "", tenant, tools=()) for tenant in tenants]
        conn.commit()
    port = free_port()
    with relay_thread(db_url, kinds=ALL_KINDS, metrics_port=port):
        wait_until(
            lambda: all(
                scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [r.id])
                == "completed"
                for r in runs
            ),
            what="the three runs to complete",
        )
        samples = scrape(port)
    counted = {
        dict(labels)["tenant"]: n
        for (name, labels), n in samples.items()
        if name == "outbox_relay_claim_to_start_seconds_count"
    }
    # Each run's one model turn was claimed and started: one per tenant, the third's under
    # the shared label, whichever tenant came last.
    assert sum(counted.values()) == 3
    assert len(counted) == 3 and counted.pop(metrics.OTHER_TENANTS) == 1
    assert set(counted) < set(tenants) and set(counted.values()) == {1}
    ran = {
        dict(labels)["tenant"]
        for (name, labels), n in samples.items()
        if name == "outbox_relay_run_seconds_count"
    }
    assert ran == set(counted) | {metrics.OTHER_TENANTS}


def test_a_tracing_relay_serves_how_far_behind_the_trace_exporter_is(db_url, model):
    """Runs ended and no exporter ran: a relay with tracing on counts them, and the age
    of the oldest, until an exporter has taken them."""
    trace_context.install(InMemorySpanExporter(), batch=False)  # the relay's tracing is on
    try:
        with psycopg.connect(db_url) as conn:
            runs = [start(conn, model, "", tools=()) for _ in range(2)]
            conn.commit()
        port = free_port()
        with relay_thread(db_url, kinds=ALL_KINDS, metrics_port=port):
            wait_until(
                lambda: (s := scrape(port)) and value(s, "outbox_traces_due_runs") == 2 and s,
                what="the two ended runs counted as due",
            )
            assert (value(scrape(port), "outbox_traces_lag_seconds") or 0) > 0
            with psycopg.connect(db_url) as conn:
                assert trace_export.export_due(conn, [InMemorySpanExporter()]).runs == len(runs)
            wait_until(
                lambda: value(scrape(port), "outbox_traces_due_runs") == 0,
                what="the gauge to drop once they were exported",
            )
            assert value(scrape(port), "outbox_traces_lag_seconds") == 0
    finally:
        trace_context.shutdown()
