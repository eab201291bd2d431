"""What a run passes to its model beside the history: ``tool_choice``,
``parallel_tool_calls`` and the answer's format (structured output, a JSON Schema) reach
the model in each API's shape, from the writer API and from ``outbox serve`` (the OpenAI
Agents SDK's ``ModelSettings`` and ``output_type``); a request that gives ones no model
could follow is refused with nothing stored. And a run waiting for client outputs takes
another model, tools and instructions for its next turn (``lifecycle.retarget_run``):
pins kept, unknown tools refused, journaled once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import psycopg
import pytest
from pydantic import BaseModel

from outbox import lifecycle, registry, writer
from outbox.errors import InvalidTransition, NotFound
from outbox.schemas import ModelOptions, Retarget, StartRun
from outbox.testing.scripted_model import ScriptedModel
from tests.helpers import lazy_import
from tests.relay_harness import relay_thread, scalar, wait_until

if TYPE_CHECKING:
    import agents
else:
    agents = lazy_import("agents")  # the Agents SDK is imported by the first test that uses it

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "42"}}
SCHEMA = {
    "type": "object",
    "properties": {"status": {"type": "string"}},
    "required": ["status"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "name": "order_status", "schema": SCHEMA, "strict": True}
OPTIONS = {
    "tool_choice": {"type": "function", "name": "lookup_order"},
    "parallel_tool_calls": False,
    "format": FORMAT,
}


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    agents.set_tracing_disabled(True)  # the Agents SDK would export traces to OpenAI otherwise
    yield
    agents.set_tracing_disabled(False)


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script("lookup", [{"tool_calls": [LOOKUP]}, {"text": '{"status": "shipped"}'}])
        yield server


@pytest.fixture
def tools(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        for name in ("lookup_order", "cancel_order"):
            registry.register(
                conn,
                registry.ToolSpec(
                    name=name, tenant_id=TENANT, executor="client", json_schema={"type": "object"}
                ),
            )
        conn.commit()
    return db_url


def start(db_url: str, model: ScriptedModel, **kw: Any) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread,
                model="scripted-1",
                base_url=model.url + "/v1",
                **{"message": "script:lookup where is order 42?", **kw},
            ),
        )
        conn.commit()
    return run


def status(db_url: str, run_id: uuid.UUID) -> str:
    return str(scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id]))


# -- the writer API, both model APIs ----------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (
            "responses",
            {
                "tool_choice": {"type": "function", "name": "lookup_order"},
                "parallel_tool_calls": False,
                "text": {"format": FORMAT},
            },
        ),
        (
            "chat",
            {
                "tool_choice": {"type": "function", "function": {"name": "lookup_order"}},
                "parallel_tool_calls": False,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "order_status", "schema": SCHEMA, "strict": True},
                },
            },
        ),
    ],
)
def test_the_options_reach_the_model_in_the_shape_of_its_api(tools, model, api, expected):
    run = start(
        tools, model, api=api, tools=["lookup_order"], model_options=ModelOptions(**OPTIONS)
    )
    with relay_thread(tools, kinds=ALL_KINDS):
        wait_until(lambda: status(tools, run.id) == "requires_action", what="the tool call")
    (sent,) = model.requests
    assert {k: sent.body.get(k) for k in expected} == expected
    assert "text" not in sent.body if api == "chat" else "response_format" not in sent.body
    stored = scalar(tools, "SELECT model_options FROM outbox.runs WHERE id = %s", [run.id])
    assert stored == OPTIONS


def test_without_tools_the_tool_options_are_not_sent(tools, model):
    options = ModelOptions(parallel_tool_calls=False, format=FORMAT)
    run = start(tools, model, message="hello", model_options=options)
    with relay_thread(tools, kinds=ALL_KINDS):
        wait_until(lambda: status(tools, run.id) == "completed", what="the answer")
    (sent,) = model.requests
    assert "parallel_tool_calls" not in sent.body and "tool_choice" not in sent.body
    assert sent.body["text"] == {"format": FORMAT}


# -- outbox serve: the OpenAI Agents SDK's settings, and what no model could follow ------------


class OrderStatus(BaseModel):
    status: str


def test_the_agents_sdk_settings_and_output_type_reach_the_model(
    db_url, base_url, api_key, model, relay
):
    calls: list[str] = []

    @agents.function_tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        calls.append(order_id)
        return json.dumps({"order_id": order_id, "status": "shipped"})

    async def go() -> Any:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        agent = agents.Agent(
            name="desk",
            instructions="You are the order desk.",
            tools=[lookup_order],
            output_type=OrderStatus,
            model_settings=agents.ModelSettings(
                tool_choice="lookup_order", parallel_tool_calls=False
            ),
            model=agents.OpenAIResponsesModel(model="scripted-1", openai_client=client),
        )
        try:
            result = await agents.Runner.run(
                agent,
                "script:lookup where is order 42?",
                run_config=agents.RunConfig(tracing_disabled=True),
            )
            return result.final_output
        finally:
            await client.close()

    answer = asyncio.run(go())
    assert answer == OrderStatus(status="shipped") and calls == ["42"]
    first, second = (r.body for r in model.requests)
    assert first["tool_choice"] == {"type": "function", "name": "lookup_order"}
    assert first["parallel_tool_calls"] is False and second["parallel_tool_calls"] is False
    for sent in (first, second):
        assert sent["text"]["format"]["type"] == "json_schema"
        assert sent["text"]["format"]["name"] == "final_output"
        assert sent["text"]["format"]["schema"]["properties"] == {
            "status": {"title": "Status", "type": "string"}
        }
    # the SDK forces the tool once, then lets the model answer (reset_tool_choice): its
    # second request, which carries the run on, gives the turn it starts no tool_choice
    assert "tool_choice" not in second
    with psycopg.connect(db_url) as conn:
        runs = conn.execute("SELECT model_options FROM outbox.runs").fetchall()
    assert len(runs) == 1 and "tool_choice" not in runs[0][0]


def test_a_response_shows_the_options_its_request_gave(base_url, api_key, relay):
    body = {
        "model": "scripted-1",
        "input": "hello",
        "tools": [{"type": "function", "name": "lookup_order", "parameters": {}}],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "text": {"format": FORMAT, "verbosity": "low"},
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    made = httpx2.post(base_url + "/responses", json=body, headers=headers, timeout=30)
    assert made.status_code == 200, made.text
    shown = httpx2.get(base_url + "/responses/" + made.json()["id"], headers=headers).json()
    assert (shown["tool_choice"], shown["parallel_tool_calls"]) == ("none", False)
    assert shown["text"] == {"format": FORMAT, "verbosity": "low"}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "not a tool choice"),
        ({"tool_choice": {"type": "function", "name": "refund"}}, "tool_choice", "'refund'"),
        ({"tool_choice": "required", "tools": []}, "tool_choice", "at least one tool"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "needs a 'schema'"),
        ({"text": {"format": {"type": "xml"}}}, "text", "not a format"),
        ({"text": {"format": FORMAT, "style": "terse"}}, "text", "not 'style'"),
        ({"parallel_tool_calls": "sometimes"}, "parallel_tool_calls", "boolean"),
    ],
)
def test_options_no_model_could_follow_are_refused_and_nothing_is_stored(
    db_url, base_url, api_key, relay, fields, param, words
):
    body = {
        "model": "scripted-1",
        "input": "hello",
        "tools": [{"type": "function", "name": "lookup_order", "parameters": {}}],
        **fields,
    }
    answer = httpx2.post(
        base_url + "/responses",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.threads") == 0


# -- reasoning items: passed back to the model that takes them, never read ---------------------


REASONED = [
    {"role": "user", "content": "script:lookup where is order 42?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-one"},
    {"type": "function_call", "call_id": "call_1", "name": "lookup_order", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
    {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "ok"}]},
    {"role": "assistant", "content": "it shipped"},
    {"role": "user", "content": "thanks, and order 43?"},
]


def create(base_url: str, api_key: str, body: dict[str, Any]) -> httpx2.Response:
    """``POST /responses`` with the tenant's key, as a client that is not the SDK sends it."""
    headers = {"Authorization": f"Bearer {api_key}"}
    return httpx2.post(base_url + "/responses", json=body, headers=headers, timeout=30)


