"""Traces: one run is one trace, from the backend's span through model turns and tool calls.

The relay runs in this process (a thread); the backend's and the server's spans go to the
SDK's ``InMemorySpanExporter`` installed here, and so do the spans the trace exporter
(``outbox.trace_export``) builds from the database once a run has ended (``exported``: its
passes, run here). The model and tools are real HTTP servers. What the tests read is what
an OpenTelemetry backend would receive, and what the tool and model servers saw.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import psycopg
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import ValidationError

import cli
from outbox import (
    approvals,
    keys,
    lifecycle,
    registry,
    routing,
    trace_context,
    trace_export,
    writer,
)
from outbox.schemas import StartRun
from outbox.server.observed import REGISTRY
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import look
from tests.relay_harness import register_tool, relay_thread, scalar, seed, wait_until
from tests.serve_harness import serve

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
MARKER = "marker-" + secrets.token_hex(8)  # content: in the message, the arguments, the results
TICKET = {"name": "create_ticket", "arguments": {"title": f"broken order {MARKER}"}}
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": f"sorry {MARKER}"}}
BACKEND_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    trace_context.install(exporter, batch=False)
    yield exporter
    trace_context.shutdown()


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


@pytest.fixture
def setup(db_url: str, service: FakeToolService, model: ScriptedModel) -> str:
    model.add_script("parallel", [{"tool_calls": [EMAIL, TICKET]}, {"text": f"done {MARKER}"}])
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "create_ticket", "lookup")
        register_tool(conn, service, "send_email", "key")
        conn.commit()
    return db_url


def start(db_url: str, model: ScriptedModel, **kw: Any) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT)
        fields: dict[str, Any] = {
            "message": f"script:parallel please, {MARKER}",
            "tools": ["create_ticket", "send_email"],
            **kw,
        }
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted-1",
                base_url=model.url + "/v1",
                **fields,
            ),
        )
        conn.commit()
    return run


def exported(db_url: str, spans: InMemorySpanExporter) -> list[ReadableSpan]:
    """Every span ``spans`` has, after the trace exporter's passes exported what is due."""
    with psycopg.connect(db_url) as conn:
        while trace_export.export_due(conn, [spans]).runs:
            pass
    return list(spans.get_finished_spans())


def finish(db_url: str, run_id: uuid.UUID, spans: InMemorySpanExporter | None = None) -> None:
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(
            lambda: (
                scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id])
                == "completed"
            ),
            what="the run to complete",
        )
    if spans is not None:
        assert any(s.name == "invoke_agent" for s in exported(db_url, spans))


def ids(traceparent: str) -> tuple[int, int]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


