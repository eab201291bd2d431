"""Model providers: the two APIs a run may speak, and everything that differs between them.

A run names its ``api``: the Responses API (``function_call`` and ``function_call_output``
items, ``instructions`` beside the input) or chat completions (``tool_calls`` on assistant
messages, the instructions as a leading system message). This module is the one place that
knows those shapes, in both directions:

- history: the thread's chat-format messages (``outbox.history``, the internal lingua
  franca, repaired so every call has its result) as the API's input (``as_input``);
- tools: the registry's tool rows as the API's ``tools`` list (``tool_list``);
- the request body of a turn (``Adapter.request``), with the run's model options
  (sampling, reasoning, the output cap, the tool options, the answer's format...: kept
  in the Responses API's terms, written in chat completions' names where the run speaks
  it; docs/models.md has the table) and the conversation's ``prompt_cache_key``
  (``cache_key``), and the ``ModelTurnIn`` read back from the answer (``Adapter.turn``),
  for ``writer.record_model_turn``. The body's fields come in a fixed order with the
  history last, so each turn's body starts with the previous turn's, byte for byte: the
  prefix a provider's prompt cache can serve;
- ``max_tool_calls``, the one option enforced here (``calls_left``): calls a turn asks
  past it are dropped, and a run with none left asks for ``tool_choice: "none"``;
- the call itself (``call``): the body, plain JSON data, is POSTed as it is by the
  caller's ``post`` and the answer read as JSON for the few fields recorded.

The relay's model executor (``relay.model_turns``) owns the HTTP request, retries and holds; it
calls ``call``. The SDK's typed methods (``responses.create``) first walk the whole request
against its parameter types, item by item of the history, and build a pydantic object of
every field of the answer: about 40 ms of CPU for a 30-item history, ten times the cost of
the request itself, on the one event loop that holds every turn in flight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from outbox.schemas import ModelTurnIn, ToolCallIn

Message = dict[str, Any]
# Options both APIs take under the same name and in the same shape.
SAME_IN_BOTH = (
    "temperature",
    "top_p",
    "service_tier",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
    "top_logprobs",
)
Row = Mapping[str, Any]
# A message's key for the reasoning items that came before it: a client's history gave
# them, or the model answered them with the message and its calls.
REASONING = "reasoning"


# -- history ----------------------------------------------------------------------------


def to_responses_input(messages: list[Message]) -> list[Message]:
    """Chat-format messages as Responses API input items; the reasoning items a message
    carries (a client's, or the model's own answer's, verbatim) go right before its text
    and calls, where the model put them: a model refuses a ``function_call`` given
    without the reasoning item that came before it."""
    items: list[Message] = []
    for message in messages:
        items += message.get(REASONING) or []
        role = message["role"]
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
            continue
        if message.get("content"):
            items.append({"role": role, "content": message["content"]})
        for call in message.get("tool_calls") or []:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
    return items


def as_input(messages: list[Message], api: str) -> list[Message]:
    """Chat-format messages (already paired, ``outbox.history.repair``) in the format of
    ``api``: Responses input items, or the chat messages as they are."""
    return ADAPTERS[api].history(messages)


# -- tools ------------------------------------------------------------------------------


def tool_list(tools: Mapping[str, Row], api: str) -> list[dict[str, Any]]:
    """The provider's ``tools`` for ``api``: one function per registry row (by name, in name
    order), with its description and JSON Schema as the parameters."""
    return [ADAPTERS[api].tool(name, tool) for name, tool in sorted(tools.items())]


# -- the adapters -----------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """One API's shapes: where a turn is POSTed, its body, and what its answer records."""

    api: str
    path: str  # relative to the client's base URL

    def history(self, messages: list[Message]) -> list[Message]:
        raise NotImplementedError

    def tool(self, name: str, tool: Row) -> dict[str, Any]:
        raise NotImplementedError

    def request(
        self, run: Row, messages: list[Message], tools: Mapping[str, Row]
    ) -> dict[str, Any]:
        """The request body of a turn of ``run`` over ``messages`` (already in this API's
        format, ``as_input``) with the run's ``tools`` (registry rows by name)."""
        raise NotImplementedError

    def turn(self, response: dict[str, Any], run: Row, step_no: int) -> ModelTurnIn:
        """The turn to record from the API's answer (plain JSON data)."""
        raise NotImplementedError


