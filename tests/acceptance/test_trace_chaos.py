"""One trace for a run whose relay is killed with -9 mid-run and finished by another relay.

The backend starts the run inside a span of its own (this process, the SDK's in-memory
exporter). The relays are processes of their own (``outbox relay``), each with OpenTelemetry's
variables pointing at a receiver on loopback (``tests.otlp_receiver``), so each starts a
trace exporter beside it (``outbox traces export``), which exports the spans it builds from
the database over OTLP/HTTP. The first relay is killed with -9 while the run's parallel
tool calls are in flight (its exporter, orphaned, stops); the second rescues them after the
lease and finishes the run. The spans of the killed relay's finished work are not lost:
they are built from its committed writes. Every span that arrived belongs to the backend's
trace and hangs under a span that arrived too (or the backend's own).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import trace_context, writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.otlp_receiver import otlp_receiver
from tests.relay_harness import FAST, register_tool, scalar, start_relay_process, wait_until

TICKET_DONE = (
    "SELECT status = 'succeeded' FROM outbox.tool_calls "
    "WHERE run_id = %s AND tool_name = 'create_ticket'"
)
KINDS = [a for k in ("model_turn", "tool_call", "deliver_batch") for a in ("--kind", k)]
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "sorry"}}


@pytest.fixture
def backend_spans():
    exporter = InMemorySpanExporter()
    trace_context.install(exporter, batch=False)
    yield exporter
    trace_context.shutdown()


def test_a_relay_killed_mid_run_leaves_one_connected_trace(db_url, tmp_path: Path, backend_spans):
    with FakeToolService() as service, ScriptedModel() as model, otlp_receiver() as receiver:
        model.add_script("parallel", [{"tool_calls": [EMAIL, TICKET]}, {"text": "all done"}])
        service.tool("send_email").latency(4.0, n=1)  # in flight when the relay dies
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "create_ticket", "key")
            register_tool(conn, service, "send_email", "key")
            with trace_context.tracer().start_as_current_span("POST /refunds") as backend:
                thread = writer.create_thread(conn, "acme")
                run = writer.start_run(
                    conn,
                    StartRun(
                        tenant_id="acme",
                        thread_id=thread.id,
                        model="scripted-1",
                        message="script:parallel please",
                        tools=["create_ticket", "send_email"],
                        base_url=model.url + "/v1",
                    ),
                )
            conn.commit()
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        log = tmp_path / "relays.log"
        first = start_relay_process(db_url, log, *KINDS, *FAST, env=env)
        second = None
        try:
            email = service.tool("send_email")
            wait_until(
                lambda: email.starts and scalar(db_url, TICKET_DONE, [run.id]),
                what="the slow call under way; the first turn and the quick call done",
            )
            assert receiver.received() == []  # spans are built once their run has ended
            first.kill()
            first.wait(timeout=30)
            second = start_relay_process(db_url, log, *KINDS, *FAST, env=env)
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id])
                    == "completed"
                ),
                what="the second relay to finish the run",
            )
            wait_until(
                lambda: any(s.name == "invoke_agent" for s in receiver.received()),
                what="the run's invoke_agent span to be exported",
            )
        finally:
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)

    trace_id = backend.get_span_context().trace_id
    received = receiver.received()
    assert {s.trace_id for s in received} == {trace_id}
    known = {backend.get_span_context().span_id} | {s.span_id for s in received}
    orphans = [s for s in received if s.parent_span_id not in known]
    assert orphans == [], f"spans whose parent is in no exported span: {orphans}"
    (agent,) = [s for s in received if s.name == "invoke_agent"]
    assert agent.parent_span_id == backend.get_span_context().span_id
    assert agent.span_id == trace_context.agent_span_id(run.id)
    names = sorted(s.name for s in received if s.parent_span_id == agent.span_id)
    # Both turns and both calls: the first turn and the quick call done by the killed relay,
    # the slow call (whose attempt there wrote nothing: no span) and the last turn by the
    # second, which may have waited for the killed relay's request to settle first (an
    # attempt of its own).
    assert sorted(set(names)) == [
        "chat scripted-1",
        "execute_tool create_ticket",
        "execute_tool send_email",
    ]
    assert names.count("chat scripted-1") == 2 and names.count("execute_tool create_ticket") == 1
    outcomes = [s.attributes["outbox.outcome"] for s in received if s.name.endswith("send_email")]
    assert outcomes[-1] == "result_ok" and set(outcomes[:-1]) <= {"defer"}
    services = {s.service for s in received}
    assert services == {"outbox-relay"}
    # The tool's requests, from both relays, named the run's trace.
    assert all(
        d.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        for tool in ("send_email", "create_ticket")
        for d in service.tool(tool).deliveries
    )
    assert len(service.tool("send_email").effects) == 1