def named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def test_a_run_with_parallel_tools_is_one_trace_under_the_backends_span(
    setup, model, service, spans
):
    with trace_context.tracer().start_as_current_span("POST /refunds") as backend:
        run = start(setup, model)
    finish(setup, run.id, spans)

    found = list(spans.get_finished_spans())
    trace_id = backend.get_span_context().trace_id
    assert {s.context.trace_id for s in found} == {trace_id}
    by_id = {s.context.span_id: s for s in found}
    assert [s.name for s in found if s.parent is None] == ["POST /refunds"]
    assert all(s.parent.span_id in by_id for s in found if s.parent is not None)
    (agent,) = named(found, "invoke_agent")
    assert agent.parent is not None
    assert agent.parent.span_id == backend.get_span_context().span_id
    assert agent.context.span_id == trace_context.agent_span_id(run.id)
    children = sorted(
        s.name for s in found if s.parent and s.parent.span_id == agent.context.span_id
    )
    assert children == [
        "chat scripted-1",
        "chat scripted-1",
        "execute_tool create_ticket",
        "execute_tool send_email",
    ]
    assert agent.start_time is not None and agent.end_time is not None
    assert all(agent.start_time <= s.start_time for s in found if s is not agent and s.parent)

    first, second = sorted(named(found, "chat scripted-1"), key=lambda s: s.start_time or 0)
    for chat in (first, second):
        attributes = dict(chat.attributes or {})
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.model"] == "scripted-1"
        assert attributes["gen_ai.conversation.id"] == str(run.thread_id)
        assert str(attributes["gen_ai.response.id"]).startswith("resp_")
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["outbox.tenant.id"] == TENANT
        assert attributes["outbox.outcome"] == "turn"
    assert [dict(c.attributes or {})["outbox.step"] for c in (first, second)] == [1, 2]
    # The second turn replays the first's request: the provider's cache read it (the
    # scripted model's prefix cache, by the conversation's prompt_cache_key).
    cache_read = "gen_ai.usage.cache_read.input_tokens"
    assert dict(first.attributes or {})[cache_read] == 0
    assert dict(second.attributes or {})[cache_read] > 0

    calls = {
        r[0]: r[1:]
        for r in psycopg.connect(setup)
        .execute(
            "SELECT tool_name, tool_call_id, idempotency_key FROM outbox.tool_calls "
            "WHERE run_id = %s",
            [run.id],
        )
        .fetchall()
    }
    for tool, mode in (("send_email", "key"), ("create_ticket", "lookup")):
        (span,) = named(found, f"execute_tool {tool}")
        attributes = dict(span.attributes or {})
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == tool
        assert attributes["gen_ai.tool.call.id"] == calls[tool][0]
        assert attributes["gen_ai.conversation.id"] == str(run.thread_id)
        assert attributes["outbox.idempotency.mode"] == mode
        assert attributes["outbox.idempotency.key"] == calls[tool][1]
        assert attributes["outbox.attempt"] == 1 and attributes["outbox.fencing_token"] == 1
        assert attributes["outbox.outcome"] == "result_ok"
        # The tool received the traceparent of this very span: its spans join the trace.
        (delivery,) = service.tool(tool).deliveries
        assert ids(delivery.headers["traceparent"]) == (trace_id, span.context.span_id)

    # The model received the traceparent of each turn's chat span.
    sent = [ids(r.traceparent or "") for r in model.requests]
    assert sent == [(trace_id, first.context.span_id), (trace_id, second.context.span_id)]


def test_a_chat_span_names_the_model_that_answered_the_turn(setup, model, spans):
    with psycopg.connect(setup) as conn:
        routing.set_routes(conn, TENANT, [{"after_tool_results": True, "model": "routed-1"}])
        conn.commit()
    run = start(setup, model)
    finish(setup, run.id, spans)
    found = exported(setup, spans)
    assert [len(named(found, "chat scripted-1")), len(named(found, "chat routed-1"))] == [1, 1]
    (routed,) = named(found, "chat routed-1")
    assert dict(routed.attributes or {})["gen_ai.request.model"] == "routed-1"


def test_the_chat_span_of_a_turn_that_compacted_says_so(setup, model, spans):
    """A run whose prompt budget its thread outgrows: the chat span of each turn that
    summarised the oldest turns carries what the compaction recorded; the others none."""
    tickets = [
        {"tool_calls": [{"name": "create_ticket", "arguments": {"title": f"{i} " + "x" * 600}}]}
        for i in range(6)
    ]
    model.add_script("long", [*tickets, {"text": "done"}])
    run = start(setup, model, message="script:long go", tools=["create_ticket"])
    with psycopg.connect(setup) as conn:
        conn.execute(
            "UPDATE outbox.runs SET model_options = model_options || %s WHERE id = %s",
            [json.dumps({"max_prompt_tokens": 700}), run.id],
        )
        conn.commit()
    finish(setup, run.id, spans)
    compacted = {
        int(r[0]): (int(r[1]), int(r[2]), int(r[3]))
        for r in look(
            setup,
            "SELECT step_no, through_seq, tokens_before, tokens_after FROM outbox.compactions "
            "WHERE run_id = %s",
            [run.id],
        )
    }
    assert compacted, "the run outgrew its budget"
    chats = [
        dict(s.attributes or {})
        for s in named(exported(setup, spans), "chat scripted-1")
        if (s.attributes or {}).get("outbox.outcome") == "turn"
    ]
    assert len(chats) == 7
    for attributes in chats:
        step = attributes["outbox.step"]
        if step in compacted:
            through, before, after = compacted[step]
            assert attributes["outbox.context.compacted"] is True
            assert attributes["outbox.context.through_seq"] == through
            assert attributes["outbox.context.tokens_before"] == before
            assert attributes["outbox.context.tokens_after"] == after
            assert before > after
        else:
            assert not any(k.startswith("outbox.context.") for k in attributes), attributes


