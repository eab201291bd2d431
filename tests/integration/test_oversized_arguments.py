"""Arguments over the size cap are the model's mistake, not the run's end: the call gets an
error result the model sees, as a schema violation does, and the run goes on. Nothing over
the cap is stored."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from outbox import config, history, writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import TENANT, add_tool, new_run, turn
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

HUGE = {"order_id": "x" * (config.MAX_PAYLOAD_BYTES + 1)}


def test_the_writer_answers_oversized_arguments_with_an_error_result(conn, db_url):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    record = writer.record_model_turn(
        conn,
        turn(run, 1, ("c1", "lookup_order", HUGE), ("c2", "lookup_order", {"order_id": "7"})),
    )
    conn.commit()
    assert record.created and record.run_status == "in_progress"
    error = scalar(db_url, "SELECT error FROM outbox.tool_results")
    assert "over the cap" in error and str(config.MAX_PAYLOAD_BYTES) in error
    stored = scalar(db_url, "SELECT max(octet_length(arguments_raw)) FROM outbox.tool_calls")
    assert stored < 100  # the oversized text was not kept
    # Only the valid call is queued; the oversized one is never executed.
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'") == 1


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        yield server


def test_a_run_whose_model_sends_oversized_arguments_goes_on(db_url, model):
    seen: list[str] = []

    def after(items: list[HistoryItem]) -> dict[str, str]:
        seen.extend(i.text for i in items if i.kind == "tool_output")
        return {"text": "I will send less"}

    model.add_script("big", [{"tool_calls": [{"name": "noop", "arguments": HUGE}]}, after])
    with FakeToolService() as service, psycopg.connect(db_url) as conn:
        register_tool(conn, service, "noop", "key")
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted",
                message="script:big go",
                tools=["noop"],
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
        with relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")):
            wait_until(
                lambda: scalar(db_url, "SELECT status FROM outbox.runs") in ("completed", "failed"),
                what="the run to end",
            )
        assert service.tool("noop").deliveries == []
    assert scalar(db_url, "SELECT status FROM outbox.runs") == "completed"
    assert len(seen) == 1 and "over the cap" in json.loads(seen[0])["error"]
    with psycopg.connect(db_url) as conn:
        history.replay(conn, run.thread_id, TENANT)  # the thread stays replayable
