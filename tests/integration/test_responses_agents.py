"""The OpenAI Agents SDK's own features against a live ``outbox serve``, in its default mode
(the whole history every request): a streamed run (``Runner.run_streamed``), a handoff from
one agent to another (the second agent's tools and instructions reach the model from the
turn its request starts), and ``max_turns``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai
import psycopg
import pytest

from tests.helpers import lazy_import
from tests.integration.test_responses_stateless import counts

if TYPE_CHECKING:
    import agents
else:
    agents = lazy_import("agents")  # the Agents SDK is imported by the first test that uses it

LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "42"}}
HANDOFF = {"name": "transfer_to_desk", "arguments": {}}


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    agents.set_tracing_disabled(True)  # the Agents SDK would export traces to OpenAI otherwise
    yield
    agents.set_tracing_disabled(False)


def responses_model(
    base_url: str, api_key: str
) -> tuple[agents.OpenAIResponsesModel, openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return agents.OpenAIResponsesModel(model="scripted-1", openai_client=client), client


class Desk:
    """The order desk: one local tool, counting its calls."""

    def __init__(self, chat: agents.OpenAIResponsesModel) -> None:
        self.calls: list[str] = []

        @agents.function_tool
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            self.calls.append(order_id)
            return json.dumps({"order_id": order_id, "status": "shipped"})

        self.agent = agents.Agent(
            name="desk",
            instructions="You are the order desk.",
            tools=[lookup_order],
            model=chat,
        )


def test_a_streamed_run_gets_the_events_and_the_answer(db_url, base_url, api_key, model, relay):
    model.add_script("lookup", [{"tool_calls": [LOOKUP]}, {"text": "order 42 shipped"}])

    async def go() -> tuple[Any, list[str], list[str]]:
        chat, client = responses_model(base_url, api_key)
        desk = Desk(chat)
        try:
            result = agents.Runner.run_streamed(
                desk.agent,
                "script:lookup where is order 42?",
                run_config=agents.RunConfig(tracing_disabled=True),
            )
            kinds = [event.type async for event in result.stream_events()]
            return result.final_output, kinds, desk.calls
        finally:
            await client.close()

    answer, kinds, calls = asyncio.run(go())
    assert answer == "order 42 shipped"
    assert calls == ["42"]  # once, by the SDK
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    stored = counts(db_url, "acme")
    assert (stored["threads"], stored["runs"], stored["responses"]) == (1, 1, 2)


@pytest.mark.parametrize("mode", ["stateless", "auto_previous_response_id", "conversation_id"])
def test_a_handoff_carries_the_conversation_to_the_second_agent(
    db_url, base_url, api_key, model, relay, mode
):
    model.add_script(
        "handoff", [{"tool_calls": [HANDOFF]}, {"tool_calls": [LOOKUP]}, {"text": "shipped"}]
    )

    async def go() -> tuple[Any, str, list[str]]:
        chat, client = responses_model(base_url, api_key)
        desk = Desk(chat)
        triage = agents.Agent(
            name="triage", instructions="Route the customer.", handoffs=[desk.agent], model=chat
        )
        options: dict[str, Any] = {}
        if mode == "auto_previous_response_id":
            options["auto_previous_response_id"] = True
        elif mode == "conversation_id":
            options["conversation_id"] = (await client.conversations.create()).id
        try:
            result = await agents.Runner.run(
                triage,
                "script:handoff where is order 42?",
                run_config=agents.RunConfig(tracing_disabled=True),
                **options,
            )
            return result.final_output, result.last_agent.name, desk.calls
        finally:
            await client.close()

    answer, last, calls = asyncio.run(go())
    sent = [r for r in model.requests if r.script == "handoff"]
    assert (answer, last, calls) == ("shipped", "desk", ["42"])
    # each agent's own tools and instructions reached the model: the triage's handoff,
    # then the desk's tool, on the one run the handoff's answer carried on
    assert [sorted(_names(r.tools)) for r in sent] == [
        ["transfer_to_desk"],
        ["lookup_order"],
        ["lookup_order"],
    ]
    assert [r.body.get("instructions") for r in sent] == [
        "Route the customer.",
        "You are the order desk.",
        "You are the order desk.",
    ]
    with psycopg.connect(db_url) as conn:
        threads = conn.execute("SELECT count(*) FROM outbox.threads").fetchone()
        runs = conn.execute("SELECT count(*) FROM outbox.runs").fetchone()
        retargets = conn.execute(
            "SELECT detail->'changed', detail->'tools' FROM outbox.journal"
            " WHERE event = 'run.retargeted'"
        ).fetchall()
    assert (threads, runs) == ((1,), (1,))
    # once, at the handoff: the desk's second request asks for what the run has already
    assert retargets == [(["tool_names", "instructions"], ["lookup_order"])]


def _names(tools: list[Any]) -> list[str]:
    return [t.get("name") or t.get("function", {}).get("name") for t in tools]


def test_max_turns_stops_the_sdk_and_the_run_waits_for_its_outputs(
    db_url, base_url, api_key, model, relay
):
    model.add_script("lookup", [{"tool_calls": [LOOKUP]}, {"text": "order 42 shipped"}])

    async def go() -> tuple[list[str], Any]:
        chat, client = responses_model(base_url, api_key)
        desk = Desk(chat)
        config = agents.RunConfig(tracing_disabled=True)
        try:
            with pytest.raises(agents.MaxTurnsExceeded):
                await agents.Runner.run(
                    desk.agent, "script:lookup where is order 42?", max_turns=1, run_config=config
                )
            calls = list(desk.calls)
            again = await agents.Runner.run(
                desk.agent, "script:lookup where is order 42?", max_turns=3, run_config=config
            )
            return calls, again.final_output
        finally:
            await client.close()

    calls, again = asyncio.run(go())
    # the SDK ran its tool (turn 1) and stopped before sending the output (turn 2): that
    # run waits for the output until --action-timeout expires it; the SDK's next run is a
    # history of its own (a new thread), not held back by the waiting one
    assert calls == ["42"] and again == "order 42 shipped"
    with psycopg.connect(db_url) as conn:
        statuses = conn.execute("SELECT status FROM outbox.runs ORDER BY created_at").fetchall()
    assert statuses == [("requires_action",), ("completed",)]