def test_with_tracing_off_tools_and_models_still_continue_the_runs_trace(setup, model, service):
    """No SDK recording anything: the run's stored context alone names the trace, and what
    a tool or model receives hangs under the run's invoke_agent span."""
    assert not trace_context.enabled()
    run = start(setup, model, traceparent=BACKEND_TRACEPARENT, tracestate="vendor=abc")
    stored = scalar(setup, "SELECT traceparent || ' ' || tracestate FROM outbox.runs")
    assert stored == f"{BACKEND_TRACEPARENT} vendor=abc"
    finish(setup, run.id)
    received = [
        d.headers for t in ("send_email", "create_ticket") for d in service.tool(t).deliveries
    ]
    received += [{"traceparent": r.traceparent} for r in model.requests]
    assert len(received) == 4
    expected = (ids(BACKEND_TRACEPARENT)[0], trace_context.agent_span_id(run.id))
    assert {ids(h["traceparent"]) for h in received} == {expected}
    assert all(h.get("tracestate") == "vendor=abc" for h in received[:2])
    # Nor does the relay journal its attempts' spans: its writes are as they were.
    journaled = "SELECT count(*) FROM outbox.journal WHERE detail ? 'span'"
    assert scalar(setup, journaled) == 0


def test_a_run_started_without_a_trace_is_a_trace_of_its_own(setup, model, service, spans):
    run = start(setup, model)
    finish(setup, run.id, spans)
    found = list(spans.get_finished_spans())
    assert {s.context.trace_id for s in found} == {trace_context.own_trace_id(run.id)}
    (agent,) = named(found, "invoke_agent")
    assert agent.parent is None
    assert all(
        s.parent and s.parent.span_id == agent.context.span_id for s in found if s is not agent
    )


def test_start_run_v2_stores_the_trace_context_and_refuses_a_malformed_one(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [TENANT])
        thread = writer.create_thread(conn, TENANT).id
        run_id = conn.execute(
            "SELECT run_id FROM outbox.start_run_v2(%s, %s, 'gpt-5', p_message => 'hi', "
            "p_traceparent => %s, p_tracestate => 'k=v')",
            [TENANT, thread, BACKEND_TRACEPARENT],
        ).fetchone()[0]  # type: ignore[index]
        assert conn.execute(
            "SELECT traceparent, tracestate FROM outbox.runs WHERE id = %s", [run_id]
        ).fetchone() == (BACKEND_TRACEPARENT, "k=v")
        conn.commit()
        for bad, what in (
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "p_traceparent"),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "p_traceparent"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "p_traceparent"),
            ("not a traceparent", "p_traceparent"),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=what):
                conn.execute(
                    "SELECT * FROM outbox.start_run_v2(%s, %s, 'gpt-5', p_traceparent => %s)",
                    [TENANT, thread, bad],
                )
            conn.rollback()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_tracestate"):
            conn.execute(
                "SELECT * FROM outbox.start_run_v2(%s, %s, 'gpt-5', p_tracestate => 'k=v')",
                [TENANT, thread],
            )
        conn.rollback()
    with pytest.raises(ValidationError, match="W3C traceparent"):
        StartRun(tenant_id=TENANT, thread_id=thread, model="m", traceparent="00-zz")