def test_reasoning_items_of_a_history_go_back_to_the_model_before_what_followed_them(
    db_url, base_url, api_key, model, relay
):
    model.add_script("lookup", [{"text": "looking"}])
    answer = create(base_url, api_key, {"model": "scripted-1", "input": REASONED, "tools": []})
    assert answer.status_code == 200, answer.text
    (sent,) = model.requests
    kinds = [
        (i.get("type", "message"), i.get("id") or i.get("call_id")) for i in sent.body["input"]
    ]
    assert kinds == [
        ("message", None),
        ("reasoning", "rs_1"),
        ("function_call", "call_1"),
        ("function_call_output", "call_1"),
        ("reasoning", "rs_2"),
        ("message", None),
        ("message", None),
    ]
    assert [i for i in sent.body["input"] if i.get("type") == "reasoning"] == [
        REASONED[1],
        REASONED[4],
    ]  # verbatim


def test_a_history_of_messages_with_reasoning_seeds_a_thread_that_keeps_it(
    db_url, base_url, api_key, model, relay
):
    # Messages only: a new thread made with them, each message where it was and the
    # reasoning item on the message it came before, as with a history with calls.
    model.add_script("again", [{"text": "done"}])
    history = [
        {"role": "user", "content": "script:again first"},
        REASONED[4],
        {"role": "assistant", "content": "it shipped"},
        {"role": "user", "content": "and now?"},
    ]
    answer = create(base_url, api_key, {"model": "scripted-1", "input": history, "tools": []})
    assert answer.status_code == 200, answer.text
    (sent,) = model.requests
    assert [i.get("type", "message") for i in sent.body["input"]] == [
        "message",
        "reasoning",
        "message",
        "message",
    ]
    assert [i for i in sent.body["input"] if i.get("type") == "reasoning"] == [REASONED[4]]
    with psycopg.connect(db_url) as conn:
        stored = conn.execute(
            "SELECT seq, role, content, reasoning IS NOT NULL FROM outbox.messages ORDER BY seq"
        ).fetchall()
    assert stored[:3] == [
        (1, "user", "script:again first", False),
        (2, "assistant", "it shipped", True),
        (3, "user", "and now?", False),
    ]
    assert answer.json()["output"][-1]["content"][0]["text"] == "done"


