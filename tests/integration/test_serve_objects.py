"""``outbox serve``: modifying and deleting assistants, thread metadata, one message and one
run step by id (the openai SDK as the client), each kept to its tenant; a server whose
login is only a member of ``outbox_api`` (it looks keys up without reading ``api_keys``);
the access log. Threads and messages are deleted in test_serve_deletes."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import httpx2
import openai
import psycopg
import pytest

from outbox.logs import JsonFormatter
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import client, serve

pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]


def test_modify_an_assistant_changes_only_the_fields_given(base_url, api_keys, db_url):
    sdk = client(base_url, api_keys["acme"])
    made = sdk.beta.assistants.create(
        model="scripted-1", name="desk", instructions="Be brief.", metadata={"team": "a"}
    )
    changed = sdk.beta.assistants.update(made.id, instructions="Be kind.", name=None)
    assert (changed.instructions, changed.name, changed.model) == ("Be kind.", None, "scripted-1")
    assert changed.metadata == {"team": "a"}
    again = sdk.beta.assistants.retrieve(made.id)
    assert again.instructions == "Be kind." and again.name is None
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument"):
        sdk.beta.assistants.update(made.id, extra_body={"colour": "red"})
    with pytest.raises(openai.BadRequestError, match="function"):
        sdk.beta.assistants.update(made.id, tools=[{"type": "code_interpreter"}])
    assert sdk.beta.assistants.retrieve(made.id).tools == []  # the refused change kept nothing
    other = client(base_url, api_keys["globex"])
    with pytest.raises(openai.NotFoundError):
        other.beta.assistants.update(made.id, instructions="mine now")
    assert sdk.beta.assistants.retrieve(made.id).instructions == "Be kind."
    events = scalar(
        db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'assistant.modified'"
    )
    assert events == 1
    sdk.close()
    other.close()


def test_delete_an_assistant_keeps_its_runs_and_is_404_after(base_url, api_keys, db_url):
    sdk = client(base_url, api_keys["acme"])
    made = sdk.beta.assistants.create(model="scripted-1")
    with relay_thread(db_url, kinds=("model_turn",)):
        run = sdk.beta.threads.create_and_run_poll(
            assistant_id=made.id,
            thread={"messages": [{"role": "user", "content": "hi"}]},
            poll_interval_ms=100,
        )
    assert run.status == "completed"
    other = client(base_url, api_keys["globex"])
    with pytest.raises(openai.NotFoundError):
        other.beta.assistants.delete(made.id)
    gone = sdk.beta.assistants.delete(made.id)
    assert (gone.id, gone.object, gone.deleted) == (made.id, "assistant.deleted", True)
    with pytest.raises(openai.NotFoundError):
        sdk.beta.assistants.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        sdk.beta.assistants.delete(made.id)
    kept = sdk.beta.threads.runs.retrieve(run.id, thread_id=run.thread_id)
    assert kept.status == "completed" and kept.assistant_id is None
    with pytest.raises(openai.NotFoundError):
        sdk.beta.threads.runs.create(thread_id=run.thread_id, assistant_id=made.id)
    sdk.close()
    other.close()


def test_thread_metadata_message_and_step_by_id(base_url, api_keys, db_url):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create(
        messages=[{"role": "user", "content": "hi"}], metadata={"customer": "42"}
    )
    changed = sdk.beta.threads.update(thread.id, metadata={"customer": "43", "vip": "yes"})
    assert changed.metadata == {"customer": "43", "vip": "yes"}
    assert sdk.beta.threads.retrieve(thread.id).metadata == changed.metadata
    with relay_thread(db_url, kinds=("model_turn",)):
        run = sdk.beta.threads.runs.create_and_poll(
            thread_id=thread.id, assistant_id=assistant.id, poll_interval_ms=100
        )
    assert run.status == "completed"
    listed = sdk.beta.threads.messages.list(thread_id=thread.id, order="asc").data
    for message in listed:
        one = sdk.beta.threads.messages.retrieve(message.id, thread_id=thread.id)
        assert one.model_dump() == message.model_dump()
    (step,) = sdk.beta.threads.runs.steps.list(run_id=run.id, thread_id=thread.id).data
    one_step = sdk.beta.threads.runs.steps.retrieve(step.id, thread_id=thread.id, run_id=run.id)
    assert one_step.model_dump() == step.model_dump()

    other = client(base_url, api_keys["globex"])
    with pytest.raises(openai.NotFoundError):
        other.beta.threads.update(thread.id, metadata={"customer": "evil"})
    with pytest.raises(openai.NotFoundError):
        other.beta.threads.messages.retrieve(listed[0].id, thread_id=thread.id)
    with pytest.raises(openai.NotFoundError):
        other.beta.threads.runs.steps.retrieve(step.id, thread_id=thread.id, run_id=run.id)
    for missing in ("msg_999999", "msg_x", "nonsense"):
        with pytest.raises(openai.NotFoundError):
            sdk.beta.threads.messages.retrieve(missing, thread_id=thread.id)
    with pytest.raises(openai.NotFoundError):
        sdk.beta.threads.runs.steps.retrieve("step_999999", thread_id=thread.id, run_id=run.id)
    assert sdk.beta.threads.retrieve(thread.id).metadata == {"customer": "43", "vip": "yes"}
    with pytest.raises(openai.APIStatusError, match="durable history") as refused:
        sdk.beta.threads.messages.update(listed[0].id, thread_id=thread.id, metadata={"a": "b"})
    assert refused.value.status_code == 405  # deletes: test_serve_deletes
    assert len(sdk.beta.threads.messages.list(thread_id=thread.id).data) == len(listed)
    sdk.close()
    other.close()


def test_a_login_that_is_only_a_member_of_outbox_api_serves_and_cannot_read_keys(
    db_url, model, api_keys
):
    login = f"serve_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {login} LOGIN")
        conn.execute(f"GRANT outbox_api TO {login}")
    try:
        url = psycopg.conninfo.make_conninfo(db_url, user=login)
        with psycopg.connect(url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT key_hash FROM outbox.api_keys")
        with serve(url, model_base_url=model.url + "/v1") as base_url:
            sdk = client(base_url, api_keys["acme"])
            made = sdk.beta.assistants.create(model="scripted-1")
            assert sdk.beta.assistants.retrieve(made.id).id == made.id
            # A create looks its key up in its own transaction (Store.for_key).
            started = sdk.responses.create(model="scripted-1", input="hi", background=True)
            assert started.status == "queued"
            with pytest.raises(openai.AuthenticationError):
                client(base_url, "ob-" + "x" * 43).beta.assistants.list()
            with pytest.raises(openai.AuthenticationError):
                client(base_url, "ob-" + "x" * 43).responses.create(model="m", input="hi")
            sdk.close()
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {login}")
            conn.execute(f"DROP ROLE {login}")


def test_every_request_is_logged_with_its_tenant_path_ids_and_request_id(
    base_url, api_keys, caplog
):
    caplog.set_level(logging.INFO, logger="server.access")
    thread = client(base_url, api_keys["acme"]).beta.threads.create()
    url = f"{base_url}/threads/{thread.id}/runs/{uuid.uuid4()}"
    answered = httpx2.get(
        url, headers={"Authorization": f"Bearer {api_keys['acme']}", "X-Request-Id": "req-42"}
    )
    assert answered.status_code == 404 and answered.headers["x-request-id"] == "req-42"
    refused = httpx2.get(f"{base_url}/assistants", headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401 and refused.headers["x-request-id"].startswith("req_")

    def logged() -> list[dict[str, Any]]:
        return [json.loads(JsonFormatter().format(r)) for r in caplog.records]

    # The access line is written once the answer has left, so it may come a moment after
    # the client has it.
    lines = wait_until(
        lambda: (
            (found := logged())
            and any(line["correlation_id"] == "req-42" for line in found)
            and any(line["status"] == 401 for line in found)
            and found
        ),
        timeout_s=10,
        what="both access lines",
    )
    mine = next(line for line in lines if line["correlation_id"] == "req-42")
    assert mine["event"] == "api.request" and mine["tenant_id"] == "acme"
    assert (mine["thread_id"], mine["status"], mine["method"]) == (thread.id, 404, "GET")
    assert mine["run_id"] == url.rsplit("/", 1)[1]
    theirs = next(line for line in lines if line["status"] == 401)
    assert theirs["tenant_id"] is None and theirs["correlation_id"].startswith("req_")