def test_no_content_and_no_secret_in_spans_unless_content_capture_is_on(
    setup, model, service, spans, monkeypatch
):
    canary = "canary-" + secrets.token_hex(16)
    monkeypatch.setenv("OUTBOX_SECRET_CRM", canary)
    service.tool("send_email").fail(status=500, n=1)  # an error, written and retried
    with psycopg.connect(setup) as conn:
        register_tool(conn, service, "send_email", "key", credential_ref="crm")
        conn.commit()
    run = start(setup, model)
    finish(setup, run.id, spans)
    assert canary in service.tool("send_email").deliveries[0].headers["authorization"]
    said = dump(spans.get_finished_spans())
    assert MARKER not in said and canary not in said
    assert "result_ok" in said and "retry" in said  # the outcomes are there, not the words

    monkeypatch.setenv(trace_context.CAPTURE_CONTENT, "true")
    captured = InMemorySpanExporter()
    trace_context.install(captured, batch=False)
    run = start(setup, model)
    finish(setup, run.id, captured)
    said = dump(captured.get_finished_spans())
    assert MARKER in said  # arguments, results and messages: the opt-in
    assert canary not in said


def dump(found: Any) -> str:
    return json.dumps(
        [
            {
                "name": s.name,
                "attributes": dict(s.attributes or {}),
                "status": str(s.status.description),
            }
            for s in found
        ]
    )


def test_a_python_tool_run_in_a_chunk_has_its_span(db_url, spans):
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(
                name="echo",
                executor="python",
                callable="tests.tooling:echo",
                idempotency_mode="key",
            ),
        )
        conn.commit()
    seed(db_url, ["echo"], runs=1, calls_per_batch=2, args=lambda n: {"n": n})
    run_id = scalar(db_url, "SELECT id FROM outbox.runs")
    with relay_thread(db_url):
        wait_until(lambda: scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 2)
    with psycopg.connect(db_url) as conn:  # spans are exported once their run ends
        lifecycle.cancel_run(conn, run_id, TENANT, actor="test")
        conn.commit()
    found = named(exported(db_url, spans), "execute_tool echo")
    assert len(found) == 2
    for span in found:
        assert span.context.trace_id == trace_context.own_trace_id(run_id)
        assert span.parent is not None and span.parent.span_id == trace_context.agent_span_id(
            run_id
        )
        assert dict(span.attributes or {})["outbox.outcome"] == "result_ok"


def test_a_run_started_through_outbox_serve_continues_the_callers_traceparent(
    setup, model, service, spans
):
    """The caller's ``traceparent`` header: the server's span is its child, the run's
    ``invoke_agent`` span the server span's, and the tools see the same trace."""
    with psycopg.connect(setup) as conn:
        _, key = keys.create_key(conn, TENANT, name="test")
        conn.commit()
    caller_trace, caller_span = ids(BACKEND_TRACEPARENT)
    labels = {"method": "POST", "route": "/v1/responses", "status": "200"}
    served_before = REGISTRY.get_sample_value("outbox_serve_request_seconds_count", labels) or 0
    with serve(setup, model_base_url=model.url + "/v1") as base_url:
        sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        with relay_thread(setup, kinds=ALL_KINDS):
            response = sdk.responses.create(
                model="scripted-1",
                input=f"script:parallel please, {MARKER}",
                tools=[
                    {"type": "function", "name": "send_email", "parameters": {}},
                    {"type": "function", "name": "create_ticket", "parameters": {}},
                ],
                extra_headers={"traceparent": BACKEND_TRACEPARENT, "tracestate": "caller=1"},
            )
            assert response.status == "completed"
            wait_until(
                lambda: named(exported(setup, spans), "invoke_agent"),
                what="the run's invoke_agent span",
            )
        sdk.close()
    found = list(spans.get_finished_spans())
    assert {s.context.trace_id for s in found} == {caller_trace}
    (server,) = [s for s in found if s.name == "POST /v1/responses"]
    assert server.parent is not None and server.parent.span_id == caller_span
    assert dict(server.attributes or {})["http.response.status_code"] == 200
    (agent,) = named(found, "invoke_agent")
    assert agent.parent is not None and agent.parent.span_id == server.context.span_id
    assert {ids(d.headers["traceparent"])[0] for d in service.tool("send_email").deliveries} == {
        caller_trace
    }
    # The request was counted too, under its route's template (outbox serve's metrics).
    assert REGISTRY.get_sample_value("outbox_serve_request_seconds_count", labels) == (
        served_before + 1
    )