def test_a_history_of_messages_seeds_a_thread_with_them_in_order(
    db_url, base_url, api_key, model, relay
):
    model.add_script("again", [{"text": "done"}])
    history = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "script:again first"},
        {"role": "assistant", "content": "sure"},
        {"role": "user", "content": "and now?"},
    ]
    answer = create(base_url, api_key, {"model": "scripted-1", "input": history, "tools": []})
    assert answer.status_code == 200, answer.text
    (sent,) = model.requests
    said = [(i.get("role"), i.get("content")) for i in sent.body["input"]]
    assert said[-3:] == [
        ("user", "script:again first"),
        ("assistant", "sure"),
        ("user", "and now?"),
    ]
    with psycopg.connect(db_url) as conn:
        stored = conn.execute(
            "SELECT seq, role, content FROM outbox.messages ORDER BY seq"
        ).fetchall()
        (from_seq,) = conn.execute("SELECT output_from_seq FROM outbox.responses").fetchone()
    assert stored[:3] == [
        (1, "user", "script:again first"),
        (2, "assistant", "sure"),
        (3, "user", "and now?"),
    ]
    assert from_seq == 4  # the output begins after the input, as the answer shows
    output = answer.json()["output"]
    assert [o["content"][0]["text"] for o in output if o["type"] == "message"] == ["done"]


def test_chat_completions_never_gets_reasoning_items(tools, model):
    with psycopg.connect(tools) as conn:
        thread, _ = lifecycle.import_thread(
            conn,
            TENANT,
            [
                {"role": "user", "content": "script:lookup where is order 42?"},
                {"role": "assistant", "content": "let me look", "reasoning": [REASONED[4]]},
            ],
        )
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted-1",
                message="and now?",
                api="chat",
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
    with relay_thread(tools, kinds=ALL_KINDS):
        wait_until(lambda: status(tools, run.id) != "queued" and model.requests, what="a turn")
    (sent,) = model.requests
    assert [m["role"] for m in sent.body["messages"]] == ["user", "assistant", "user"]
    assert all("reasoning" not in m for m in sent.body["messages"])


# -- retargeting a waiting run -------------------------------------------------------------------


def waiting_run(db_url: str, model: ScriptedModel) -> writer.RunRef:
    run = start(db_url, model, tools=["lookup_order"])
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: status(db_url, run.id) == "requires_action", what="the tool call")
    return run


def journaled(db_url: str, run_id: uuid.UUID) -> list[Any]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT detail FROM outbox.journal WHERE event = 'run.retargeted' AND run_id = %s",
            [run_id],
        ).fetchall()