class Responses(Adapter):
    """The Responses API: input items, ``instructions`` as a field of the request."""

    def history(self, messages: list[Message]) -> list[Message]:
        return to_responses_input(messages)

    def tool(self, name: str, tool: Row) -> dict[str, Any]:
        return {
            "type": "function",
            "name": name,
            "description": tool["description"],
            "parameters": tool["json_schema"],
        }

    def request(
        self, run: Row, messages: list[Message], tools: Mapping[str, Row]
    ) -> dict[str, Any]:
        options = run.get("model_options") or {}
        body: dict[str, Any] = {"model": run["model"]}
        if run["instructions"]:
            body["instructions"] = run["instructions"]
        if tools:
            body["tools"] = tool_list(tools, self.api)
            body.update(_tool_options(run, options))
        body.update({k: options[k] for k in SAME_IN_BOTH if k in options})
        body.update({k: options[k] for k in ("reasoning", "include") if k in options})
        if "max_output_tokens" in options:
            body["max_output_tokens"] = options["max_output_tokens"]
        text = {k: options[k] for k in ("format", "verbosity") if k in options}
        if text:
            body["text"] = text
        key = cache_key(run)
        if key is not None:
            body["prompt_cache_key"] = key
        body["input"] = messages  # last: what grows turn to turn
        return body

    def turn(self, response: dict[str, Any], run: Row, step_no: int) -> ModelTurnIn:
        texts: list[str] = []
        calls: list[ToolCallIn] = []
        reasoning: list[Message] = []
        for item in response["output"]:
            if item["type"] == "reasoning":
                reasoning.append(item)
            elif item["type"] == "message":
                texts += [c["text"] for c in item["content"] if c["type"] == "output_text"]
            elif item["type"] == "function_call":
                calls.append(
                    ToolCallIn(
                        tool_call_id=item["call_id"], name=item["name"], arguments=item["arguments"]
                    )
                )
        usage = response.get("usage") or {}
        return ModelTurnIn(
            tenant_id=run["tenant_id"],
            run_id=run["id"],
            step_no=step_no,
            content="".join(texts) or None,
            tool_calls=calls,
            reasoning=reasoning or None,
            response_id=response["id"],
            input_tokens=usage.get("input_tokens") or 0,
            output_tokens=usage.get("output_tokens") or 0,
            cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
        )


class Chat(Adapter):
    """Chat completions: messages with ``tool_calls``, the instructions as a leading system
    message of the request (never stored in the thread)."""

    def history(self, messages: list[Message]) -> list[Message]:
        # Chat completions takes no reasoning items: a client's are left out, never sent.
        return [
            {k: v for k, v in m.items() if k != REASONING} if REASONING in m else m
            for m in messages
        ]

    def tool(self, name: str, tool: Row) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": tool["description"],
                "parameters": tool["json_schema"],
            },
        }

    def request(
        self, run: Row, messages: list[Message], tools: Mapping[str, Row]
    ) -> dict[str, Any]:
        if run["instructions"]:
            messages = [{"role": "system", "content": run["instructions"]}, *messages]
        options = run.get("model_options") or {}
        body: dict[str, Any] = {"model": run["model"]}
        if tools:
            body["tools"] = tool_list(tools, self.api)
            chosen = _tool_options(run, options)
            if isinstance(chosen.get("tool_choice"), dict):
                name = chosen["tool_choice"]["name"]
                chosen["tool_choice"] = {"type": "function", "function": {"name": name}}
            body.update(chosen)
        body.update({k: options[k] for k in SAME_IN_BOTH if k in options})
        if "effort" in (options.get("reasoning") or {}):
            body["reasoning_effort"] = options["reasoning"]["effort"]
        if "max_output_tokens" in options:
            body["max_completion_tokens"] = options["max_output_tokens"]
        if "top_logprobs" in options:
            body["logprobs"] = True
        if "format" in options:
            body["response_format"] = _response_format(options["format"])
        if "verbosity" in options:
            body["verbosity"] = options["verbosity"]
        key = cache_key(run)
        if key is not None:
            body["prompt_cache_key"] = key
        body["messages"] = messages  # last: what grows turn to turn
        return body

    def turn(self, response: dict[str, Any], run: Row, step_no: int) -> ModelTurnIn:
        message = response["choices"][0]["message"]
        calls = [
            ToolCallIn(
                tool_call_id=c["id"],
                name=c["function"]["name"],
                arguments=c["function"]["arguments"],
            )
            for c in message.get("tool_calls") or []
            if c.get("type", "function") == "function"
        ]
        usage = response.get("usage") or {}
        return ModelTurnIn(
            tenant_id=run["tenant_id"],
            run_id=run["id"],
            step_no=step_no,
            content=message.get("content"),
            tool_calls=calls,
            response_id=response["id"],
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        )


