"""The agent loop end to end: relay + scripted OpenAI-compatible model + fake tools over HTTP.

The scripted model rejects malformed histories with OpenAI's own 400 errors, so any pairing
bug in what we send fails these tests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import psycopg
import pytest

from outbox import history, lifecycle, registry, writer
from outbox.errors import InvalidInput
from outbox.schemas import StartRun
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "sorry"}}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


@pytest.fixture
def setup(db_url: str, service: FakeToolService) -> str:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "create_ticket", "lookup")
        register_tool(conn, service, "send_email", "key")
        registry.register(
            conn,
            registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"}),
        )
        conn.commit()
    return db_url


def start(db_url: str, model: ScriptedModel, script: str, **kw: Any) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = kw.pop("thread_id", None) or writer.create_thread(conn, TENANT).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread,
                model="scripted-1",
                message=f"script:{script} please help",
                tools=kw.pop("tools", ["create_ticket", "send_email", "approve"]),
                base_url=model.url + "/v1",
                **kw,
            ),
        )
        conn.commit()
    return run


def run_status(db_url: str, run_id: uuid.UUID) -> str:
    return scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id])


def ended(db_url: str, run_id: uuid.UUID) -> bool:
    return run_status(db_url, run_id) in ("completed", "failed", "cancelled", "expired")


def replays_cleanly(db_url: str, model: ScriptedModel, thread_id: uuid.UUID) -> None:
    """Send the stored thread to the scripted model with the real SDK: no pairing error."""
    client = openai.OpenAI(base_url=model.url + "/v1", api_key="x", max_retries=0)
    with psycopg.connect(db_url) as conn:
        items, _ = history.replay(conn, thread_id, TENANT, api="responses")
        messages, _ = history.replay(conn, thread_id, TENANT, api="chat")
    client.responses.create(model="m", input=items)
    client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    client.close()


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_parallel_calls_finishing_out_of_order_are_delivered_once_in_call_order(
    setup, model, service, api
):
    seen: list[list[str]] = []

    def after_tools(items: list[HistoryItem]) -> dict[str, Any]:
        calls = [i.name for i in items if i.kind == "tool_call"]
        outputs = [i.call_id for i in items if i.kind == "tool_output"]
        seen.append([str(calls), *map(str, outputs)])
        return {"text": "all done"}

    model.add_script("parallel", [{"tool_calls": [EMAIL, TICKET]}, after_tools])
    service.tool("send_email").latency(0.5, n=1)  # the first call finishes last
    run = start(setup, model, "parallel", api=api)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id), what="the run to end")
    assert run_status(setup, run.id) == "completed"
    assert len(seen) == 1
    with psycopg.connect(setup) as conn:
        call_ids = [
            r[0]
            for r in conn.execute(
                "SELECT tool_call_id FROM outbox.tool_calls WHERE run_id = %s ORDER BY position",
                [run.id],
            ).fetchall()
        ]
    assert seen[0][1:] == call_ids  # outputs in the order the model asked for them
    assert [r.status for r in model.requests] == [200, 200]
    assert scalar(setup, "SELECT count(*) FROM outbox.submissions") == 1
    final = scalar(
        setup, "SELECT content FROM outbox.messages WHERE role = 'assistant' ORDER BY seq DESC"
    )
    assert final == "all done"
    replays_cleanly(setup, model, run.thread_id)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_models_reasoning_goes_back_to_it_in_place_before_its_calls(setup, model, api):
    # A reasoning model answers a reasoning item before its calls and, strict, refuses
    # the next turn if one of those calls comes back without it; chat completions has none.
    model.add_script(
        "think", [{"tool_calls": [TICKET], "reasoning": True}, {"text": "ticket made"}]
    )
    run = start(setup, model, "think", api=api)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id), what="the run to end")
    first, second = model.requests
    assert second.status == 200, second.response
    assert run_status(setup, run.id) == "completed"
    if api == "chat":
        assert all("reasoning" not in m for m in second.body["messages"])
        assert scalar(setup, "SELECT count(reasoning) FROM outbox.messages") == 0
        return
    (reasoning,) = [i for i in first.response["output"] if i["type"] == "reasoning"]
    (call,) = [i for i in first.response["output"] if i["type"] == "function_call"]
    sent = second.body["input"]
    at = next(i for i, item in enumerate(sent) if item.get("type") == "function_call")
    assert sent[at]["call_id"] == call["call_id"]
    assert sent[at - 1] == reasoning  # verbatim, right before the call it came with
    assert [i.get("type") for i in sent].count("reasoning") == 1
    replays_cleanly(setup, model, run.thread_id)


def test_a_strict_model_refuses_its_call_given_back_without_its_reasoning(model):
    model.add_script("think", [{"tool_calls": [TICKET], "reasoning": True}, {"text": "ok"}])
    client = openai.OpenAI(base_url=model.url + "/v1", api_key="x", max_retries=0)
    asked = [{"role": "user", "content": "script:think please"}]
    first = client.responses.create(model="m", input=asked)  # type: ignore[arg-type]
    output = [item.model_dump(exclude_none=True) for item in first.output]
    reasoning, call = output
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "made"}
    with pytest.raises(openai.BadRequestError, match="without its required 'reasoning' item"):
        client.responses.create(model="m", input=[*asked, call, answer])  # type: ignore[arg-type]
    changed = {**reasoning, "encrypted_content": "gAAAA-not-what-it-said"}
    with pytest.raises(openai.BadRequestError, match=reasoning["id"]):
        client.responses.create(model="m", input=[*asked, changed, call, answer])  # type: ignore[arg-type]
    again = client.responses.create(model="m", input=[*asked, reasoning, call, answer])  # type: ignore[arg-type]
    assert again.output_text == "ok"
    client.close()


def test_model_429_and_dropped_connection_are_retried(setup, model):
    model.add_script("plain", [{"text": "fine"}])
    model.fail_next(1, status=429, retry_after_s=0)
    run = start(setup, model, "plain")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id))
        model.drop_next(1)
        second = start(setup, model, "plain", thread_id=run.thread_id)
        wait_until(lambda: ended(setup, second.id))
    assert run_status(setup, run.id) == run_status(setup, second.id) == "completed"
    assert scalar(setup, "SELECT count(*) FROM outbox.model_turns") == 2


def test_model_refusing_the_request_fails_the_run_with_the_reason(setup, model):
    model.add_script("plain", [{"text": "fine"}])
    model.fail_next(1, status=400)
    run = start(setup, model, "plain")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id))
    assert run_status(setup, run.id) == "failed"
    assert scalar(setup, "SELECT failure_reason FROM outbox.runs") == "model_error"
    # OpenAI's error message, read from its error body, names what the server refused.
    assert scalar(setup, "SELECT last_error FROM outbox.runs") == (
        "model refused the request: "
        "The server had an error while processing your request. Sorry about that!"
    )


def test_model_5xx_answers_are_retried_and_charged(setup, model):
    model.add_script("plain", [{"text": "fine"}])
    model.fail_next(2, status=500)
    run = start(setup, model, "plain")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id))
    assert run_status(setup, run.id) == "completed"
    errors = scalar(
        setup,
        "SELECT count(*) FROM outbox.journal WHERE event = 'model_turn.retry_scheduled' "
        "AND detail->>'error' LIKE 'model answered HTTP 500: The server had an error%'",
    )
    assert errors == 2


def test_client_tools_wait_for_outputs_and_refuse_bad_submissions(setup, model):
    approve = {"name": "approve", "arguments": {"amount": 10}}
    model.add_script("client", [{"tool_calls": [approve, approve]}, {"text": "approved"}])
    run = start(setup, model, "client")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: run_status(setup, run.id) == "requires_action")
        with psycopg.connect(setup) as conn:
            pending = [c["tool_call_id"] for c in lifecycle.pending_client_calls(conn, run.id)]
            assert len(pending) == 2
            with pytest.raises(InvalidInput, match="still missing"):
                lifecycle.submit_tool_outputs(
                    conn, TENANT, run.id, [{"tool_call_id": pending[0], "output": "yes"}]
                )
            with pytest.raises(InvalidInput, match="are not calls of run"):
                lifecycle.submit_tool_outputs(
                    conn, TENANT, run.id, [{"tool_call_id": "call_nope", "output": 1}]
                )
            assert scalar(setup, "SELECT count(*) FROM outbox.tool_results") == 0
            outputs = [{"tool_call_id": c, "output": {"approved": True}} for c in pending]
            assert lifecycle.submit_tool_outputs(conn, TENANT, run.id, outputs) == "in_progress"
            conn.commit()
            # The same outputs again: a no-op that returns the run's status.
            again = lifecycle.submit_tool_outputs(conn, TENANT, run.id, outputs)
            assert again == run_status(setup, run.id)
            conn.commit()
        wait_until(lambda: ended(setup, run.id))
    assert run_status(setup, run.id) == "completed"
    assert scalar(setup, "SELECT count(*) FROM outbox.tool_results") == 2
    assert scalar(setup, "SELECT count(*) FROM outbox.submissions") == 1
    replays_cleanly(setup, model, run.thread_id)


def test_outputs_of_another_run_are_refused(setup, model):
    approve = {"name": "approve", "arguments": {}}
    model.add_script("client", [{"tool_calls": [approve]}, {"text": "ok"}])
    first = start(setup, model, "client")
    second = start(setup, model, "client")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: run_status(setup, first.id) == "requires_action")
        wait_until(lambda: run_status(setup, second.id) == "requires_action")
    with psycopg.connect(setup) as conn:
        theirs = lifecycle.pending_client_calls(conn, second.id)[0]["tool_call_id"]
        mine = lifecycle.pending_client_calls(conn, first.id)[0]["tool_call_id"]
        if theirs != mine:  # provider call ids are random: only a foreign id is foreign
            with pytest.raises(InvalidInput):
                lifecycle.submit_tool_outputs(
                    conn, TENANT, first.id, [{"tool_call_id": theirs, "output": 1}]
                )


def test_requires_action_past_its_deadline_expires_and_late_outputs_are_orphaned(setup, model):
    model.add_script("client", [{"tool_calls": [{"name": "approve", "arguments": {}}]}])
    run = start(setup, model, "client", action_timeout_s=0.5)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: run_status(setup, run.id) == "expired", what="the expiry")
    with psycopg.connect(setup) as conn:
        call = conn.execute("SELECT tool_call_id FROM outbox.tool_calls").fetchone()[0]
        status = lifecycle.submit_tool_outputs(
            conn, TENANT, run.id, [{"tool_call_id": call, "output": "late"}]
        )
        conn.commit()
    assert status == "expired"
    assert scalar(setup, "SELECT reason FROM outbox.orphaned_results") == "run_ended"
    assert scalar(setup, "SELECT count(*) FROM outbox.tool_results") == 0
    replays_cleanly(setup, model, run.thread_id)
    # The thread is free for a new run.
    model.add_script("plain", [{"text": "again"}])
    assert start(setup, model, "plain", thread_id=run.thread_id).created


def test_cancel_orphans_in_flight_results_and_keeps_the_thread_replayable(setup, model, service):
    model.add_script("slow", [{"tool_calls": [EMAIL]}, {"text": "never"}])
    service.tool("send_email").stall_after_commit(1.0, n=1)
    run = start(setup, model, "slow")
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: len(service.tool("send_email").deliveries) == 1)
        with psycopg.connect(setup) as conn:
            lifecycle.cancel_run(conn, run.id, TENANT, actor="test")
            conn.commit()
        wait_until(lambda: scalar(setup, "SELECT count(*) FROM outbox.orphaned_results"))
    assert run_status(setup, run.id) == "cancelled"
    assert scalar(setup, "SELECT count(*) FROM outbox.tool_results") == 0
    assert scalar(setup, "SELECT count(*) FROM outbox.model_turns") == 1
    replays_cleanly(setup, model, run.thread_id)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_steps": 3, "loop_limit": 10}, "step_cap"),
        ({"max_steps": 20, "loop_limit": 3}, "loop"),
        ({"max_steps": 20, "loop_limit": 10, "max_tokens": 1}, "budget"),
    ],
)
def test_limits_stop_a_looping_model(setup, model, limits, reason):
    model.add_script("forever", [{"tool_calls": [EMAIL]}] * 30)
    run = start(setup, model, "forever", **limits)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, run.id), timeout_s=60)
    assert run_status(setup, run.id) == "failed"
    assert scalar(setup, "SELECT failure_reason FROM outbox.runs") == reason
    event = scalar(setup, "SELECT detail->>'reason' FROM outbox.journal WHERE event = 'run.failed'")
    assert event == reason
    replays_cleanly(setup, model, run.thread_id)


def test_imported_history_is_repaired_and_replays(setup, model):
    call = {"id": "call_a", "type": "function", "function": {"name": "t", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "are you there?"},
    ]
    with psycopg.connect(setup) as conn:
        thread, report = lifecycle.import_thread(conn, TENANT, messages)
        conn.commit()
    assert report.dropped_orphans == ["ghost"] and report.closed_calls == ["call_a"]
    detail = scalar(setup, "SELECT detail FROM outbox.journal WHERE event = 'thread.imported'")
    assert detail["dropped_orphan_results"] == 1 and detail["closed_unanswered_calls"] == 1
    replays_cleanly(setup, model, thread.id)
    with psycopg.connect(setup) as conn:
        stored, _ = history.replay(conn, thread.id, TENANT)
    assert json.loads(stored[3]["content"])["error"].startswith("no result was recorded")


def test_two_relays_racing_on_one_run_record_each_turn_once(setup, model):
    model.add_script("two", [{"tool_calls": [TICKET]}, {"text": "done"}])
    model.set_faults(latency_s=0.05)
    runs = [start(setup, model, "two") for _ in range(10)]
    with relay_thread(setup, kinds=ALL_KINDS), relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: all(ended(setup, r.id) for r in runs), timeout_s=60)
    assert scalar(setup, "SELECT count(*) FROM outbox.model_turns") == 20
    assert all(r.status == 200 for r in model.requests)
    for run in runs:
        replays_cleanly(setup, model, run.thread_id)
