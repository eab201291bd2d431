"""What a caller asks of the model reaches it on every turn, and every turn reuses the
provider's prompt cache.

The model options (sampling, reasoning, the output cap, the service tier, identifiers,
logprobs) reach the scripted model on every turn of a run with a tool call, from the
OpenAI Agents SDK's ``ModelSettings`` through ``outbox serve``, from an Assistants run,
from the writer API in both model APIs (chat completions' names) and from ``outbox runs
create``; a value no model could take is refused with nothing stored (the writer, the SQL
API, ``outbox serve``). ``max_tool_calls`` is enforced by the relay. Every request of a
conversation carries one ``prompt_cache_key`` (the caller's, else derived from the thread),
in an affinity header too where configured, and turn k's body starts with turn k-1's
history byte for byte; the cached tokens the model reports are stored, priced at the cached
price, and a 20-turn run reads nearly all of its input from the cache."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

import cli
from outbox import budgets, providers, writer
from outbox.schemas import ModelOptions, StartRun
from outbox.testing.scripted_model import ScriptedModel
from tests.helpers import lazy_import, look
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import ALL_KINDS, EMAIL, TENANTS

if TYPE_CHECKING:
    import agents
else:
    agents = lazy_import("agents")

TENANT = TENANTS[0]
ASKED = {
    "temperature": 0.0,
    "top_p": 0.5,
    "reasoning": {"effort": "low", "summary": "auto"},
    "max_output_tokens": 300,
    "service_tier": "flex",
    "safety_identifier": "user-7f3a",
    "top_logprobs": 2,
    "verbosity": "low",
}
# What each API's request carries for ASKED (chat completions: its own names).
SENT = {
    "responses": {
        "temperature": 0.0,
        "top_p": 0.5,
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 300,
        "service_tier": "flex",
        "safety_identifier": "user-7f3a",
        "top_logprobs": 2,
        "text": {"verbosity": "low"},
    },
    "chat": {
        "temperature": 0.0,
        "top_p": 0.5,
        "reasoning_effort": "low",
        "max_completion_tokens": 300,
        "service_tier": "flex",
        "safety_identifier": "user-7f3a",
        "logprobs": True,
        "top_logprobs": 2,
        "verbosity": "low",
    },
}


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    agents.set_tracing_disabled(True)  # the Agents SDK would export traces to OpenAI otherwise
    yield
    agents.set_tracing_disabled(False)


def start(db_url: str, model: ScriptedModel, message: str, **kw: Any) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = kw.pop("thread", None) or writer.create_thread(conn, TENANT).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread,
                model="scripted-1",
                base_url=model.url + "/v1",
                message=message,
                **kw,
            ),
        )
        conn.commit()
    return run


def status(db_url: str, run_id: uuid.UUID) -> str:
    return str(scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id]))


def finish(db_url: str, run_id: uuid.UUID, **relay: Any) -> None:
    with relay_thread(db_url, kinds=ALL_KINDS, **relay):
        wait_until(
            lambda: status(db_url, run_id) in ("completed", "failed"),
            timeout_s=120,
            what="the run's end",
        )
    assert status(db_url, run_id) == "completed"


def history_bytes(raw: str) -> str:
    """A request body without what closes its history (the body ends with the history)."""
    assert raw.endswith("]}"), raw[-50:]
    return raw[:-2]


# -- the writer API, both model APIs ---------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_options_reach_the_model_on_every_turn_in_each_apis_terms(db_url, api_keys, model, api):
    run = start(
        db_url,
        model,
        "script:email mail them",
        api=api,
        tools=["send_email"],
        instructions="You send mail.",
        model_options=ModelOptions(**ASKED),
    )
    finish(db_url, run.id)
    first, second = model.requests
    for sent in (first, second):
        assert {k: sent.body.get(k) for k in SENT[api]} == SENT[api]
        assert "include" not in sent.body and "max_tool_calls" not in sent.body
    # One cache key for the conversation, derived from the tenant and the thread.
    thread = scalar(db_url, "SELECT thread_id FROM outbox.runs WHERE id = %s", [run.id])
    key = providers.cache_key({"tenant_id": TENANT, "thread_id": thread})
    assert first.body["prompt_cache_key"] == second.body["prompt_cache_key"] == key
    # Turn 2 replays turn 1's request byte for byte, then adds the call and its result.
    assert second.raw.startswith(history_bytes(first.raw))
    assert len(second.raw) > len(first.raw)
    # Stored with the run and journaled with its start.
    stored = scalar(db_url, "SELECT model_options FROM outbox.runs WHERE id = %s", [run.id])
    assert stored == ASKED
    journaled = scalar(
        db_url,
        "SELECT detail -> 'model_options' FROM outbox.journal "
        "WHERE run_id = %s AND event = 'run.created'",
        [run.id],
    )
    assert journaled == ASKED


def test_a_thread_keeps_its_cache_key_across_runs_and_a_callers_key_wins(db_url, api_keys, model):
    first = start(db_url, model, "hello")
    finish(db_url, first.id)
    thread = scalar(db_url, "SELECT thread_id FROM outbox.runs WHERE id = %s", [first.id])
    second = start(db_url, model, "again", thread=thread)
    finish(db_url, second.id)
    own = start(db_url, model, "hi", model_options=ModelOptions(prompt_cache_key="conv-9"))
    finish(db_url, own.id)
    keys = [r.body["prompt_cache_key"] for r in model.requests]
    assert keys[0] == keys[1] != keys[2] == "conv-9"
    assert str(thread) not in keys[0] and TENANT not in keys[0]


# -- refusals: nothing stored ------------------------------------------------------------------


def test_a_value_no_model_could_take_is_refused_by_the_writer_and_the_sql_api(db_url):
    with pytest.raises(ValidationError, match=r"reasoning\.effort"):
        ModelOptions(reasoning={"effort": "extreme"})
    with pytest.raises(ValidationError, match="temperature"):
        ModelOptions(temperature=2.5)
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT).id
        conn.commit()
        for options, words in [
            ({"temperature": 3}, "temperature is a number from 0 to 2"),
            ({"reasoning": {"effort": "extreme"}}, "reasoning is"),
            ({"service_tier": "gold"}, "service_tier"),
            ({"seed": 7}, "'seed' is not a model option"),
            ({"max_tool_calls": 0}, "max_tool_calls is a whole number over 0"),
        ]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=words):
                conn.execute(
                    "SELECT * FROM outbox.start_run_v3(%s, %s, 'm', 'hi', "
                    "p_model_options => %s::jsonb)",
                    [TENANT, thread, json.dumps(options)],
                )
            conn.rollback()
        (run_id,) = conn.execute(
            "SELECT run_id FROM outbox.start_run_v3(%s, %s, 'm', 'hi', "
            "p_model_options => '{\"temperature\": 0.2}')",
            [TENANT, thread],
        ).fetchone()
        made = conn.execute(
            "SELECT model_options FROM outbox.runs WHERE id = %s", [run_id]
        ).fetchone()
        conn.rollback()
    assert made == ({"temperature": 0.2},)
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"service_tier": "gold"}, "service_tier"),
        ({"include": ["everything"]}, "include.0"),
        ({"top_logprobs": 50}, "top_logprobs"),
        ({"max_tool_calls": 0}, "max_tool_calls"),
    ],
)
def test_outbox_serve_refuses_a_bad_value_naming_the_field(
    db_url, base_url, api_key, fields, param
):
    answer = httpx2.post(
        base_url + "/responses",
        json={"model": "scripted-1", "input": "hello", **fields},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 0


# -- outbox serve: the Agents SDK, the Responses API, Assistants runs ---------------------------


def test_the_agents_sdk_model_settings_reach_the_model_on_every_turn(
    db_url, base_url, api_key, model, relay
):
    from openai.types.shared import Reasoning

    @agents.function_tool
    def send_email(to: str, subject: str) -> str:
        """Send a mail (declared to the model: outbox's registered tool makes the call)."""
        return "sent"

    async def go() -> Any:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        agent = agents.Agent(
            name="mailer",
            instructions="You send mail.",
            tools=[send_email],
            model_settings=agents.ModelSettings(
                temperature=0,
                top_p=0.5,
                reasoning=Reasoning(effort="low"),
                max_tokens=300,
                extra_args={"service_tier": "flex", "safety_identifier": "user-7f3a"},
            ),
            model=agents.OpenAIResponsesModel(model="scripted-1", openai_client=client),
        )
        try:
            result = await agents.Runner.run(
                agent, "script:email mail them", run_config=agents.RunConfig(tracing_disabled=True)
            )
            return result.final_output
        finally:
            await client.close()

    assert asyncio.run(go()) == "mail sent"
    first, second = model.requests
    for sent in (first, second):
        assert sent.body["temperature"] == 0 and sent.body["top_p"] == 0.5
        assert sent.body["reasoning"] == {"effort": "low"}
        assert sent.body["max_output_tokens"] == 300
        assert sent.body["service_tier"] == "flex"
        assert sent.body["safety_identifier"] == "user-7f3a"
    assert first.body["prompt_cache_key"] == second.body["prompt_cache_key"]


def test_a_response_of_the_openai_sdk_sends_its_options_and_shows_them(
    db_url, base_url, api_key, model, relay
):
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        first = client.responses.create(
            model="scripted-1",
            input="hello",
            temperature=0.2,
            top_p=0.8,
            reasoning={"effort": "minimal", "summary": "concise"},
            service_tier="flex",
            safety_identifier="user-7f3a",
            include=["reasoning.encrypted_content"],
            prompt_cache_key="desk-42",
            max_output_tokens=400,
        )
        second = client.responses.create(
            model="scripted-1",
            input="and again",
            previous_response_id=first.id,
            temperature=0.2,
            prompt_cache_key="desk-42",
        )
    sent, then = model.requests
    assert (sent.body["temperature"], sent.body["top_p"]) == (0.2, 0.8)
    assert sent.body["reasoning"] == {"effort": "minimal", "summary": "concise"}
    assert sent.body["include"] == ["reasoning.encrypted_content"]
    assert sent.body["max_output_tokens"] == 400 and sent.body["service_tier"] == "flex"
    assert sent.body["prompt_cache_key"] == then.body["prompt_cache_key"] == "desk-42"
    assert first.temperature == 0.2 and first.top_p == 0.8
    assert first.reasoning is not None and first.reasoning.effort == "minimal"
    assert first.service_tier == "flex" and first.prompt_cache_key == "desk-42"
    # The second request replays the first conversation: read from the cache, and shown.
    assert then.cached_tokens > 0
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens == then.cached_tokens


def test_an_assistants_run_passes_its_sampling_on_and_keeps_its_context_budget(
    db_url, base_url, api_key, model, relay
):
    headers = {"Authorization": f"Bearer {api_key}", "OpenAI-Beta": "assistants=v2"}
    tool = {"type": "function", "function": {"name": "send_email", "parameters": {}}}
    with httpx2.Client(base_url=base_url, headers=headers, timeout=30) as client:
        assistant = client.post("/assistants", json={"model": "scripted-1", "tools": [tool]})
        run = client.post(
            "/threads/runs",
            json={
                "assistant_id": assistant.json()["id"],
                "thread": {"messages": [{"role": "user", "content": "hello"}]},
                "temperature": 0.3,
                "top_p": 0.9,
                "reasoning_effort": "high",
                "max_completion_tokens": 500,
                "max_prompt_tokens": 20000,
                "truncation_strategy": {"type": "last_messages", "last_messages": 10},
            },
        ).json()
        wait_until(lambda: status(db_url, uuid.UUID(run["id"])) == "completed")
        shown = client.get(f"/threads/{run['thread_id']}/runs/{run['id']}").json()
    (sent,) = model.requests
    assert (sent.body["temperature"], sent.body["top_p"]) == (0.3, 0.9)
    assert sent.body["reasoning"] == {"effort": "high"}
    assert sent.body["max_output_tokens"] == 500
    assert "max_prompt_tokens" not in sent.body and "truncation_strategy" not in sent.body
    assert (shown["temperature"], shown["top_p"], shown["max_prompt_tokens"]) == (0.3, 0.9, 20000)
    assert shown["truncation_strategy"] == {"type": "last_messages", "last_messages": 10}


# -- outbox runs create ------------------------------------------------------------------------


def test_runs_create_takes_the_options(db_url, api_keys, model, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT).id
        conn.commit()
    args = ["runs", "create", "--thread", str(thread), "--tenant", TENANT, "--message", "hi"]
    args += ["--model", "scripted-1", "--base-url", model.url + "/v1", "--json"]
    refused = CliRunner().invoke(cli.main, [*args, "--reasoning-effort", "extreme"])
    assert refused.exit_code == 2 and "reasoning.effort" in refused.stderr, refused.output
    made = CliRunner().invoke(
        cli.main,
        [
            *args,
            *("--temperature", "0", "--reasoning-effort", "low", "--max-output-tokens", "64"),
            *("--include", "reasoning.encrypted_content", "--model-options", '{"top_p": 0.5}'),
        ],
    )
    assert made.exit_code == 0, made.output
    run_id = uuid.UUID(json.loads(made.stdout)["id"])
    finish(db_url, run_id)
    (sent,) = model.requests
    assert sent.body["temperature"] == 0 and sent.body["top_p"] == 0.5
    assert sent.body["reasoning"] == {"effort": "low"} and sent.body["max_output_tokens"] == 64
    assert sent.body["include"] == ["reasoning.encrypted_content"]


# -- max_tool_calls ----------------------------------------------------------------------------


def test_calls_past_max_tool_calls_are_not_made_and_the_run_then_asks_for_none(
    db_url, api_keys, model, service
):
    model.add_script(
        "three",
        [{"tool_calls": [EMAIL, EMAIL]}, {"tool_calls": [EMAIL, EMAIL]}, {"text": "done"}],
    )
    run = start(
        db_url,
        model,
        "script:three mail them",
        tools=["send_email"],
        model_options=ModelOptions(max_tool_calls=3, tool_choice="auto"),
    )
    finish(db_url, run.id)
    calls = scalar(db_url, "SELECT count(*) FROM outbox.tool_calls WHERE run_id = %s", [run.id])
    assert calls == 3  # two, then one of the second turn's two
    first, second, third = model.requests
    assert first.body["tool_choice"] == second.body["tool_choice"] == "auto"
    assert third.body["tool_choice"] == "none"


# -- the prompt cache --------------------------------------------------------------------------


def test_the_affinity_header_carries_the_cache_key_where_configured(db_url, api_keys, model):
    run = start(db_url, model, "script:email mail them", tools=["send_email"])
    finish(db_url, run.id, affinity_headers=(f"{model.url}/v1=X-Session-Affinity",))
    elsewhere = start(db_url, model, "hello")
    finish(db_url, elsewhere.id, affinity_headers=("http://other.invalid/v1=X-Session-Affinity",))
    *turns, other = model.requests
    assert len(turns) == 2
    for sent in turns:
        assert sent.headers["x-session-affinity"] == sent.body["prompt_cache_key"]
    assert "x-session-affinity" not in other.headers


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_model_set_without_the_derived_key_sends_only_a_callers_or_none(
    db_url, api_keys, model, api, monkeypatch
):
    """For a server that refuses fields it does not know: --no-prompt-cache-key sends no
    derived key (a caller's still goes), --prompt-cache-key never sends none at all."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)

    def models_set(*switch: str) -> dict[str, Any]:
        window = ["--context-window", "32768", "--max-output", "4096", "--json"]
        done = CliRunner().invoke(cli.main, ["models", "set", "scripted-1", *window, *switch])
        assert done.exit_code == 0, done.output
        return dict(json.loads(done.output))

    def keys_sent() -> list[str | None]:
        plain = start(db_url, model, "hello", api=api)
        finish(db_url, plain.id, affinity_headers=("X-Session-Affinity",))
        own = start(
            db_url, model, "hi", api=api, model_options=ModelOptions(prompt_cache_key="c-9")
        )
        finish(db_url, own.id, affinity_headers=("X-Session-Affinity",))
        sent = model.requests[-2:]
        for request in sent:
            assert request.headers.get("x-session-affinity") == request.body.get("prompt_cache_key")
        return [request.body.get("prompt_cache_key") for request in sent]

    assert models_set("--no-prompt-cache-key")["prompt_cache_key"] == "caller"
    assert keys_sent() == [None, "c-9"]
    assert models_set("--prompt-cache-key", "never")["prompt_cache_key"] == "never"
    assert keys_sent() == [None, None]
    assert models_set()["prompt_cache_key"] == "derived"
    derived, given = keys_sent()
    assert derived is not None and derived.startswith("outbox-") and given == "c-9"
    both = CliRunner().invoke(
        cli.main,
        [
            "models",
            "set",
            "m",
            "--context-window",
            "9",
            "--max-output",
            "1",
            "--no-prompt-cache-key",
            "--prompt-cache-key",
            "never",
        ],
    )
    assert both.exit_code == 2 and "--no-prompt-cache-key" in both.output


def long_run(db_url: str, model: ScriptedModel, turns: int, **options: Any) -> uuid.UUID:
    mails = [
        {"tool_calls": [{"name": "send_email", "arguments": {"to": f"{n}@b.c", "subject": "hi"}}]}
        for n in range(turns - 1)
    ]
    model.add_script("long", [*mails, {"text": "all sent"}])
    run = start(
        db_url,
        model,
        "script:long mail everyone",
        tools=["send_email"],
        instructions="You send mail. " * 40,
        model_options=ModelOptions(**options),
    )
    finish(db_url, run.id)
    return run.id


def test_a_long_run_reads_its_input_from_the_cache_and_costs_less(db_url, api_keys, model):
    with psycopg.connect(db_url) as conn:
        budgets.set_price(
            conn, "scripted-1", input_per_mtok="2", cached_input_per_mtok="0.2", output_per_mtok="8"
        )
        conn.commit()
    run_id = long_run(db_url, model, 20)
    rows = look(
        db_url,
        "SELECT input_tokens, cached_tokens, output_tokens, cost FROM outbox.model_turns "
        "WHERE run_id = %s ORDER BY step_no",
        [run_id],
    )
    assert len(rows) == 20
    # What the model reported is what is stored, turn by turn.
    assert [r[1] for r in rows] == [r.cached_tokens for r in model.requests]
    assert rows[0][1] == 0  # nothing to read on the first turn
    later_input = sum(r[0] for r in rows[1:])
    later_cached = sum(r[1] for r in rows[1:])
    assert later_cached >= 0.9 * later_input, (later_cached, later_input)
    # Priced at the cached price: less than the same tokens all read afresh.
    cost = sum(r[3] for r in rows)
    fresh = sum(Decimal(r[0]) * 2 + Decimal(r[2]) * 8 for r in rows) / 1_000_000
    assert 0 < cost < fresh / 2, (cost, fresh)
