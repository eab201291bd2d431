"""``outbox serve`` end to end: the real openai SDK against the live app on loopback, the
relay and the scripted model; a registered tool through the relay, a client tool through
``submit_tool_outputs`` (twice), tenants kept apart by their keys, refused requests that
store nothing, and the run's journal over SSE resumed with ``Last-Event-ID``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import psycopg
import pytest

from outbox import keys
from outbox.statements import journal
from tests.helpers import in_thread, server_logs
from tests.relay_harness import scalar, wait_until
from tests.serve_harness import client, serve

# The openai SDK marks its Assistants API deprecated (OpenAI retired the hosted one); that
# API is what these tests point at outbox serve.
pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]

SEND_EMAIL_TOOL = {"type": "function", "function": {"name": "send_email"}}
APPROVE_TOOL = {
    "type": "function",
    "function": {
        "name": "approve_refund",
        "description": "Ask a person to approve a refund",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}


def count(db_url: str, table: str) -> int:
    return int(scalar(db_url, f"SELECT count(*) FROM outbox.{table}"))


def test_create_and_poll_runs_a_registered_tool_through_the_relay(
    db_url, base_url, api_keys, relay, service
):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(
        model="scripted-1", instructions="You are the mail desk.", tools=[SEND_EMAIL_TOOL]
    )
    thread = sdk.beta.threads.create(
        messages=[{"role": "user", "content": "script:email tell the customer"}]
    )
    run = sdk.beta.threads.runs.create_and_poll(
        thread_id=thread.id, assistant_id=assistant.id, poll_interval_ms=100
    )
    assert run.status == "completed", run
    assert run.assistant_id == assistant.id
    assert run.usage is not None
    messages = sdk.beta.threads.messages.list(thread_id=thread.id, order="asc")
    texts = [(m.role, m.content[0].text.value) for m in messages.data]  # type: ignore[union-attr]
    assert texts == [("user", "script:email tell the customer"), ("assistant", "mail sent")]
    steps = sdk.beta.threads.runs.steps.list(run_id=run.id, thread_id=thread.id, order="asc")
    kinds = [s.step_details.type for s in steps.data]
    assert kinds == ["tool_calls", "message_creation"]
    call = steps.data[0].step_details.tool_calls[0]  # type: ignore[union-attr]
    assert call.function.name == "send_email"  # type: ignore[union-attr]
    assert call.function.output is not None  # type: ignore[union-attr]
    assert len(service.tool("send_email").effects) == 1
    runs = sdk.beta.threads.runs.list(thread_id=thread.id)
    assert [r.id for r in runs.data] == [run.id]
    sdk.close()


def test_client_tool_waits_for_outputs_accepts_them_once_and_the_thread_goes_on(
    db_url, base_url, api_keys, relay, model
):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[APPROVE_TOOL])
    run = sdk.beta.threads.create_and_run_poll(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "script:approve order 42"}]},
        poll_interval_ms=100,
    )
    assert run.status == "requires_action", run
    assert run.expires_at is not None
    assert run.required_action is not None
    (call,) = run.required_action.submit_tool_outputs.tool_calls
    assert call.function.name == "approve_refund"
    assert json.loads(call.function.arguments) == {"order_id": "42"}

    outputs = [{"tool_call_id": call.id, "output": "approved by Ann"}]
    sdk.beta.threads.runs.submit_tool_outputs(
        run_id=run.id, thread_id=run.thread_id, tool_outputs=outputs
    )
    with pytest.raises(openai.BadRequestError) as second:
        sdk.beta.threads.runs.submit_tool_outputs(
            run_id=run.id, thread_id=run.thread_id, tool_outputs=outputs
        )
    assert "do not accept tool outputs" in second.value.message
    assert second.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    done = sdk.beta.threads.runs.poll(run_id=run.id, thread_id=run.thread_id, poll_interval_ms=100)
    assert done.status == "completed"
    assert count(db_url, "tool_results") == 1
    answers = [i for r in model.requests for i in r.history if i.kind == "tool_output"]
    assert {a.text for a in answers} == {"approved by Ann"}

    # A late submit after the run ended: the same 400, and the thread takes a new run.
    with pytest.raises(openai.BadRequestError):
        sdk.beta.threads.runs.submit_tool_outputs(
            run_id=run.id, thread_id=run.thread_id, tool_outputs=outputs
        )
    sdk.beta.threads.messages.create(thread_id=run.thread_id, role="user", content="thanks")
    again = sdk.beta.threads.runs.create_and_poll(
        thread_id=run.thread_id, assistant_id=assistant.id, poll_interval_ms=100
    )
    assert again.status == "completed"
    sdk.close()


def test_cancel_a_waiting_run_then_cancel_again_is_refused(db_url, base_url, api_keys, relay):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[APPROVE_TOOL])
    run = sdk.beta.threads.create_and_run_poll(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "script:approve order 42"}]},
        poll_interval_ms=100,
    )
    assert run.status == "requires_action"
    cancelled = sdk.beta.threads.runs.cancel(run_id=run.id, thread_id=run.thread_id)
    assert cancelled.status == "cancelled"
    assert cancelled.cancelled_at is not None
    with pytest.raises(openai.BadRequestError, match="Cannot cancel run with status"):
        sdk.beta.threads.runs.cancel(run_id=run.id, thread_id=run.thread_id)
    sdk.close()


def test_another_tenants_objects_are_404_and_its_key_changes_nothing(
    db_url, base_url, api_keys, relay
):
    acme, globex = client(base_url, api_keys["acme"]), client(base_url, api_keys["globex"])
    assistant = acme.beta.assistants.create(model="scripted-1", tools=[APPROVE_TOOL])
    run = acme.beta.threads.create_and_run_poll(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "script:approve order 42"}]},
        poll_interval_ms=100,
    )
    assert run.status == "requires_action"
    (call,) = run.required_action.submit_tool_outputs.tool_calls  # type: ignore[union-attr]
    before = {t: count(db_url, t) for t in ("threads", "messages", "runs", "tool_results")}
    attempts = [
        lambda: globex.beta.assistants.retrieve(assistant.id),
        lambda: globex.beta.threads.retrieve(run.thread_id),
        lambda: globex.beta.threads.messages.list(thread_id=run.thread_id),
        lambda: globex.beta.threads.messages.create(
            thread_id=run.thread_id, role="user", content="hi"
        ),
        lambda: globex.beta.threads.runs.retrieve(run_id=run.id, thread_id=run.thread_id),
        lambda: globex.beta.threads.runs.steps.list(run_id=run.id, thread_id=run.thread_id),
        lambda: globex.beta.threads.runs.cancel(run_id=run.id, thread_id=run.thread_id),
        lambda: globex.beta.threads.runs.submit_tool_outputs(
            run_id=run.id,
            thread_id=run.thread_id,
            tool_outputs=[{"tool_call_id": call.id, "output": "x"}],
        ),
        lambda: globex.beta.threads.runs.create(thread_id=run.thread_id, assistant_id=assistant.id),
        lambda: globex.get(f"/runs/{run.id}/events", cast_to=object),
    ]
    for attempt in attempts:
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.status_code == 404
        assert set(refused.value.body) >= {"message", "type", "param", "code"}  # type: ignore[arg-type]
    assert {t: count(db_url, t) for t in before} == before
    assert globex.beta.assistants.list().data == []
    still = acme.beta.threads.runs.retrieve(run_id=run.id, thread_id=run.thread_id)
    assert still.status == "requires_action"
    acme.close()
    globex.close()


def test_missing_unknown_and_revoked_keys_are_401(db_url, base_url, api_keys):
    sdk = client(base_url, api_keys["acme"])
    thread = sdk.beta.threads.create()
    for bad in ("ob-not-a-key", "sk-something"):
        with pytest.raises(openai.AuthenticationError):
            client(base_url, bad).beta.threads.retrieve(thread.id)
    with psycopg.connect(db_url) as conn:
        (row,) = [k for k in keys.list_keys(conn, "acme")]
        keys.revoke_key(conn, row["id"], actor="test")
        conn.commit()
    with pytest.raises(openai.AuthenticationError) as refused:
        sdk.beta.threads.retrieve(thread.id)
    assert refused.value.code == "invalid_api_key"
    answer = httpx2.get(f"{base_url}/threads/{thread.id}")
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "invalid_request_error"
    events = scalar(
        db_url,
        "SELECT array_agg(event ORDER BY id) FROM outbox.journal WHERE event LIKE 'api_key.%'",
    )
    assert events == ["api_key.created", "api_key.created", "api_key.revoked"]
    sdk.close()


def test_a_response_with_a_bad_key_is_a_401_whatever_its_body_storing_nothing(
    db_url, base_url, api_keys
):
    """``responses.create`` looks its key up in its own transaction (Store.for_key); an
    unknown or revoked key is still a 401, before a body it would refuse (a 400 or 413
    comes only with a valid key), and nothing is stored."""
    good = {"model": "scripted-1", "input": "hello", "background": True}
    with psycopg.connect(db_url) as conn:
        (row,) = [k for k in keys.list_keys(conn, "globex")]
        keys.revoke_key(conn, row["id"], actor="test")
        conn.commit()
    for key in ("ob-not-a-key", "sk-something", api_keys["globex"]):
        for body in (good, {"model": "scripted-1", "input": "hello", "unknown": 1}):
            answer = httpx2.post(
                f"{base_url}/responses", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert answer.status_code == 401, answer.text
            assert answer.json()["error"]["code"] == "invalid_api_key"
    assert scalar(db_url, "SELECT count(*) FROM outbox.responses") == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.threads") == 0
    acme = {"Authorization": f"Bearer {api_keys['acme']}"}
    answer = httpx2.post(f"{base_url}/responses", json={**good, "unknown": 1}, headers=acme)
    assert answer.status_code == 400
    answer = httpx2.post(f"{base_url}/responses", json=good, headers=acme)
    assert answer.status_code == 200 and answer.json()["status"] == "queued"


def test_bad_json_oversized_bodies_unknown_fields_and_ids_are_refused_storing_nothing(
    db_url, base_url, api_keys
):
    headers = {"Authorization": f"Bearer {api_keys['acme']}", "Content-Type": "application/json"}
    before = {t: count(db_url, t) for t in ("threads", "messages", "runs", "assistants")}
    http = httpx2.Client(base_url=base_url, headers=headers)

    def refused(status: int, method: str, path: str, **kw: Any) -> dict[str, Any]:
        answer = http.request(method, path, **kw)
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        return dict(error)

    refused(400, "POST", "/threads", content=b'{"messages": [')
    refused(400, "POST", "/threads", content=b"[1, 2]")
    refused(400, "POST", "/threads", content=b'{"metadata": NaN}')
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2_000_000}]})
    assert refused(413, "POST", "/threads", content=big.encode())["code"] == "request_too_large"
    error = refused(400, "POST", "/threads", json={"messages": [], "colour": "red"})
    assert error["param"] == "colour"
    error = refused(
        400, "POST", "/threads", json={"messages": [{"role": "system", "content": "x"}]}
    )
    assert error["param"] == "messages.0.role"
    refused(
        400, "POST", "/assistants", json={"model": "m", "tools": [{"type": "code_interpreter"}]}
    )
    refused(404, "GET", "/threads/not-a-uuid")
    refused(404, "GET", "/threads/00000000-0000-0000-0000-000000000000")
    thread = http.post("/threads", json={}).json()
    before["threads"] += 1
    missing = "00000000-0000-0000-0000-000000000000"
    refused(404, "POST", f"/threads/{thread['id']}/runs", json={"assistant_id": missing})
    refused(404, "GET", f"/threads/{thread['id']}/runs/{missing}")
    refused(400, "GET", f"/threads/{thread['id']}/messages", params={"limit": "0"})
    refused(404, "GET", "/nowhere")
    assert {t: count(db_url, t) for t in before} == before
    http.close()


@pytest.mark.parametrize(
    "path,body,says",
    [
        (
            "/threads",
            b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}',
            "it holds a NUL character (\\u0000) at $.messages[0].content",
        ),
        ("/threads", b'{"metadata": {"k": "\\ud800"}}', "lone surrogate (\\ud800) at $.metadata.k"),
        ("/threads", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested more"),
        (
            "/responses",
            b'{"model": "m", "input": "a\\u0000b"}',
            "NUL character (\\u0000) at $.input",
        ),
    ],
)
def test_bodies_postgresql_cannot_store_are_400s_naming_the_problem(
    db_url, base_url, api_keys, path, body, says
):
    headers = {"Authorization": f"Bearer {api_keys['acme']}", "Content-Type": "application/json"}
    before = {t: count(db_url, t) for t in ("threads", "messages", "runs")}
    with server_logs() as logged:
        answer = httpx2.post(base_url + path, content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("The body of your request is not storable JSON: ")
    assert says in message
    assert {t: count(db_url, t) for t in before} == before
    assert not [r for r in logged if r.msg == "api.unhandled"]  # no traceback


@pytest.mark.parametrize(
    "metadata,says",
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 properties, but got an object with 17"),
        ({"k" * 65: "v"}, "a key with maximum length 64, but got a key with length 65"),
        ({"k": "v" * 513}, "a string with maximum length 512, but got a string with length 513"),
    ],
)
def test_metadata_keeps_openais_limits(db_url, base_url, api_keys, metadata, says):
    sdk = openai.OpenAI(base_url=base_url, api_key=api_keys["acme"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.beta.threads.create(metadata=metadata)
    assert says in refused.value.message
    assert refused.value.body["param"] == "metadata"  # type: ignore[index]
    assert count(db_url, "threads") == 0
    limits = {f"k{i:02d}" + "k" * 61: "v" * 512 for i in range(16)}  # all at the limits
    thread = sdk.beta.threads.create(metadata=limits)
    assert sdk.beta.threads.retrieve(thread.id).metadata == limits
    with pytest.raises(openai.BadRequestError):
        sdk.beta.threads.update(thread.id, metadata=metadata)
    with pytest.raises(openai.BadRequestError):
        sdk.conversations.create(metadata=metadata)
    sdk.close()


def sse(response: httpx2.Response) -> Iterator[dict[str, str]]:
    """The events of an SSE response, as dicts of their fields."""
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        event[name] = value.removeprefix(" ")


def read_events(base_url: str, key: str, run_id: str, last: str | None = None) -> list[dict]:
    headers = {"Authorization": f"Bearer {key}"}
    if last is not None:
        headers["Last-Event-ID"] = last
    with httpx2.stream(
        "GET", f"{base_url}/runs/{run_id}/events", headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse(response))


def test_run_events_stream_the_journal_and_resume_from_last_event_id(
    db_url, base_url, api_keys, relay
):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[SEND_EMAIL_TOOL])
    run = sdk.beta.threads.create_and_run(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "script:email now"}]},
    )
    # Followed live from the start: the stream ends by itself after the run ends.
    events = read_events(base_url, api_keys["acme"], run.id)
    assert events[-1]["event"] == "end"
    assert json.loads(events[-1]["data"])["status"] == "completed"
    journal = [e for e in events if "id" in e]
    with psycopg.connect(db_url) as conn:
        stored = conn.execute(
            "SELECT id, event FROM outbox.journal WHERE run_id = %s ORDER BY id", [run.id]
        ).fetchall()
    assert [(int(e["id"]), e["event"]) for e in journal] == stored
    assert {"run.created", "model_turn.recorded", "tool_result.stored", "run.completed"} <= {
        e["event"] for e in journal
    }
    assert json.loads(journal[0]["data"])["run_id"] == run.id

    # Resumed after the third event: the rest, none twice, none skipped.
    rest = read_events(base_url, api_keys["acme"], run.id, last=journal[2]["id"])
    assert [e["id"] for e in rest if "id" in e] == [e["id"] for e in journal[3:]]
    refused = httpx2.get(
        f"{base_url}/runs/{run.id}/events",
        headers={"Authorization": f"Bearer {api_keys['acme']}", "Last-Event-ID": "x"},
    )
    assert refused.status_code == 400
    sdk.close()


def test_run_events_wake_on_a_journal_event_not_on_a_timer(db_url, base_url, api_keys, monkeypatch):
    """An open run event stream reads the journal again when the run's journal notifies
    (``NOTIFY outbox_journal``), not on a timer: with the quiet run's reread pushed out of
    the test's reach, a journal event that changes no status still reaches it."""
    from outbox.server import events

    monkeypatch.setattr(events, "FALLBACK_S", 600.0)
    reads = []
    read = events.read
    monkeypatch.setattr(events, "read", lambda *args: reads.append(1) or read(*args))
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1")
    run = sdk.beta.threads.create_and_run(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "hello"}]},
    )  # no relay: it stays queued
    headers = {"Authorization": f"Bearer {api_keys['acme']}"}
    with httpx2.stream(
        "GET", f"{base_url}/runs/{run.id}/events", headers=headers, timeout=60
    ) as response:
        received = sse(response)
        assert next(received)["event"] == "run.created"
        # The route's read (the run exists), then the stream's: it reads, reads again to
        # send the event once final, reads once more: nothing pending, so it now waits for
        # a notification (or the pushed-out reread).
        wait_until(lambda: len(reads) >= 4, timeout_s=30, what="the stream's third read")
        with psycopg.connect(db_url) as conn:
            journal(conn, "test.noted", "acme", run_id=run.id)
        reader, told = in_thread(lambda: next(received))
        reader.join(timeout=30)
        assert told.get("result", {}).get("event") == "test.noted", told
    sdk.close()


