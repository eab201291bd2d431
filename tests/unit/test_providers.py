"""The provider adapters and the idempotency-mode table: shapes, without a server."""

from __future__ import annotations

import uuid
from typing import get_args

from outbox import providers, registry

RUN = {
    "id": uuid.uuid4(),
    "tenant_id": "acme",
    "thread_id": uuid.uuid4(),
    "api": "chat",
    "model": "gpt-5",
    "instructions": "Be brief.",
}
TOOLS = {
    "b_tool": {"description": "second", "json_schema": {"type": "object"}},
    "a_tool": {"description": "first", "json_schema": {"type": "object", "properties": {}}},
}
CHAT = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a_tool", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "1"},
]


def test_tool_lists_are_in_name_order_in_each_api_shape():
    chat = providers.tool_list(TOOLS, "chat")
    responses = providers.tool_list(TOOLS, "responses")
    assert [t["function"]["name"] for t in chat] == ["a_tool", "b_tool"]
    assert chat[0]["function"]["parameters"] == TOOLS["a_tool"]["json_schema"]
    assert [t["name"] for t in responses] == ["a_tool", "b_tool"]
    assert responses[1] == {
        "type": "function",
        "name": "b_tool",
        "description": "second",
        "parameters": {"type": "object"},
    }


def test_chat_request_puts_the_instructions_first_and_keeps_the_history():
    body = providers.ADAPTERS["chat"].request(RUN, providers.as_input(CHAT, "chat"), TOOLS)
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1:] == CHAT
    assert body["tools"] == providers.tool_list(TOOLS, "chat")
    no_tools = providers.ADAPTERS["chat"].request({**RUN, "instructions": None}, CHAT, {})
    assert no_tools == {
        "model": "gpt-5",
        "prompt_cache_key": providers.cache_key(RUN),
        "messages": CHAT,
    }


def test_responses_request_sends_items_and_instructions_apart():
    items = providers.as_input(CHAT, "responses")
    body = providers.ADAPTERS["responses"].request(RUN, items, TOOLS)
    assert body["instructions"] == "Be brief."
    assert [i.get("type", i.get("role")) for i in body["input"]] == [
        "user",
        "function_call",
        "function_call_output",
    ]
    assert body["tools"] == providers.tool_list(TOOLS, "responses")


def test_answers_become_the_turn_to_record():
    chat = providers.ADAPTERS["chat"].turn(
        {
            "id": "cmpl_1",
            "choices": [
                {
                    "message": {
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c9",
                                "type": "function",
                                "function": {"name": "a_tool", "arguments": '{"x": 1}'},
                            }
                        ],
                    }
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        },
        RUN,
        2,
    )
    assert (chat.step_no, chat.response_id, chat.input_tokens, chat.output_tokens) == (
        2,
        "cmpl_1",
        7,
        3,
    )
    assert [(c.tool_call_id, c.name) for c in chat.tool_calls] == [("c9", "a_tool")]
    responses = providers.ADAPTERS["responses"].turn(
        {
            "id": "resp_1",
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "done"}]},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 1},
        },
        {**RUN, "api": "responses"},
        3,
    )
    assert (responses.content, responses.tool_calls, responses.input_tokens) == ("done", [], 5)


def test_every_idempotency_mode_has_its_row():
    assert set(registry.IDEMPOTENCY_MODES) == set(get_args(registry.ModeName))
    modes = registry.IDEMPOTENCY_MODES
    # Only a tool that dedups itself may be called without a mark, and run in chunks.
    assert [m for m in modes.values() if not m.dispatch_mark] == [modes["key"]]
    assert [m for m in modes.values() if m.in_chunks] == [modes["key"]]
    assert modes["none"].after_ambiguous == "unknown"
    assert registry.idempotency(None) == registry.NO_MODE


OPTIONS = {
    "temperature": 0.0,
    "top_p": 0.5,
    "reasoning": {"effort": "low", "summary": "auto"},
    "max_output_tokens": 300,
    "verbosity": "low",
    "service_tier": "flex",
    "safety_identifier": "user-hash-1",
    "user": "u1",
    "top_logprobs": 2,
    "include": ["reasoning.encrypted_content"],
    "max_tool_calls": 5,
    "truncation": "auto",
    "max_prompt_tokens": 1000,
    "prompt_cache_key": "conv-9",
}


def test_model_options_are_written_in_each_apis_terms():
    run = {**RUN, "model_options": OPTIONS}
    responses = providers.ADAPTERS["responses"].request(run, [], TOOLS)
    assert {k: v for k, v in responses.items() if k not in ("model", "instructions", "tools")} == {
        "temperature": 0.0,
        "top_p": 0.5,
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 300,
        "text": {"verbosity": "low"},
        "service_tier": "flex",
        "safety_identifier": "user-hash-1",
        "user": "u1",
        "top_logprobs": 2,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conv-9",
        "input": [],
    }
    chat = providers.ADAPTERS["chat"].request(run, [], TOOLS)
    assert {k: v for k, v in chat.items() if k not in ("model", "tools", "messages")} == {
        "temperature": 0.0,
        "top_p": 0.5,
        "reasoning_effort": "low",  # no summary in chat completions
        "max_completion_tokens": 300,
        "verbosity": "low",
        "service_tier": "flex",
        "safety_identifier": "user-hash-1",
        "user": "u1",
        "logprobs": True,
        "top_logprobs": 2,
        "prompt_cache_key": "conv-9",
    }


def test_the_cache_key_is_derived_from_tenant_and_thread_and_the_history_comes_last():
    body = providers.ADAPTERS["responses"].request(RUN, [{"role": "user", "content": "x"}], TOOLS)
    again = providers.ADAPTERS["responses"].request({**RUN, "id": uuid.uuid4()}, [], TOOLS)
    other = providers.ADAPTERS["responses"].request({**RUN, "thread_id": uuid.uuid4()}, [], TOOLS)
    key = body["prompt_cache_key"]
    assert key == again["prompt_cache_key"] != other["prompt_cache_key"]
    assert key.startswith("outbox-") and str(RUN["thread_id"]) not in key
    assert list(body)[-1] == "input"
    assert list(providers.ADAPTERS["chat"].request(RUN, [], TOOLS))[-1] == "messages"


def test_a_run_out_of_tool_calls_asks_for_none():
    run = {**RUN, "model_options": {"max_tool_calls": 3, "tool_choice": "auto"}, "calls_made": 3}
    assert providers.ADAPTERS["chat"].request(run, [], TOOLS)["tool_choice"] == "none"
    assert providers.calls_left({**run, "calls_made": 1}) == 2
    assert providers.calls_left(RUN) is None
