"""ScriptedModel over real HTTP, driven by the real ``openai`` SDK (no database)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from outbox.testing.scripted_model import (
    CALL_WITHOUT_OUTPUT,
    CALLS_WITHOUT_TOOL,
    OUTPUT_WITHOUT_CALL,
    TOOL_WITHOUT_CALL,
    HistoryItem,
    ScriptedModel,
)

PARALLEL = [
    {
        "tool_calls": [
            {"name": "create_ticket", "arguments": {"title": "printer"}},
            {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "hi"}},
        ]
    },
    {"text": "both done"},
]
PROCESS_TIMEOUT_S = 10.0  # seconds for the subprocess fake to start or exit


def echo_outputs(history: list[HistoryItem]) -> dict[str, Any]:
    return {"text": "|".join(item.text for item in history if item.kind == "tool_output")}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    scripts: dict[str, list[Any]] = {
        "parallel": PARALLEL,
        "echo": [{"tool_calls": [{"name": "noop"}, {"name": "noop"}]}, echo_outputs],
        "calls_only": [{"tool_calls": [{"name": "noop"}]}],
    }
    with ScriptedModel(scripts) as srv:
        yield srv


@pytest.fixture
def client(model: ScriptedModel) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=model.url + "/v1", api_key="test", max_retries=0) as c:
        yield c


def user(text: str) -> Any:
    return {"role": "user", "content": text}


def fc(call_id: str, name: str = "noop") -> Any:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def fco(call_id: str, output: str = "ok") -> Any:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def assistant_calls(*ids: str) -> Any:
    calls = [
        {"id": i, "type": "function", "function": {"name": "noop", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def tool_msg(call_id: str) -> Any:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


# -- Responses API ---------------------------------------------------------------------------


def test_responses_parallel_calls_then_text(client: openai.OpenAI) -> None:
    history: list[Any] = [user("script:parallel open a ticket and mail")]
    first = client.responses.create(model="fake-1", input=history)

    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["create_ticket", "send_email"]
    assert json.loads(calls[0].arguments) == {"title": "printer"}
    assert all(c.call_id.startswith("call_") for c in calls)
    assert len({c.call_id for c in calls}) == 2
    assert first.usage is not None
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens > 0

    history += [item.model_dump(exclude_none=True) for item in first.output]
    history += [fco(c.call_id, "done") for c in calls]
    second = client.responses.create(model="fake-1", input=history)
    assert second.output_text == "both done"


def test_resent_request_gets_same_turn_with_fresh_ids(
    client: openai.OpenAI, model: ScriptedModel
) -> None:
    history = [user("script:parallel")]
    a = client.responses.create(model="m", input=history)
    b = client.responses.create(model="m", input=history)
    a_calls = [i for i in a.output if i.type == "function_call"]
    b_calls = [i for i in b.output if i.type == "function_call"]
    assert [c.name for c in a_calls] == [c.name for c in b_calls]
    assert {c.call_id for c in a_calls}.isdisjoint({c.call_id for c in b_calls})
    assert a.usage == b.usage  # deterministic token counts
    assert [r.turn_index for r in model.requests] == [0, 0]


def test_past_end_and_default_script(client: openai.OpenAI) -> None:
    past_end = [
        user("script:parallel"),
        fc("call_1"),
        fco("call_1"),
        {"role": "assistant", "content": "x"},
    ]
    past_end += [user("again")]
    assert client.responses.create(model="m", input=past_end).output_text == "both done"
    assert client.responses.create(model="m", input="hello").output_text == "done"
    no_text = [user("script:calls_only"), fc("call_1"), fco("call_1")]
    assert client.responses.create(model="m", input=no_text).output_text == "done"


def test_callable_turn_sees_history(client: openai.OpenAI) -> None:
    history = [
        user("script:echo"),
        fc("call_a"),
        fc("call_b"),
        fco("call_a", "A"),
        fco("call_b", "B"),
    ]
    assert client.responses.create(model="m", input=history).output_text == "A|B"


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ([user("hi"), fco("call_x")], OUTPUT_WITHOUT_CALL.format(call_id="call_x")),
        ([user("hi"), fc("call_y")], CALL_WITHOUT_OUTPUT.format(call_id="call_y")),
        ([user("hi"), fc("call_y"), user("more")], CALL_WITHOUT_OUTPUT.format(call_id="call_y")),
        (
            [user("hi"), fc("call_z"), fco("call_z"), fco("call_z")],
            "Duplicate function call output for call_id call_z.",
        ),
    ],
)
def test_responses_history_validation(
    client: openai.OpenAI, history: list[Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input=history)
    assert isinstance(err.value.body, dict)
    assert err.value.body["message"] == message
    assert err.value.body["type"] == "invalid_request_error"
    assert message in str(err.value)


# -- chat completions ------------------------------------------------------------------------


def test_chat_parallel_calls_then_text(client: openai.OpenAI) -> None:
    messages: list[Any] = [user("script:parallel please")]
    first = client.chat.completions.create(model="fake-1", messages=messages)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls if c.type == "function"] == [
        "create_ticket",
        "send_email",
    ]
    assert first.usage is not None and first.usage.prompt_tokens > 0

    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [tool_msg(c.id) for c in calls]
    second = client.chat.completions.create(model="fake-1", messages=messages)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "both done"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([user("hi"), tool_msg("call_x")], TOOL_WITHOUT_CALL),
        (
            [user("hi"), assistant_calls("call_1", "call_2"), tool_msg("call_1")],
            CALLS_WITHOUT_TOOL.format(ids="call_2"),
        ),
        (
            [user("hi"), assistant_calls("call_1", "call_2"), user("next")],
            CALLS_WITHOUT_TOOL.format(ids="call_1, call_2"),
        ),
        (
            [user("hi"), assistant_calls("call_1"), tool_msg("call_1"), tool_msg("call_1")],
            TOOL_WITHOUT_CALL,
        ),
    ],
)
def test_chat_history_validation(client: openai.OpenAI, messages: list[Any], message: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=messages)
    assert isinstance(err.value.body, dict)
    assert err.value.body["message"] == message
    assert message in str(err.value)


def test_exact_openai_texts() -> None:
    assert CALLS_WITHOUT_TOOL.format(ids="call_1").endswith(
        "The following tool_call_ids did not have response messages: call_1"
    )
    assert OUTPUT_WITHOUT_CALL.format(call_id="c") == (
        "No tool call found for function call output with call_id c."
    )


# -- faults and audit ------------------------------------------------------------------------


def test_rate_limit_then_server_error_then_ok(client: openai.OpenAI, model: ScriptedModel) -> None:
    model.fail_next(1, status=429, retry_after_s=2)
    with pytest.raises(openai.RateLimitError) as rate:
        client.responses.create(model="m", input="hi")
    assert rate.value.response.headers["retry-after"] == "2"
    assert rate.value.code == "rate_limit_exceeded"

    model.fail_next(1, status=500)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[user("hi")])

    assert client.responses.create(model="m", input="hi").output_text == "done"
    assert [r.status for r in model.requests] == [429, 500, 200]


def test_a_model_down_answers_every_request_until_up(
    client: openai.OpenAI, model: ScriptedModel
) -> None:
    model.down(503)
    for _ in range(3):
        with pytest.raises(openai.InternalServerError) as down:
            client.responses.create(model="m", input="hi")
        assert "retry-after" not in down.value.response.headers
    model.up()
    assert client.responses.create(model="m", input="hi").output_text == "done"
    assert [r.status for r in model.requests] == [503, 503, 503, 200]


def test_dropped_connection_and_latency(client: openai.OpenAI, model: ScriptedModel) -> None:
    model.drop_next(1)
    with pytest.raises(openai.APIConnectionError):
        client.responses.create(model="m", input="hi")
    assert model.requests[-1].status is None

    model.set_faults(latencies_s=[2.0])
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.2).responses.create(model="m", input="hi")
    assert client.responses.create(model="m", input="hi").output_text == "done"


def test_http_control_plane(model: ScriptedModel, client: openai.OpenAI) -> None:
    with httpx2.Client(base_url=model.url) as http:
        added = http.post("/_script", json={"name": "remote", "turns": [{"text": "from afar"}]})
        assert added.status_code == 200
        assert http.post("/_faults", json={"fail_next": 1, "fail_status": 500}).status_code == 200
        assert http.post("/_faults", json={"nonsense": 1}).status_code == 400

        with pytest.raises(openai.InternalServerError):
            client.responses.create(model="m", input="script:remote")
        answer = client.responses.create(model="gpt-x", input="script:remote go")
        assert answer.output_text == "from afar"

        audit = http.get("/_audit").json()["requests"]
    assert [r["status"] for r in audit] == [500, 200]
    assert audit[1]["model"] == "gpt-x"
    assert audit[1]["script"] == "remote"
    assert audit[1]["history"] == [
        {
            "kind": "user",
            "text": "script:remote go",
            "call_id": None,
            "name": None,
            "arguments": None,
        }
    ]


def test_runs_as_a_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox.testing.scripted_model", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with httpx2.Client(base_url=url, timeout=PROCESS_TIMEOUT_S) as http:
            assert http.get("/_audit").json() == {"requests": []}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PROCESS_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
