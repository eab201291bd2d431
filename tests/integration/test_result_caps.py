"""Tool results past their tool's cap reach the model as a head and a handle, and the
built-in read_result tool pages the stored result: a relay against the scripted model and
a fake tool over HTTP, a real PostgreSQL.

The model is scripted to do what the note at the end of a cut result says: call
read_result with the handle and offset it gives. The stored thread keeps every result
whole whatever the model was sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import context, history, registry, writer
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
KINDS = ("model_turn", "tool_call", "deliver_batch")
ALL = ["--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch"]
CAP = 4096
BIG = "".join(f"line {i:05d} of the report\n" for i in range(1600))  # about 40 KB
NOTE = re.compile(r"call read_result with (\{.*?\})\.\]$")


def _report(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"report": BIG}


def _read_on(items: list[HistoryItem]) -> dict[str, Any]:
    """Do what the note at the end of the cut result says, once; then answer."""
    if any(i.kind == "tool_call" and i.name == context.READ_RESULT for i in items):
        return {"text": "read"}
    cut = next(i.text for i in items if i.kind == "tool_output")
    found = NOTE.search(cut)
    assert found, cut[-300:]
    return {"tool_calls": [{"name": context.READ_RESULT, "arguments": json.loads(found[1])}]}


def _foreign(items: list[HistoryItem]) -> dict[str, Any]:
    """Ask for the handle the user's message names (another conversation's result)."""
    if any(i.kind == "tool_output" for i in items):
        return {"text": "tried"}
    handle = next(i.text for i in items if i.kind == "user").split()[1]
    return {
        "tool_calls": [{"name": context.READ_RESULT, "arguments": {"handle": handle, "offset": 0}}]
    }


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    fetch = {"tool_calls": [{"name": "fetch_report", "arguments": {}}]}
    with ScriptedModel() as server:
        server.add_script("report", [fetch, _read_on, _read_on])
        server.add_script("foreign", [_foreign, _foreign])
        yield server


@pytest.fixture
def setup(db_url: str) -> Iterator[str]:
    with FakeToolService() as service:
        service.add_tool("fetch_report", "key", _report)
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "fetch_report", "key", model_result_cap=CAP)
            conn.commit()
        yield db_url


def start(db_url: str, model: ScriptedModel, message: str, api: str, tenant: str = TENANT):
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, tenant)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=tenant,
                thread_id=thread.id,
                model="scripted-1",
                message=message,
                tools=["fetch_report"],
                base_url=model.url + "/v1",
                api=api,
            ),
        )
        conn.commit()
    return run


def finish(db_url: str, run: writer.RunRef) -> str:
    query = "SELECT status FROM outbox.runs WHERE id = %s"
    return str(
        wait_until(
            lambda: (s := scalar(db_url, query, [run.id])) in ("completed", "failed") and s,
            timeout_s=60,
            what="the run to end",
        )
    )


def outputs(request: Any) -> list[str]:
    return [i.text for i in request.history if i.kind == "tool_output"]


def tool_names(request: Any) -> list[str]:
    return [t.get("name") or t["function"]["name"] for t in request.tools]


def stored_result_id(db_url: str, run: writer.RunRef) -> int:
    return int(
        scalar(
            db_url,
            "SELECT m.id FROM outbox.messages m JOIN outbox.tool_calls c ON c.id = m.tool_call_ref "
            "WHERE c.run_id = %s AND c.tool_name = 'fetch_report'",
            [run.id],
        )
    )


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_result_past_its_cap_reaches_the_model_as_a_head_and_a_handle(setup, model, api):
    db_url = setup
    run = start(db_url, model, "script:report read it", api)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    first, after_fetch, after_read = model.requests
    assert context.READ_RESULT not in tool_names(first)  # nothing cut yet: not offered
    whole = json.dumps({"report": BIG})
    (cut,) = outputs(after_fetch)
    handle = context.handle(stored_result_id(db_url, run))
    assert len(cut.encode()) < CAP + 300 and whole.startswith(cut[:CAP])
    assert handle in cut and f"This result is {len(whole.encode())} bytes" in cut
    assert BIG[-200:] not in json.dumps(after_fetch.body)  # the 40 KB were not sent
    assert context.READ_RESULT in tool_names(after_fetch)
    # read_result answered the next page, from where the head ended
    cut_again, page_text = outputs(after_read)
    assert cut_again == cut  # the same bytes every turn: the prompt cache's prefix holds
    page = json.loads(page_text)
    assert page["handle"] == handle and page["offset"] == CAP and page["total_bytes"] == len(whole)
    assert page["text"] == whole[CAP : CAP + CAP] and page["next_offset"] == 2 * CAP
    # the stored thread and its export keep the whole result
    with psycopg.connect(db_url) as conn:
        messages = history.stored_messages(conn, run.thread_id)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert results[0] == whole and json.loads(results[1])["text"] == page["text"]
    # recorded like any call: one call, one result, journaled
    calls = look(
        db_url,
        "SELECT executor, status, tool_version FROM outbox.tool_calls "
        "WHERE run_id = %s AND tool_name = 'read_result'",
        [run.id],
    )
    assert calls == [("builtin", "succeeded", None)]
    events = scalar(
        db_url,
        "SELECT count(*) FROM outbox.journal j JOIN outbox.tool_calls c ON c.id = j.tool_call_ref "
        "WHERE c.tool_name = 'read_result' AND j.event = 'tool_result.stored'",
    )
    assert events == 1


@pytest.mark.parametrize("tenant", [TENANT, "globex"], ids=["other_thread", "other_tenant"])
def test_a_handle_of_another_conversation_reads_nothing(setup, model, tenant):
    db_url = setup
    owner = start(db_url, model, "script:report read it", "chat")
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, owner) == "completed"
    handle = context.handle(stored_result_id(db_url, owner))
    thief = start(db_url, model, f"script:foreign {handle}", "chat", tenant=tenant)
    before = len(model.requests)
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, thief) == "completed"
    (answer,) = outputs(model.requests[-1])
    assert len(model.requests) == before + 2
    assert "is not the handle of a result of this conversation" in answer
    assert "line 0" not in answer
    assert look(
        db_url,
        "SELECT status FROM outbox.tool_calls WHERE run_id = %s",
        [thief.id],
    ) == [("failed",)]


def test_a_read_result_killed_after_its_read_is_recorded_once(setup, model, tmp_path):
    db_url = setup
    run = start(db_url, model, "script:report read it", "responses")
    crashing = start_relay_process(
        db_url,
        tmp_path / "relay.log",
        *ALL,
        *FAST,
        env={"OUTBOX_FAILPOINT": "read_result.after_read"},
    )
    assert crashing.wait(timeout=60) == CRASH_EXIT_CODE  # the page read, not recorded
    assert (
        scalar(
            db_url,
            "SELECT count(*) FROM outbox.tool_results r JOIN outbox.tool_calls c "
            "ON c.id = r.tool_call_ref WHERE c.tool_name = 'read_result'",
        )
        == 0
    )
    with relay_thread(db_url, kinds=KINDS):
        assert finish(db_url, run) == "completed"
    assert look(
        db_url,
        "SELECT count(*), count(r.tool_call_ref) FROM outbox.tool_calls c "
        "LEFT JOIN outbox.tool_results r ON r.tool_call_ref = c.id "
        "WHERE c.run_id = %s AND c.tool_name = 'read_result'",
        [run.id],
    ) == [(1, 1)]
    assert len([r for r in model.requests if r.status == 200]) == 3


def test_a_cap_of_none_sends_the_whole_result_and_offers_no_read_result(db_url, model):
    with FakeToolService() as service:
        service.add_tool("fetch_report", "key", _report)
        runner = CliRunner()
        registered = runner.invoke(
            cli.main,
            [
                "tools",
                "register",
                "fetch_report",
                "--endpoint",
                service.endpoint("fetch_report"),
                "--model-result-cap",
                "none",
                "--json",
            ],
            env={"OUTBOX_DATABASE_URL": db_url},
        )
        assert registered.exit_code == 0, registered.output
        assert json.loads(registered.output)["model_result_cap"] == 0
        bad = runner.invoke(
            cli.main,
            ["tools", "register", "x", "--endpoint", "http://t/x", "--model-result-cap", "big"],
            env={"OUTBOX_DATABASE_URL": db_url},
        )
        assert bad.exit_code == 2 and "--model-result-cap" in bad.output
        listed = runner.invoke(cli.main, ["tools", "list"], env={"OUTBOX_DATABASE_URL": db_url})
        header, *lines = listed.output.splitlines()
        assert header.split()[-1] == "model_result_cap"
        [line] = [line for line in lines if "fetch_report" in line]
        assert line.split()[-1] == "none"
        model.add_script(
            "once", [{"tool_calls": [{"name": "fetch_report", "arguments": {}}]}, {"text": "ok"}]
        )
        run = start(db_url, model, "script:once read it", "chat")
        with relay_thread(db_url, kinds=KINDS):
            assert finish(db_url, run) == "completed"
    last = model.requests[-1]
    assert outputs(last) == [json.dumps({"report": BIG})]
    assert context.READ_RESULT not in tool_names(last)


def test_a_registry_tool_spec_refuses_a_negative_cap():
    with pytest.raises(ValueError, match="model_result_cap"):
        registry.ToolSpec(name="t", endpoint="http://t/x", model_result_cap=-1)