def test_resending_a_run_with_the_same_idempotency_key_returns_the_same_run(
    db_url, base_url, api_keys
):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create()
    extra = [{"role": "user", "content": "hello"}]
    first, second = (
        sdk.beta.threads.runs.create(
            thread_id=thread.id,
            assistant_id=assistant.id,
            additional_messages=extra,  # type: ignore[arg-type]
            extra_headers={"Idempotency-Key": "req-1"},
        )
        for _ in range(2)
    )
    assert first.id == second.id
    assert count(db_url, "runs") == 1
    assert count(db_url, "messages") == 1
    sdk.close()


def test_outputs_after_the_deadline_are_refused_and_the_thread_goes_on(
    db_url, model, api_keys, relay
):
    with serve(db_url, model_base_url=model.url + "/v1", action_timeout_s=0.5) as url:
        sdk = client(url, api_keys["acme"])
        assistant = sdk.beta.assistants.create(model="scripted-1", tools=[APPROVE_TOOL])
        run = sdk.beta.threads.create_and_run_poll(
            assistant_id=assistant.id,
            thread={"messages": [{"role": "user", "content": "script:approve order 42"}]},
            poll_interval_ms=100,
        )
        assert run.status == "requires_action" and run.expires_at is not None
        (call,) = run.required_action.submit_tool_outputs.tool_calls  # type: ignore[union-attr]
        # Past the deadline, by the database clock; the relay's sweep may expire it first
        # (it clears the deadline then).
        passed = (
            "SELECT action_deadline < now() OR status = 'expired' FROM outbox.runs WHERE id = %s"
        )
        wait_until(lambda: scalar(db_url, passed, [run.id]), what="the run's deadline")
        with pytest.raises(openai.BadRequestError, match='"expired" do not accept tool outputs'):
            sdk.beta.threads.runs.submit_tool_outputs(
                run_id=run.id,
                thread_id=run.thread_id,
                tool_outputs=[{"tool_call_id": call.id, "output": "too late"}],
            )
        shown = sdk.beta.threads.runs.retrieve(run_id=run.id, thread_id=run.thread_id)
        assert shown.status == "expired"  # by the database clock, swept or not
        assert count(db_url, "tool_results") == 0
        assert count(db_url, "orphaned_results") <= 1  # the late output, unless swept first
        ended = "SELECT status FROM outbox.runs WHERE id = %s"
        wait_until(lambda: scalar(db_url, ended, [run.id]) == "expired", what="the sweep")
        sdk.beta.threads.messages.create(thread_id=run.thread_id, role="user", content="again")
        again = sdk.beta.threads.runs.create_and_poll(
            thread_id=run.thread_id, assistant_id=assistant.id, poll_interval_ms=100
        )
        assert again.status in ("requires_action", "completed")
        sdk.close()


def test_failed_and_incomplete_runs_show_openais_statuses(db_url, base_url, api_keys, relay, model):
    """A run the model refused for good is ``failed`` with ``last_error``; one stopped by
    its token budget before its next turn is ``incomplete`` with the reason."""
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[SEND_EMAIL_TOOL])
    model.set_faults(fail_next=1, fail_status=400)  # a 400 is not retried
    failed = sdk.beta.threads.create_and_run_poll(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "hi"}]},
        poll_interval_ms=100,
    )
    assert failed.status == "failed", failed
    assert failed.last_error is not None and failed.last_error.message
    short = sdk.beta.threads.create_and_run_poll(
        assistant_id=assistant.id,
        thread={"messages": [{"role": "user", "content": "script:email the customer"}]},
        max_completion_tokens=1,  # spent by the first turn: no second one
        poll_interval_ms=100,
    )
    assert short.status == "incomplete", short
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_completion_tokens"
    sdk.close()
