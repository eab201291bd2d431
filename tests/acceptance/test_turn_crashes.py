"""A turn killed at every boundary between its transactions still completes, exactly once,
and its thread always replays against the scripted model without a pairing error.

The crashing relay is a real process (it dies as a SIGKILL would leave it: leases held, no
shutdown); the healthy relay that takes over runs in a thread of the test (``relay_thread``),
the same claim loop, rescue and completers without the cost of starting a process."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import psycopg
import pytest

from outbox import history, writer
from outbox.failpoints import CRASH_EXIT_CODE, POINTS
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import (
    FAST,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

ALL = ["--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch"]
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "sorry"}}


@pytest.fixture
def servers() -> Iterator[tuple[ScriptedModel, FakeToolService]]:
    with ScriptedModel() as model, FakeToolService() as tools:
        model.add_script(
            "three", [{"tool_calls": [TICKET, EMAIL]}, {"tool_calls": [EMAIL]}, {"text": "done"}]
        )
        yield model, tools


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_turn_survives_a_crash_at_every_boundary(db_url, servers, tmp_path, point, api):
    model, tools = servers
    with psycopg.connect(db_url) as conn:
        register_tool(conn, tools, "create_ticket", "lookup")
        register_tool(conn, tools, "send_email", "key")
        thread = writer.create_thread(conn, "acme")
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id="acme",
                thread_id=thread.id,
                model="m",
                message="script:three",
                tools=["create_ticket", "send_email"],
                base_url=model.url + "/v1",
                api=api,
            ),
        )
        conn.commit()
    log = tmp_path / "relay.log"
    crashing = start_relay_process(db_url, log, *ALL, *FAST, env={"OUTBOX_FAILPOINT": point})
    assert crashing.wait(timeout=60) == CRASH_EXIT_CODE
    with relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")):
        wait_until(
            lambda: scalar(db_url, "SELECT status FROM outbox.runs") == "completed",
            timeout_s=60,
            what=f"the run to complete after a crash at {point}",
        )
    assert scalar(db_url, "SELECT count(*) FROM outbox.model_turns") == 3
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 2
    assert tools.tool("send_email").duplicate_effects() == 0
    assert len(tools.tool("create_ticket").effects) == 1
    assert all(r.status == 200 for r in model.requests), [r.status for r in model.requests]
    client = openai.OpenAI(base_url=model.url + "/v1", api_key="x", max_retries=0)
    with psycopg.connect(db_url) as conn:
        items, _ = history.replay(conn, thread.id, "acme", api="responses")
        messages, _ = history.replay(conn, thread.id, "acme", api="chat")
    client.responses.create(model="m", input=items)
    client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    client.close()
    assert run.created
