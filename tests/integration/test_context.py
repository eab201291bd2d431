"""Runs that stay inside the model's window: the prompt budget, compaction, last_messages.

A relay in a thread of the test drives runs against the scripted model with a context
window (it refuses a request past it with OpenAI's ``context_length_exceeded``, and
records every request's tokens) and fake tools over HTTP. The stored thread is checked to
keep every call and result whatever the model was sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

import cli
from outbox import context, history, retention, writer
from outbox.failpoints import CRASH_EXIT_CODE
from outbox.schemas import StartRun
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import look
from tests.relay_harness import (
    FAST,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

TENANT = "acme"
MODEL = "scripted-32k"
WINDOW = 32_768
RESULT_BYTES = 8 * 1024
STEPS = 40
KINDS = ("model_turn", "tool_call", "deliver_batch")
ALL = ["--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch"]


def _page(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"page": arguments.get("page"), "text": "x" * RESULT_BYTES}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(faults={"context_window": WINDOW}) as server:
        server.add_script(
            "long",
            [
                *(
                    {"tool_calls": [{"name": "fetch_page", "arguments": {"page": i}}]}
                    for i in range(STEPS)
                ),
                {"text": "finished"},
            ],
        )
        server.add_script(
            "short",
            [{"tool_calls": [{"name": "fetch_page", "arguments": {"page": 0}}]}, {"text": "ok"}],
        )
        yield server


@pytest.fixture
def setup(db_url: str) -> Iterator[tuple[str, FakeToolService]]:
    with FakeToolService() as service:
        service.add_tool("fetch_page", "key", _page)
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "fetch_page", "key")
            context.set_model(conn, MODEL, context_window=WINDOW, max_output=4096)
            conn.commit()
        yield db_url, service


def start(
    db_url: str,
    model: ScriptedModel,
    script: str,
    api: str,
    *,
    options: dict[str, Any] | None = None,
    model_name: str = MODEL,
) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model=model_name,
                message=f"script:{script} read every page",
                tools=["fetch_page"],
                base_url=model.url + "/v1",
                api=api,
                max_steps=STEPS + 5,
            ),
        )
        if options:  # the run's model options as a caller's request stores them
            conn.execute(
                "UPDATE outbox.runs SET model_options = model_options || %s WHERE id = %s",
                [Jsonb(options), run.id],
            )
        conn.commit()
    return run


def finish(db_url: str, run: writer.RunRef, timeout_s: float = 180) -> str:
    query = "SELECT status FROM outbox.runs WHERE id = %s"
    return str(
        wait_until(
            lambda: (s := scalar(db_url, query, [run.id])) in ("completed", "failed") and s,
            timeout_s=timeout_s,
            what="the run to end",
        )
    )


def stored(db_url: str, run: writer.RunRef) -> list[dict[str, Any]]:
    with psycopg.connect(db_url) as conn:
        return history.stored_messages(conn, run.thread_id)


def summary_requests(model: ScriptedModel) -> list[Any]:
    summarising = HistoryItem("system", context.SUMMARY_INSTRUCTION)
    return [r for r in model.requests if r.history and r.history[0] == summarising]


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_long_run_completes_inside_the_window_and_keeps_its_thread(setup, model, api):
    db_url, _ = setup
    run = start(db_url, model, "long", api)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    sizes = [r.input_tokens for r in model.requests]
    assert all(r.status == 200 for r in model.requests), [r.status for r in model.requests]
    assert max(sizes) <= WINDOW, sizes
    turns = [r for r in model.requests if r not in summary_requests(model)]
    assert len(turns) == STEPS + 1  # every step's turn and the last, each answered once
    # the thread keeps every call and every result, in order
    messages = stored(db_url, run)
    calls = [c for m in messages for c in m.get("tool_calls") or []]
    results = [m for m in messages if m["role"] == "tool"]
    assert [json.loads(c["function"]["arguments"])["page"] for c in calls] == list(range(STEPS))
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in calls]
    assert all(len(m["content"]) > RESULT_BYTES for m in results)
    assert messages[-1]["content"] == "finished"
    # each compaction recorded once, journaled with its estimates, the summary kept apart
    rows = look(
        db_url,
        "SELECT step_no, through_seq, tokens_before, tokens_after FROM outbox.compactions "
        "WHERE run_id = %s ORDER BY step_no",
        [run.id],
    )
    assert rows, "a 40-step run of 8 KB results compacted"
    assert all(before > after for _, _, before, after in rows)
    events = scalar(
        db_url,
        "SELECT count(*) FROM outbox.journal WHERE run_id = %s AND event = 'context.compacted'",
        [run.id],
    )
    assert events == len(rows)
    # past the first compaction, a turn is sent the summary and the latest turns only
    first = rows[0][0]
    later = [r for r in turns if r.turn_index is not None and r.turn_index >= first]
    assert later and all(
        any(i.text.startswith(context.SUMMARY_PREFIX) for i in r.history) for r in later
    )
    assert max(r.input_tokens for r in later) < WINDOW
    # the summaries' tokens count in the run's budget, with its turns'
    answered = [r for r in model.requests if r.status == 200]
    usage = sum((r.response["usage"].get("total_tokens") or 0) for r in answered)
    used = scalar(db_url, "SELECT tokens_used FROM outbox.runs WHERE id = %s", [run.id])
    assert used == usage
    kept = scalar(
        db_url,
        "SELECT sum(input_tokens + output_tokens) FROM outbox.compactions WHERE run_id = %s",
        [run.id],
    )
    summarised = sum(r.response["usage"]["total_tokens"] for r in summary_requests(model))
    assert kept == summarised


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_short_run_sends_the_whole_thread_and_no_summary(setup, model, api):
    db_url, _ = setup
    run = start(db_url, model, "short", api)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    assert summary_requests(model) == []
    assert scalar(db_url, "SELECT count(*) FROM outbox.compactions") == 0
    last = model.requests[-1]
    with psycopg.connect(db_url) as conn:
        replayed, _ = history.replay(conn, run.thread_id, TENANT, api=api)
    sent = last.body["input"] if api == "responses" else last.body["messages"]
    assert sent == replayed[:-1]  # the whole thread, as replayed, but the final answer


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_models_own_context_length_exceeded_compacts_and_the_run_goes_on(setup, model, api):
    db_url, _ = setup
    model.set_faults(context_window=16_000)  # smaller than the catalogue says
    run = start(db_url, model, "long", api)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    refused = [r for r in model.requests if r.status == 400]
    assert refused and all(
        r.response["error"]["code"] == "context_length_exceeded" for r in refused
    )
    answered = [r.input_tokens for r in model.requests if r.status == 200]
    assert max(answered) <= 16_000
    assert scalar(db_url, "SELECT count(*) FROM outbox.compactions") >= 1


def test_truncation_disabled_fails_the_run_with_the_models_error(setup, model):
    db_url, _ = setup
    model.set_faults(context_window=16_000)
    run = start(db_url, model, "long", "responses", options={"truncation": "disabled"})
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "failed"
    error = scalar(db_url, "SELECT last_error FROM outbox.runs WHERE id = %s", [run.id])
    assert "maximum context length is 16000 tokens" in str(error)
    assert summary_requests(model) == []


def _next_page(items: list[HistoryItem]) -> dict[str, Any]:
    """Read the last page's number from the latest result, ask for the next; stop at 5."""
    outputs = [json.loads(i.text) for i in items if i.kind == "tool_output"]
    page = outputs[-1]["page"] + 1 if outputs else 0
    if page >= 5:
        return {"text": "read them all"}
    return {"tool_calls": [{"name": "fetch_page", "arguments": {"page": page}}]}


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_last_messages_sends_the_last_n_without_parting_a_call_from_its_result(setup, model, api):
    db_url, _ = setup
    # once the first message is out of the window the scripted model answers its default
    # script: the same turns
    model.add_script("window", [_next_page] * 20)
    model.add_script("default", [_next_page] * 20)
    options = {"truncation_strategy": {"type": "last_messages", "last_messages": 3}}
    run = start(db_url, model, "window", api, options=options)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    assert len(model.requests) == 6
    for request in model.requests[1:]:
        items = [i for i in request.history if i.kind != "system"]
        assert items[0].kind != "tool_output", items  # never a result without its call
        assert sum(i.kind == "tool_output" for i in items) == 1  # 3 messages: no more
    for request in model.requests[2:]:  # from the second result on, the user's message left
        assert not any(i.text.startswith("script:") for i in request.history)
    assert summary_requests(model) == []
    assert len([m for m in stored(db_url, run) if m["role"] == "tool"]) == 5


