"""``stream=true`` on ``outbox serve``: the openai SDK's streaming helpers against the live
app, the relay and the scripted model, with OpenAI's ``thread.*`` event names."""

from __future__ import annotations

import openai
import pytest

from tests.integration.test_serve import APPROVE_TOOL, SEND_EMAIL_TOOL
from tests.serve_harness import client

pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]


def test_stream_helper_follows_a_run_with_a_registered_tool_to_the_end(base_url, api_keys, relay):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[SEND_EMAIL_TOOL])
    thread = sdk.beta.threads.create(messages=[{"role": "user", "content": "script:email go"}])
    with sdk.beta.threads.runs.stream(thread_id=thread.id, assistant_id=assistant.id) as stream:
        names = [event.event for event in stream]
        run = stream.current_run
        text = stream.get_final_messages()
    assert run is not None and run.status == "completed"
    assert names[:2] == ["thread.run.created", "thread.run.queued"]
    assert names[-1] == "thread.run.completed"
    assert "thread.run.step.completed" in names
    assert "thread.message.delta" in names
    assert [m.content[0].text.value for m in text] == ["mail sent"]  # type: ignore[union-attr]
    sdk.close()


def test_stream_stops_at_requires_action_and_goes_on_after_streamed_outputs(
    base_url, api_keys, relay
):
    sdk = client(base_url, api_keys["acme"])
    assistant = sdk.beta.assistants.create(model="scripted-1", tools=[APPROVE_TOOL])
    events = list(
        sdk.beta.threads.create_and_run(
            assistant_id=assistant.id,
            thread={"messages": [{"role": "user", "content": "script:approve 42"}]},
            stream=True,
        )
    )
    assert events[0].event == "thread.created"
    assert events[-1].event == "thread.run.requires_action"
    run = events[-1].data
    assert isinstance(run, openai.types.beta.threads.Run)
    (call,) = run.required_action.submit_tool_outputs.tool_calls  # type: ignore[union-attr]
    with sdk.beta.threads.runs.submit_tool_outputs_stream(
        run_id=run.id,
        thread_id=run.thread_id,
        tool_outputs=[{"tool_call_id": call.id, "output": "approved"}],
    ) as stream:
        stream.until_done()
        done = stream.current_run
    assert done is not None and done.status == "completed"
    with pytest.raises(openai.BadRequestError):
        sdk.beta.threads.runs.submit_tool_outputs(
            run_id=run.id,
            thread_id=run.thread_id,
            tool_outputs=[{"tool_call_id": call.id, "output": "approved"}],
            stream=True,
        )
    sdk.close()