def test_a_waiting_run_takes_new_tools_keeping_the_versions_it_pinned(tools, model):
    run = waiting_run(tools, model)
    change = Retarget(
        tenant_id=TENANT,
        run_id=run.id,
        model="scripted-2",
        tools=["lookup_order", "cancel_order"],
        instructions="You cancel orders.",
        model_options=ModelOptions(tool_choice="required"),
    )
    with psycopg.connect(tools) as conn:
        registry.register(  # a new version after the run pinned its first
            conn,
            registry.ToolSpec(
                name="lookup_order",
                tenant_id=TENANT,
                executor="client",
                json_schema={"type": "object", "properties": {"id": {"type": "string"}}},
            ),
        )
        assert lifecycle.retarget_run(conn, change, actor="test") is True
        assert lifecycle.retarget_run(conn, change, actor="test") is False  # the same again
        conn.commit()
        row = conn.execute(
            "SELECT model, tool_names, tool_pins, instructions, model_options, status"
            " FROM outbox.runs WHERE id = %s",
            [run.id],
        ).fetchone()
    assert row[0] == "scripted-2" and sorted(row[1]) == ["cancel_order", "lookup_order"]
    assert row[2]["lookup_order"]["version"] == 1  # pinned when the run started, kept
    assert row[2]["cancel_order"] == {"tenant_id": TENANT, "version": 1}
    assert row[3:] == ("You cancel orders.", {"tool_choice": "required"}, "requires_action")
    (detail,) = journaled(tools, run.id)
    assert detail[0]["changed"] == ["model", "tool_names", "instructions", "model_options"]
    assert detail[0]["tool_versions"] == {"cancel_order": {"tenant_id": TENANT, "version": 1}}


def test_an_unknown_tool_or_a_run_not_waiting_changes_nothing(tools, model):
    run = waiting_run(tools, model)
    with psycopg.connect(tools) as conn:
        with pytest.raises(NotFound, match="refund_order"):
            lifecycle.retarget_run(
                conn,
                Retarget(tenant_id=TENANT, run_id=run.id, model="m", tools=["refund_order"]),
            )
        conn.rollback()
        lifecycle.cancel_run(conn, run.id, TENANT)
        with pytest.raises(InvalidTransition, match="cancelled"):
            lifecycle.retarget_run(
                conn, Retarget(tenant_id=TENANT, run_id=run.id, model="m", tools=[])
            )
        conn.rollback()
    assert scalar(tools, "SELECT tool_names FROM outbox.runs WHERE id = %s", [run.id]) == [
        "lookup_order"
    ]
    assert journaled(tools, run.id) == []


def test_a_forced_function_must_be_one_of_the_tools():
    with pytest.raises(ValueError, match="'refund'"):
        Retarget(
            tenant_id=TENANT,
            run_id=uuid.uuid4(),
            model="m",
            tools=["lookup_order"],
            model_options=ModelOptions(tool_choice={"type": "function", "name": "refund"}),
        )


# -- the Assistants protocol's runs --------------------------------------------------------------


def test_an_assistants_run_passes_its_options_on_and_shows_them(
    db_url, base_url, api_key, model, relay
):
    headers = {"Authorization": f"Bearer {api_key}", "OpenAI-Beta": "assistants=v2"}
    tool = {"type": "function", "function": {"name": "lookup_order", "parameters": {}}}
    with httpx2.Client(base_url=base_url, headers=headers, timeout=30) as client:
        assistant = client.post("/assistants", json={"model": "scripted-1", "tools": [tool]})
        body = {
            "assistant_id": assistant.json()["id"],
            "thread": {"messages": [{"role": "user", "content": "script:lookup order 42?"}]},
            "tool_choice": {"type": "function", "function": {"name": "lookup_order"}},
            "parallel_tool_calls": False,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "order_status", "schema": SCHEMA, "strict": True},
            },
        }
        refused = client.post(
            "/threads/runs",
            json={
                **body,
                "tool_choice": "required",
                "assistant_id": client.post("/assistants", json={"model": "m"}).json()["id"],
            },
        )
        run = client.post("/threads/runs", json=body).json()
        wait_until(lambda: status(db_url, uuid.UUID(run["id"])) == "requires_action")
        shown = client.get(f"/threads/{run['thread_id']}/runs/{run['id']}").json()
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"
    (sent,) = model.requests
    assert sent.body["tool_choice"] == {"type": "function", "name": "lookup_order"}
    assert sent.body["parallel_tool_calls"] is False and sent.body["text"] == {"format": FORMAT}
    assert shown["tool_choice"] == body["tool_choice"]
    assert shown["response_format"] == body["response_format"]
    assert shown["parallel_tool_calls"] is False