def test_a_run_expired_by_the_sweep_gets_its_invoke_agent_span(db_url, model, spans):
    """A run waiting for its backend's client tool past the deadline is ended by the
    relay's sweep, which records the run's span (error status: expired)."""
    model.add_script("ask", [{"tool_calls": [{"name": "approve", "arguments": {}}]}])
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn,
            registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"}),
        )
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted-1",
                message="script:ask may I?",
                tools=["approve"],
                base_url=model.url + "/v1",
                action_timeout_s=0.5,
                traceparent=BACKEND_TRACEPARENT,
            ),
        )
        conn.commit()
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(
            lambda: named(exported(db_url, spans), "invoke_agent"),
            what="the expired run's span",
        )
    (agent,) = named(list(spans.get_finished_spans()), "invoke_agent")
    assert (agent.context.trace_id, agent.context.span_id) == (
        ids(BACKEND_TRACEPARENT)[0],
        trace_context.agent_span_id(run.id),
    )
    assert agent.parent is not None and agent.parent.span_id == ids(BACKEND_TRACEPARENT)[1]
    assert dict(agent.attributes or {})["outbox.run.status"] == "expired"
    assert agent.status.status_code.name == "ERROR"


def test_under_a_sampler_a_run_is_kept_or_dropped_whole(setup, model, service, monkeypatch):
    """``OTEL_TRACES_SAMPLER``: a run of its own trace is sampled by its trace id, the same
    decision in every span of it and in what its tools are told; a run that continues a
    caller's trace follows the caller's sampled flag."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")  # keep no trace of our own
    exporter = InMemorySpanExporter()
    trace_context.install(exporter, batch=False)
    try:
        dropped = start(setup, model)
        finish(setup, dropped.id)
        assert exported(setup, exporter) == []
        assert {d.headers["traceparent"][-2:] for d in service.tool("send_email").deliveries} == {
            "00"
        }
        kept = start(setup, model, traceparent=BACKEND_TRACEPARENT)  # the caller sampled it
        finish(setup, kept.id, exporter)
        found = list(exporter.get_finished_spans())
        assert {s.context.trace_id for s in found} == {ids(BACKEND_TRACEPARENT)[0]}
        assert len(found) == 5  # invoke_agent, two turns, two calls
        # The relay journaled the kept run's attempts for the exporter, not the dropped one's.
        journaled = "SELECT count(*) FROM outbox.journal WHERE run_id = %s AND detail ? 'span'"
        assert scalar(setup, journaled, [dropped.id]) == 0
        assert scalar(setup, journaled, [kept.id]) == 4
    finally:
        trace_context.shutdown()


def test_a_call_that_waited_for_approval_says_who_approved_it_and_how_long_it_waited(
    db_url, model, service, spans
):
    model.add_script("email", [{"tool_calls": [EMAIL]}, {"text": "sent"}])
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key", risk_tier="high")
        conn.commit()
    run = start(db_url, model, message="script:email please", tools=["send_email"])

    def pending() -> dict[str, Any] | None:
        with psycopg.connect(db_url) as conn:
            return next(
                (a for a in approvals.list_approvals(conn, "pending") if a["run_id"] == run.id),
                None,
            )

    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(pending, what="the call to wait for approval")
        with psycopg.connect(db_url) as conn:
            approvals.decide(conn, waiting["id"], "approve", actor="alice")
            conn.commit()
        wait_until(
            lambda: named(exported(db_url, spans), "execute_tool send_email"),
            what="the approved call's span",
        )
    (call,) = named(list(spans.get_finished_spans()), "execute_tool send_email")
    attributes = dict(call.attributes or {})
    waited = scalar(
        db_url,
        "SELECT extract(epoch FROM decided_at - created_at)::float8 FROM outbox.approvals "
        "WHERE id = %s",
        [waiting["id"]],
    )
    assert attributes["outbox.approval.decided_by"] == "alice"
    assert attributes["outbox.approval.wait_s"] == pytest.approx(waited) and waited > 0
    assert attributes["outbox.outcome"] == "result_ok"


def test_a_run_cancelled_by_its_backend_or_an_operator_gets_its_invoke_agent_span(
    db_url, model, service, spans, monkeypatch
):
    model.add_script("email", [{"tool_calls": [EMAIL]}, {"text": "sent"}])
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key", risk_tier="high")  # waits for a person
        conn.commit()
    by_backend, by_operator, rolled_back = (
        start(db_url, model, message="script:email please", tools=["send_email"]) for _ in range(3)
    )

    def due(run_id: uuid.UUID) -> Any:
        return scalar(db_url, "SELECT agent_span_due FROM outbox.runs WHERE id = %s", [run_id])

    def agent_spans() -> dict[Any, ReadableSpan]:
        found = named(exported(db_url, spans), "invoke_agent")
        assert len({s.context.span_id for s in found}) == len(found), "a span recorded twice"
        return {s.context.span_id: s for s in found}

    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(
            lambda: scalar(db_url, "SELECT count(*) FROM outbox.approvals") == 3,
            what="the three runs to wait for approval",
        )
        # A cancel whose transaction rolls back ended nothing: no span for it, ever.
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, rolled_back.id, TENANT, actor="backend-svc")
            assert due(rolled_back.id) is False  # not committed: another session sees none
            conn.rollback()
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, by_backend.id, TENANT, actor="backend-svc")
            conn.commit()
        monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
        cancelled = CliRunner().invoke(
            cli.main, ["runs", "cancel", str(by_operator.id), "--actor", "ops@acme"]
        )
        assert cancelled.exit_code == 0, cancelled.output
        wait_until(lambda: len(agent_spans()) == 2, what="the two cancelled runs' spans")
        assert due(by_backend.id) is False and due(by_operator.id) is False  # taken
        assert trace_context.agent_span_id(rolled_back.id) not in agent_spans()
        # Cancelled for real now: a later sweep records it, and the first two not again.
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, rolled_back.id, TENANT, actor="backend-svc")
            conn.commit()
        wait_until(lambda: len(agent_spans()) == 3, what="the third run's span")
    found = agent_spans()
    assert set(found) == {
        trace_context.agent_span_id(r.id) for r in (by_backend, by_operator, rolled_back)
    }
    for run, actor in ((by_backend, "backend-svc"), (by_operator, "ops@acme")):
        span = found[trace_context.agent_span_id(run.id)]
        attributes = dict(span.attributes or {})
        assert attributes["outbox.run.status"] == "cancelled"
        assert attributes["outbox.outcome"] == "cancelled"
        assert attributes["outbox.run.ended_by"] == actor
        assert span.status.status_code is StatusCode.ERROR
        assert span.context.trace_id == trace_context.own_trace_id(run.id)
        created, ended = look(
            db_url,
            "SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM ended_at)::float8 "
            "FROM outbox.runs WHERE id = %s",
            [run.id],
        )[0]
        assert span.start_time == int(created * 1e9) and span.end_time == int(ended * 1e9)
        # Its model turn's span hangs under it: the trace is whole.
        (turn,) = [
            s
            for s in spans.get_finished_spans()
            if s.name.startswith("chat") and s.context.trace_id == span.context.trace_id
        ]
        assert turn.parent is not None and turn.parent.span_id == span.context.span_id
