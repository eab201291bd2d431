"""``outbox serve``'s deletes, with the real openai SDK against a live server: threads,
conversations, responses, messages and conversation items are hidden (404 on every read
path afterwards, runs refused on them) and kept (``deleted_at``, journaled with the actor,
the tenant and the request id); another tenant's delete is a 404 that deletes nothing; a
thread with an active run and a response still going are refused; a message that carries
tool calls (or is a tool result) cannot be deleted, a plain one leaves every later replay;
a delete and a run start on the same thread race, one wins, and no run is left on a
deleted thread (also through the SQL API)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import psycopg
import pytest

from outbox import assistants, history
from outbox.testing.scripted_model import ScriptedModel
from tests.helpers import blocked_on_a_lock, in_thread
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import ALL_KINDS, APPROVE

pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]

APPROVE_TOOL = {
    "type": "function",
    "name": "approve_refund",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
}
APPROVE_FUNCTION = {
    "type": "function",
    "function": {"name": "approve_refund", "parameters": APPROVE_TOOL["parameters"]},
}


@pytest.fixture
def model(model: ScriptedModel) -> ScriptedModel:
    # A turn with text *and* a call: the message shows, and carries the call.
    model.add_script(
        "chatty", [{"text": "let me ask", "tool_calls": [APPROVE]}, {"text": "refund approved"}]
    )
    return model


def gone(*calls: Callable[[], Any]) -> None:
    """Each call is answered 404."""
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()


def http(base_url: str, key: str, method: str, path: str) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx2.request(method, f"{base_url}{path}", headers=headers, timeout=10)


def journal(db_url: str, event: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT tenant_id, thread_id, actor, correlation_id, detail FROM outbox.journal "
            "WHERE event = %s ORDER BY id",
            [event],
        ).fetchall()


# -- threads (Assistants) -------------------------------------------------------------------


def test_a_deleted_thread_is_404_everywhere_and_every_row_stays(
    sdk, other, base_url, api_keys, db_url
):
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create(messages=[{"role": "user", "content": "hi"}])
    with relay_thread(db_url, kinds=ALL_KINDS):
        run = sdk.beta.threads.runs.create_and_poll(
            thread_id=thread.id, assistant_id=assistant.id, poll_interval_ms=100
        )
    assert run.status == "completed"
    (message, _answer) = sdk.beta.threads.messages.list(thread_id=thread.id, order="asc").data
    (step,) = sdk.beta.threads.runs.steps.list(run_id=run.id, thread_id=thread.id).data
    rows = {
        table: scalar(
            db_url, f"SELECT count(*) FROM outbox.{table} WHERE thread_id = %s", [run.thread_id]
        )
        for table in ("messages", "runs", "journal")
    }

    gone(lambda: other.beta.threads.delete(thread.id))  # another tenant's: 404, nothing changes
    assert sdk.beta.threads.retrieve(thread.id).id == thread.id
    deleted = sdk.beta.threads.delete(thread.id, extra_headers={"X-Request-Id": "req-del-7"})
    assert (deleted.id, deleted.object, deleted.deleted) == (thread.id, "thread.deleted", True)

    threads, runs = sdk.beta.threads, sdk.beta.threads.runs
    gone(
        lambda: threads.retrieve(thread.id),
        lambda: threads.update(thread.id, metadata={"a": "b"}),
        lambda: threads.delete(thread.id),  # twice: 404
        lambda: threads.messages.list(thread_id=thread.id),
        lambda: threads.messages.retrieve(message.id, thread_id=thread.id),
        lambda: threads.messages.create(thread_id=thread.id, role="user", content="more"),
        lambda: threads.messages.delete(message.id, thread_id=thread.id),
        lambda: runs.list(thread_id=thread.id),
        lambda: runs.retrieve(run.id, thread_id=thread.id),
        lambda: runs.steps.list(run_id=run.id, thread_id=thread.id),
        lambda: runs.steps.retrieve(step.id, run_id=run.id, thread_id=thread.id),
        lambda: runs.cancel(run.id, thread_id=thread.id),
        lambda: runs.submit_tool_outputs(
            run.id, thread_id=thread.id, tool_outputs=[{"tool_call_id": "c", "output": "x"}]
        ),
        lambda: runs.create(thread_id=thread.id, assistant_id=assistant.id),
        # The same thread through the Conversations protocol.
        lambda: sdk.conversations.retrieve(f"conv_{uuid.UUID(thread.id).hex}"),
        lambda: sdk.responses.create(
            model="scripted-1", conversation=f"conv_{uuid.UUID(thread.id).hex}", input="hi"
        ),
    )
    events = http(base_url, api_keys["acme"], "GET", f"/runs/{run.id}/events")
    assert events.status_code == 404

    # Kept: every row, with deleted_at; the delete journaled with tenant, actor, request id.
    assert scalar(
        db_url, "SELECT deleted_at IS NOT NULL FROM outbox.threads WHERE id = %s", [thread.id]
    )
    for table, before in rows.items():
        after = scalar(
            db_url, f"SELECT count(*) FROM outbox.{table} WHERE thread_id = %s", [thread.id]
        )
        assert after == before + (table == "journal")
    ((tenant, thread_id, actor, request_id, _detail),) = journal(db_url, "thread.deleted")
    assert (tenant, str(thread_id), actor, request_id) == (
        "acme",
        thread.id,
        "outbox-serve",
        "req-del-7",
    )

    # The SQL API refuses a run on it too.
    with (
        psycopg.connect(db_url) as conn,
        pytest.raises(psycopg.errors.NoDataFound, match="deleted"),
    ):
        conn.execute("SELECT * FROM outbox.start_run_v1('acme', %s, 'scripted-1')", [thread.id])
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs WHERE thread_id = %s", [thread.id]) == 1


def test_a_thread_with_an_active_run_is_not_deleted_until_the_run_is_cancelled(sdk, db_url):
    assistant = sdk.beta.assistants.create(model="scripted-1")
    run = sdk.beta.threads.create_and_run(  # no relay: the run stays queued, active
        assistant_id=assistant.id, thread={"messages": [{"role": "user", "content": "hi"}]}
    )
    with pytest.raises(openai.BadRequestError, match="cancel the run first") as refused:
        sdk.beta.threads.delete(run.thread_id)
    assert refused.value.code == "run_active" and run.id in refused.value.message
    message = sdk.beta.threads.messages.list(thread_id=run.thread_id).data[0]
    with pytest.raises(openai.BadRequestError, match="cancel the run first"):
        sdk.beta.threads.messages.delete(message.id, thread_id=run.thread_id)
    assert sdk.beta.threads.retrieve(run.thread_id).id == run.thread_id  # nothing changed
    # The database holds the rule itself: deleted_at set by hand is refused.
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.Error, match="active run") as err:
        conn.execute("UPDATE outbox.threads SET deleted_at = now() WHERE id = %s", [run.thread_id])
    assert err.value.sqlstate == "OB001"

    sdk.beta.threads.runs.cancel(run.id, thread_id=run.thread_id)
    assert sdk.beta.threads.delete(run.thread_id).deleted
    assert journal(db_url, "thread.deleted")[0][0] == "acme"


def test_a_run_started_while_the_delete_waits_for_the_thread_wins_and_the_delete_is_refused(
    sdk, db_url
):
    """The start holds the thread's lock; the delete waits for it, then must see the run
    committed meanwhile (read by a statement after the lock, not by the locking one)."""
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create()
    with psycopg.connect(db_url) as starter:
        (run_id, *_rest) = starter.execute(
            "SELECT * FROM outbox.start_run_v1('acme', %s, 'scripted-1', p_message => 'hi')",
            [thread.id],
        ).fetchone()
        worker, out = in_thread(lambda: sdk.beta.threads.delete(thread.id))
        wait_until(lambda: blocked_on_a_lock(db_url), 20, "the delete to wait for the thread")
        starter.commit()
        worker.join(20)
    assert isinstance(out.get("error"), openai.BadRequestError), out
    assert str(run_id) in out["error"].message
    assert (
        scalar(db_url, "SELECT deleted_at FROM outbox.threads WHERE id = %s", [thread.id]) is None
    )
    assert sdk.beta.threads.runs.retrieve(str(run_id), thread_id=thread.id).status == "queued"
    del assistant


def test_a_run_started_while_the_thread_is_being_deleted_is_refused_and_none_is_left(sdk, db_url):
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create(messages=[{"role": "user", "content": "hi"}])
    with psycopg.connect(db_url) as deleter:
        assistants.delete_thread(deleter, "acme", uuid.UUID(thread.id), actor="test")
        worker, out = in_thread(
            lambda: sdk.beta.threads.runs.create(thread_id=thread.id, assistant_id=assistant.id)
        )
        wait_until(lambda: blocked_on_a_lock(db_url), 20, "the start to wait for the thread")
        deleter.commit()
        worker.join(20)
    assert isinstance(out.get("error"), openai.NotFoundError), out
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs WHERE thread_id = %s", [thread.id]) == 0
    # Through the SQL API, and through the Responses protocol, as well.
    with (
        psycopg.connect(db_url) as conn,
        pytest.raises(psycopg.errors.NoDataFound, match="deleted"),
    ):
        conn.execute("SELECT * FROM outbox.start_run_v1('acme', %s, 'scripted-1')", [thread.id])
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs WHERE thread_id = %s", [thread.id]) == 0


# -- responses ------------------------------------------------------------------------------


def test_a_deleted_response_is_404_and_its_conversation_goes_on(
    sdk, other, base_url, api_keys, db_url, model
):
    with relay_thread(db_url, kinds=ALL_KINDS):
        first = sdk.responses.create(model="scripted-1", input="hi")
        second = sdk.responses.create(
            model="scripted-1", previous_response_id=first.id, input="again"
        )
        gone(lambda: other.responses.delete(first.id))
        assert sdk.responses.retrieve(first.id).status == "completed"

        answer = http(base_url, api_keys["acme"], "DELETE", f"/responses/{first.id}")
        assert answer.status_code == 200
        assert answer.json() == {"id": first.id, "object": "response", "deleted": True}
        gone(
            lambda: sdk.responses.retrieve(first.id),
            lambda: sdk.responses.input_items.list(first.id),
            lambda: sdk.responses.cancel(first.id),
            lambda: sdk.responses.delete(first.id),  # twice: 404
            lambda: sdk.responses.create(
                model="scripted-1", previous_response_id=first.id, input="from the deleted one"
            ),
        )
        stream = http(base_url, api_keys["acme"], "GET", f"/responses/{first.id}?stream=true")
        assert stream.status_code == 404
        # The conversation's history is not the response: it goes on from the newest.
        assert sdk.responses.retrieve(second.id).status == "completed"
        third = sdk.responses.create(model="scripted-1", previous_response_id=second.id, input="on")
        assert third.status == "completed"
        texts = [i.text for i in model.requests[-1].history if i.kind == "user"]
        assert texts == ["hi", "again", "on"]
        assert sdk.responses.delete(third.id) is None  # the SDK's answer to a delete
        with pytest.raises(openai.BadRequestError, match="was deleted"):
            sdk.responses.create(model="scripted-1", previous_response_id=second.id, input="x")

    kept = scalar(db_url, "SELECT count(*) FROM outbox.responses WHERE deleted_at IS NOT NULL")
    assert kept == 2
    deletes = journal(db_url, "response.deleted")
    assert [(d[0], d[2], d[4]["response_id"]) for d in deletes] == [
        ("acme", "outbox-serve", str(uuid.UUID(first.id.removeprefix("resp_")))),
        ("acme", "outbox-serve", str(uuid.UUID(third.id.removeprefix("resp_")))),
    ]


def test_a_response_still_going_is_not_deleted(sdk, db_url):
    queued = sdk.responses.create(model="scripted-1", input="later", background=True)
    with pytest.raises(openai.BadRequestError, match="in progress") as refused:
        sdk.responses.delete(queued.id)
    assert refused.value.code == "response_in_progress"
    sdk.responses.cancel(queued.id)
    sdk.responses.delete(queued.id)
    gone(lambda: sdk.responses.retrieve(queued.id))
    with relay_thread(db_url, kinds=ALL_KINDS):
        asked = sdk.responses.create(
            model="scripted-1", input="script:approve refund 42", tools=[APPROVE_TOOL]
        )
    assert [i.type for i in asked.output] == ["function_call"]  # its run waits for the caller
    with pytest.raises(openai.BadRequestError, match="answer its function calls"):
        sdk.responses.delete(asked.id)
    assert sdk.responses.retrieve(asked.id).id == asked.id


# -- conversations and items ----------------------------------------------------------------


def test_a_deleted_conversation_is_404_with_its_items_and_responses(sdk, other, db_url):
    conv = sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "hi"}])
    with relay_thread(db_url, kinds=ALL_KINDS):
        response = sdk.responses.create(model="scripted-1", conversation=conv.id, input=[])
    item = sdk.conversations.items.list(conv.id).data[0]
    gone(lambda: other.conversations.delete(conv.id))
    assert sdk.conversations.retrieve(conv.id).id == conv.id

    deleted = sdk.conversations.delete(conv.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conv.id, "conversation.deleted", True)
    items = sdk.conversations.items
    gone(
        lambda: sdk.conversations.retrieve(conv.id),
        lambda: sdk.conversations.update(conv.id, metadata={"a": "b"}),
        lambda: sdk.conversations.delete(conv.id),  # twice: 404
        lambda: items.list(conv.id),
        lambda: items.retrieve(item.id, conversation_id=conv.id),
        lambda: items.delete(item.id, conversation_id=conv.id),
        lambda: items.create(conv.id, items=[{"type": "message", "role": "user", "content": "x"}]),
        lambda: sdk.responses.create(model="scripted-1", conversation=conv.id, input="more"),
        lambda: sdk.responses.retrieve(response.id),
        lambda: sdk.responses.input_items.list(response.id),
        lambda: sdk.responses.delete(response.id),
        lambda: sdk.responses.create(
            model="scripted-1", previous_response_id=response.id, input="more"
        ),
        # The same thread through the Assistants protocol.
        lambda: sdk.beta.threads.retrieve(str(uuid.UUID(conv.id.removeprefix("conv_")))),
    )
    thread_id = uuid.UUID(conv.id.removeprefix("conv_"))
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.messages WHERE thread_id = %s", [thread_id])
        == 2
    )
    assert [j[:3] for j in journal(db_url, "thread.deleted")] == [
        ("acme", thread_id, "outbox-serve")
    ]


def test_a_plain_item_is_deleted_and_leaves_the_replay_but_calls_and_results_stay(
    sdk, other, db_url, model
):
    conv = sdk.conversations.create(
        items=[{"type": "message", "role": "user", "content": "script:chatty refund 42"}]
    )
    with relay_thread(db_url, kinds=ALL_KINDS):
        asked = sdk.responses.create(
            model="scripted-1", conversation=conv.id, tools=[APPROVE_TOOL], input=[]
        )
        (call,) = [i for i in asked.output if i.type == "function_call"]
        (waiting,) = sdk.conversations.items.list(conv.id).data[1:]  # "let me ask"
        with pytest.raises(openai.BadRequestError, match="answer its tool calls"):
            sdk.conversations.items.delete(waiting.id, conversation_id=conv.id)
        output = [{"type": "function_call_output", "call_id": call.call_id, "output": "yes"}]
        sdk.responses.create(model="scripted-1", conversation=conv.id, input=output)
        sdk.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "user", "content": "my secret"}]
        )
        listed = sdk.conversations.items.list(conv.id).data
        texts = [(i.role, i.content[0].text) for i in listed]
        assert texts == [
            ("user", "script:chatty refund 42"),
            ("assistant", "let me ask"),
            ("assistant", "refund approved"),
            ("user", "my secret"),
        ]
        first, chatty, approved, secret = listed

        # The assistant turn that asked for the call: refused, naming why.
        with pytest.raises(openai.BadRequestError, match="carries tool calls") as refused:
            sdk.conversations.items.delete(chatty.id, conversation_id=conv.id)
        assert refused.value.code == "message_has_tool_calls"
        gone(lambda: other.conversations.items.delete(secret.id, conversation_id=conv.id))

        after = sdk.conversations.items.delete(secret.id, conversation_id=conv.id)
        assert (after.id, after.object) == (conv.id, "conversation")  # OpenAI answers this
        gone(
            lambda: sdk.conversations.items.retrieve(secret.id, conversation_id=conv.id),
            lambda: sdk.conversations.items.delete(secret.id, conversation_id=conv.id),
        )
        sdk.conversations.items.delete(approved.id, conversation_id=conv.id)
        assert [i.id for i in sdk.conversations.items.list(conv.id).data] == [first.id, chatty.id]

        model.clear_audit()
        later = sdk.responses.create(model="scripted-1", conversation=conv.id, input="go on")
        assert later.status == "completed"
    (request,) = model.requests
    replayed = [(i.kind, i.text) for i in request.history]
    assert ("user", "my secret") not in replayed and (
        "assistant",
        "refund approved",
    ) not in replayed
    kinds = [kind for kind, _ in replayed]
    assert kinds == ["user", "assistant", "tool_call", "tool_output", "user"], replayed

    # The database keeps the rule: no call-carrying turn, no tool result is ever deleted.
    thread_id = uuid.UUID(conv.id.removeprefix("conv_"))
    with psycopg.connect(db_url) as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(
                "UPDATE outbox.messages SET deleted_at = now() WHERE id = %s",
                [int(chatty.id.removeprefix("msg_"))],
            )
        assert err.value.sqlstate == "OB007"
        conn.rollback()
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "UPDATE outbox.messages SET deleted_at = now() "
                "WHERE thread_id = %s AND tool_call_ref IS NOT NULL",
                [thread_id],
            )
        conn.rollback()
        hidden = conn.execute(
            "SELECT content FROM outbox.messages WHERE thread_id = %s AND deleted_at IS NOT NULL "
            "ORDER BY seq",
            [thread_id],
        ).fetchall()
        replay, _repair = history.replay(conn, thread_id, "acme")  # the library's replay too
    assert hidden == [("refund approved",), ("my secret",)]
    assert [m["role"] for m in replay] == ["user", "assistant", "tool", "user", "assistant"]
    deletes = journal(db_url, "message.deleted")
    assert [(d[0], d[2], d[4]["message_id"]) for d in deletes] == [
        ("acme", "outbox-serve", int(secret.id.removeprefix("msg_"))),
        ("acme", "outbox-serve", int(approved.id.removeprefix("msg_"))),
    ]


def test_a_thread_message_is_deleted_through_the_assistants_protocol(sdk, other, db_url):
    thread = sdk.beta.threads.create(
        messages=[{"role": "user", "content": "keep"}, {"role": "user", "content": "drop"}]
    )
    keep, drop = sdk.beta.threads.messages.list(thread_id=thread.id, order="asc").data
    gone(lambda: other.beta.threads.messages.delete(drop.id, thread_id=thread.id))
    deleted = sdk.beta.threads.messages.delete(drop.id, thread_id=thread.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (
        drop.id,
        "thread.message.deleted",
        True,
    )
    gone(
        lambda: sdk.beta.threads.messages.retrieve(drop.id, thread_id=thread.id),
        lambda: sdk.beta.threads.messages.delete(drop.id, thread_id=thread.id),
        lambda: sdk.beta.threads.messages.delete("msg_999999", thread_id=thread.id),
    )
    assert [m.id for m in sdk.beta.threads.messages.list(thread_id=thread.id).data] == [keep.id]
    with pytest.raises(openai.APIStatusError, match="durable history") as refused:
        sdk.beta.threads.messages.update(keep.id, thread_id=thread.id, metadata={"a": "b"})
    assert refused.value.status_code == 405
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.messages WHERE thread_id = %s", [thread.id])
        == 2
    )