def test_the_budget_comes_from_the_run_its_tenant_the_platform_then_the_catalogue(db_url):
    assert context.budget({"max_prompt_tokens": 1000}, 2000, 3000, 32_768, 4096) == 1000
    assert context.budget({}, 2000, 3000, 32_768, 4096) == 2000
    assert context.budget(None, None, 3000, 32_768, 4096) == 3000
    assert context.budget(None, None, None, 32_768, 4096) == 32_768 - 4096
    default = context.DEFAULT_WINDOW - context.DEFAULT_MAX_OUTPUT
    assert context.budget(None, None, None, None, None) == default
    with psycopg.connect(db_url) as conn:
        context.set_prompt_budget(conn, 5000, tenant_id=TENANT)
        context.set_prompt_budget(conn, 7000)
        assert scalar_in(conn, "SELECT max_prompt_tokens FROM outbox.tenant_budgets") == 5000
        assert scalar_in(conn, "SELECT max_prompt_tokens FROM outbox.run_defaults") == 7000


def scalar_in(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    return row[0] if row else None


def test_a_compaction_killed_midway_is_recorded_once(setup, model, tmp_path):
    db_url, _ = setup
    run = start(db_url, model, "long", "responses")
    crashing = start_relay_process(
        db_url,
        tmp_path / "relay.log",
        *ALL,
        *FAST,
        env={"OUTBOX_FAILPOINT": "compaction.after_summary"},
    )
    assert crashing.wait(timeout=180) == CRASH_EXIT_CODE  # the summary answered, not recorded
    crashed_at = len(summary_requests(model))
    assert crashed_at >= 1
    assert scalar(db_url, "SELECT count(*) FROM outbox.compactions") == 0
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    steps = look(db_url, "SELECT step_no, count(*) FROM outbox.compactions GROUP BY step_no", None)
    assert steps and all(n == 1 for _, n in steps)
    assert len(summary_requests(model)) > crashed_at  # the killed one was asked again
    assert uuid.UUID(str(run.id))


def test_the_models_command_keeps_the_catalogue_its_prices_and_the_prompt_budgets(
    db_url, monkeypatch
):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def run_cli(*args: str) -> str:
        result = runner.invoke(cli.main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    run_cli(
        "models",
        "set",
        "big-1",
        "--context-window",
        "200000",
        "--max-output",
        "32000",
        "--input",
        "2",
        "--output",
        "8",
    )
    listed = json.loads(run_cli("models", "list", "--json"))
    assert [(m["model"], m["context_window"], m["max_output_tokens"]) for m in listed] == [
        ("big-1", 200000, 32000)
    ]
    assert scalar(db_url, "SELECT input_per_mtok FROM outbox.model_prices") == 2
    run_cli("models", "budget", "--tenant", TENANT, "--max-prompt-tokens", "9000")
    run_cli("models", "budget", "--max-prompt-tokens", "50000")
    assert scalar(db_url, "SELECT max_prompt_tokens FROM outbox.tenant_budgets") == 9000
    assert scalar(db_url, "SELECT max_prompt_tokens FROM outbox.run_defaults") == 50000
    run_cli("models", "budget", "--tenant", TENANT, "--max-prompt-tokens", "none")
    assert scalar(db_url, "SELECT count(*) FROM outbox.tenant_budgets") == 0
    bad = runner.invoke(
        cli.main, ["models", "set", "x", "--context-window", "10", "--max-output", "20"]
    )
    assert bad.exit_code != 0 and "under the window" in bad.output
    run_cli("models", "remove", "big-1")
    assert json.loads(run_cli("models", "list", "--json")) == []


def test_erasing_a_thread_deletes_its_summaries(db_url):
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(tenant_id=TENANT, thread_id=thread.id, model=MODEL, message="secret plan"),
        )
        conn.execute(
            "INSERT INTO outbox.compactions (tenant_id, thread_id, run_id, step_no, through_seq,"
            " summary, tokens_before, tokens_after) VALUES (%s, %s, %s, 2, 1, 'secret', 9, 3)",
            [TENANT, thread.id, run.id],
        )
        conn.commit()
        retention.erase_thread(conn, thread.id, TENANT, actor="test")
        conn.commit()
    assert scalar(db_url, "SELECT count(*) FROM outbox.compactions") == 0


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_models_own_count_of_the_last_turn_keeps_a_dense_tokenizer_inside(setup, model, api):
    """A model whose tokens are 3 characters: chars/4 alone would underestimate every
    request by a quarter and send requests past its window; its reported count of the
    previous turn keeps every request inside."""
    db_url, _ = setup
    model.set_faults(chars_per_token=3)
    run = start(db_url, model, "long", api)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    assert [r.status for r in model.requests if r.status != 200] == []
    assert max(r.input_tokens for r in model.requests) <= WINDOW


@pytest.mark.parametrize(
    ("options", "sees_summary"),
    [
        (None, True),
        ({"truncation": "auto"}, True),
        ({"truncation": "disabled"}, False),
        ({"truncation_strategy": {"type": "last_messages", "last_messages": 4}}, False),
    ],
    ids=["default", "auto", "disabled", "last_messages"],
)
def test_a_later_run_of_the_thread_reads_its_summary_only_when_it_compacts(
    setup, model, options, sees_summary
):
    """A thread an earlier run compacted: a run that compacts sees the summary and what
    follows it; a run whose truncation is disabled sees the whole thread, one with
    last_messages a plain window of the thread, neither the summary."""
    db_url, _ = setup
    first = start(db_url, model, "short", "chat")
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, first) == "completed"
    with psycopg.connect(db_url) as conn:
        (through,) = conn.execute(
            "SELECT max(seq) FROM outbox.messages WHERE thread_id = %s", [first.thread_id]
        ).fetchone() or (0,)
        conn.execute(
            "INSERT INTO outbox.compactions (tenant_id, thread_id, run_id, step_no, through_seq,"
            " summary, tokens_before, tokens_after) VALUES (%s, %s, %s, 9, %s, 'earlier', 9, 3)",
            [TENANT, first.thread_id, first.id, through],
        )
        second = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=first.thread_id,
                model=MODEL,
                message="and once more",
                base_url=model.url + "/v1",
                api="chat",
            ),
        )
        if options:
            conn.execute(
                "UPDATE outbox.runs SET model_options = model_options || %s WHERE id = %s",
                [Jsonb(options), second.id],
            )
        conn.commit()
    before = len(model.requests)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, second) == "completed"
    sent = model.requests[before].body["messages"]
    texts = [m.get("content") or "" for m in sent]
    summarised = [t for t in texts if t.startswith(context.SUMMARY_PREFIX)]
    assert bool(summarised) is sees_summary, texts
    assert texts[-1] == "and once more"
    if sees_summary:
        assert summarised == [context.SUMMARY_PREFIX + "earlier"] and len(sent) == 2
    elif options and "truncation_strategy" in options:
        assert len(sent) == 4 and not any(t.startswith("script:") for t in texts)
    else:
        assert texts[0].startswith("script:short") and len(sent) == 5  # the whole thread
