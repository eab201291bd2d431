"""A relay killed (as by ``kill -9``) in the middle of a fallback: its primary model down,
its turn answered by the fallback and not yet recorded, or recorded and not committed. The
relay that takes over records each step once, on the fallback, and the run completes."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from outbox import routing, writer
from outbox.failpoints import CRASH_EXIT_CODE
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import (
    FAST,
    look,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

ALL = ["--kind", "model_turn", "--kind", "tool_call", "--kind", "deliver_batch"]
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
SCRIPT = [{"tool_calls": [TICKET]}, {"tool_calls": [TICKET]}, {"text": "done"}]


@pytest.fixture
def servers() -> Iterator[tuple[ScriptedModel, ScriptedModel, FakeToolService]]:
    with ScriptedModel() as primary, ScriptedModel() as backup, FakeToolService() as tools:
        primary.add_script("three", SCRIPT)
        backup.add_script("three", SCRIPT)
        yield primary, backup, tools


@pytest.mark.parametrize("point", ["model.after_call", "complete.before_commit"])
def test_a_relay_killed_mid_fallback_records_each_step_once(db_url, servers, tmp_path, point):
    primary, backup, tools = servers
    primary.down(503)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, tools, "create_ticket", "lookup")
        routing.set_fallback(
            conn, "m", "m-backup", to_base_url=backup.url + "/v1", to_api="chat", after_attempts=1
        )
        thread = writer.create_thread(conn, "acme")
        writer.start_run(
            conn,
            StartRun(
                tenant_id="acme",
                thread_id=thread.id,
                model="m",
                message="script:three",
                tools=["create_ticket"],
                base_url=primary.url + "/v1",
            ),
        )
        conn.commit()
    marker = tmp_path / "armed"
    crashing = start_relay_process(
        db_url,
        tmp_path / "relay.log",
        *ALL,
        *FAST,
        env={"OUTBOX_FAILPOINT": point, "OUTBOX_FAILPOINT_WHEN": str(marker)},
    )
    # Armed once the fallback has answered a turn: the crash comes mid-fallback.
    wait_until(lambda: any(r.status == 200 for r in backup.requests), timeout_s=60)
    marker.touch()
    assert crashing.wait(timeout=60) == CRASH_EXIT_CODE
    with relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")):
        wait_until(
            lambda: scalar(db_url, "SELECT status FROM outbox.runs") == "completed",
            timeout_s=60,
            what=f"the run to complete after a crash at {point}",
        )
    rows = look(db_url, "SELECT step_no, model FROM outbox.model_turns ORDER BY step_no")
    assert [tuple(r) for r in rows] == [(1, "m-backup"), (2, "m-backup"), (3, "m-backup")]
    assert len(tools.tool("create_ticket").effects) == 2
    assert all(r.status == 503 for r in primary.requests)