def _tool_options(run: Row, options: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``tool_choice`` and ``parallel_tool_calls``, for a request that has tools:
    without tools chat completions refuses them, and they mean nothing to either API. A
    run out of tool calls (``max_tool_calls``) asks for none."""
    chosen = {k: options[k] for k in ("tool_choice", "parallel_tool_calls") if k in options}
    if calls_left(run) == 0:
        chosen["tool_choice"] = "none"
    return chosen


def calls_left(run: Row) -> int | None:
    """How many tool calls ``run`` may still make (``max_tool_calls`` less the calls its
    turns asked for so far, ``calls_made``), or None without a limit."""
    limit = (run.get("model_options") or {}).get("max_tool_calls")
    if limit is None:
        return None
    return max(0, int(limit) - int(run.get("calls_made") or 0))


def cache_key(run: Row) -> str | None:
    """The ``prompt_cache_key`` of every request of ``run``'s conversation: the caller's,
    else one derived from the tenant and the thread (a hash: the same for every turn and
    run of a thread, and naming neither), so the provider routes the thread's turns to
    the cache that holds its prefix. The model's catalogue row may say otherwise
    (``run["prompt_cache_key"]``): ``caller``, only the caller's; ``never``, none (None:
    the request carries no key, for a server that refuses the field)."""
    switch = run.get("prompt_cache_key", "derived")
    given = (run.get("model_options") or {}).get("prompt_cache_key")
    if switch == "never":
        return None
    if given:
        return str(given)
    if switch == "caller":
        return None
    seed = f"{run['tenant_id']}\x00{run['thread_id']}".encode()
    return "outbox-" + hashlib.sha256(seed).hexdigest()[:32]


def _response_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses ``text.format`` as chat completions' ``response_format``: a JSON
    Schema format's fields go under ``json_schema``."""
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


ADAPTERS: dict[str, Adapter] = {
    "responses": Responses("responses", "/responses"),
    "chat": Chat("chat", "/chat/completions"),
}


# -- the call ---------------------------------------------------------------------------


Post = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]  # (path, body) -> answer


async def call(
    post: Post,
    run: Row,
    step_no: int,
    messages: list[Message],
    tools: Mapping[str, Row],
) -> ModelTurnIn:
    """One model turn of ``run``: the request in the run's API, the turn to record.

    ``messages`` are already in the run's API format (``as_input``); ``post`` sends a body
    to a path of the run's server and returns the answer's JSON object. Raises what
    ``post`` raises, and ``KeyError``/``TypeError``/``ValueError``/
    ``pydantic.ValidationError`` for an answer that cannot be recorded."""
    adapter = ADAPTERS[run["api"]]
    sending = post(adapter.path, adapter.request(run, messages, tools))
    # The request holds what it needs of the history and the tools, and lets go of them
    # once encoded: a turn waits seconds to minutes for its answer, with thousands of others.
    del messages, tools
    response = await sending
    turn = adapter.turn(response, run, step_no)
    left = calls_left(run)
    if left is not None and len(turn.tool_calls) > left:
        # Calls past the run's max_tool_calls are not made, as OpenAI ignores them.
        turn = turn.model_copy(update={"tool_calls": turn.tool_calls[:left]})
    return turn
