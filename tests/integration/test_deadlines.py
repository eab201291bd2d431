"""A run's deadline and the calls it ends, told truthfully.

A call that may have reached its tool is never answered "not executed": a run past its
`requires_action` deadline waits for the calls a relay is executing, and their results
enter the history; a cancel that cannot wait answers "outcome unknown". The deadline is
decided by the database clock at submission, with no sweep needed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import history, lifecycle, registry, writer
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.testing.tools import FakeToolService
from tests.helpers import TENANT, new_run, turn
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

KEYED = ("k1", "keyed", {"order_id": "42"})
APPROVE = ("c1", "approve", {"amount": 10})


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        svc.add_tool("keyed", "key")
        yield svc


@pytest.fixture
def tools(db_url: str, service: FakeToolService) -> FakeToolService:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key", timeout_s=30.0)
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        conn.commit()
    return service


def start_batch(db_url: str, *calls: tuple[str, str, Any], **run: Any) -> writer.RunRef:
    """A run whose first model turn asked for ``calls`` (committed)."""
    with psycopg.connect(db_url) as conn:
        ref = new_run(conn, tools=sorted({c[1] for c in calls}), **run)
        writer.record_model_turn(conn, turn(ref, 1, *calls))
        conn.commit()
    return ref


def tool_messages(db_url: str, thread_id: uuid.UUID) -> dict[str, Any]:
    """The thread's tool messages as the model gets them: call id -> parsed content."""
    with psycopg.connect(db_url) as conn:
        messages, _ = history.replay(conn, thread_id, TENANT, api="chat")
    return {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}


def run_status(db_url: str, run_id: uuid.UUID) -> str:
    return scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id])


def relay_ready(db_url: str) -> bool:
    """A relay's claim loop is connected: a run started now is claimed at once."""
    return bool(
        scalar(
            db_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'outbox-relay-claim'",
        )
    )


def test_expiry_waits_for_a_call_in_flight_and_the_model_gets_its_result(db_url, tools):
    # The tool performs its effect at once and holds its answer past the run's deadline.
    tools.tool("keyed").stall_after_commit(3.0, n=1)
    with relay_thread(db_url):
        wait_until(lambda: relay_ready(db_url), what="the relay to be up")
        run = start_batch(db_url, APPROVE, KEYED, action_timeout_s=1.0)
        wait_until(lambda: tools.tool("keyed").deliveries, what="the tool to get the call")
        wait_until(lambda: run_status(db_url, run.id) == "expired", what="the expiry")
    answers = tool_messages(db_url, run.thread_id)
    assert answers["k1"] == tools.tool("keyed").effects[0].result  # what really happened
    assert "not executed" not in answers["c1"]["error"]  # the client may have run it
    assert "no output" in answers["c1"]["error"]
    assert scalar(db_url, "SELECT count(*) FROM outbox.orphaned_results") == 0
    assert len(tools.tool("keyed").deliveries) == 1


def test_a_cancelled_call_in_flight_is_answered_outcome_unknown(db_url, tools):
    tools.tool("keyed").stall_after_commit(2.0, n=1)
    run = start_batch(db_url, KEYED, ("k2", "keyed", {"order_id": "43"}))
    with psycopg.connect(db_url) as conn:  # k2 is never claimed: it really was not executed
        conn.execute(
            "UPDATE outbox.outbox SET status = 'quarantined' WHERE tool_call_ref = "
            "(SELECT id FROM outbox.tool_calls WHERE tool_call_id = 'k2')"
        )
        conn.commit()
    with relay_thread(db_url):
        wait_until(lambda: tools.tool("keyed").deliveries, what="the tool to get the call")
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, run.id, TENANT, actor="test")
            conn.commit()
        wait_until(lambda: scalar(db_url, "SELECT count(*) FROM outbox.orphaned_results"))
    answers = tool_messages(db_url, run.thread_id)
    assert answers["k1"]["error"].startswith("outcome unknown: ")
    assert answers["k2"]["error"].startswith("not executed: ")


def test_a_retry_due_after_the_deadline_is_never_started_before_any_sweep(db_url, tools):
    """The claim decides, not the sweep. The call's first attempt failed
    and its retry came due after the run's deadline; the relay's first sweep is far away
    (lease 60 s: its maintenance ticks every 20 s, its rescue interval is an hour)."""
    run = start_batch(db_url, APPROVE, KEYED, action_timeout_s=0.2)
    with psycopg.connect(db_url) as conn:  # what retry_later leaves after a 503
        ref = conn.execute(
            "UPDATE outbox.tool_calls SET attempts = 1, last_error = 'HTTP 503' "
            "WHERE tool_call_id = 'k1' RETURNING id"
        ).fetchone()[0]
        conn.execute(
            "UPDATE outbox.outbox SET attempts = 1, failures = 1, last_error = 'HTTP 503' "
            "WHERE tool_call_ref = %s",
            [ref],
        )
        conn.commit()
    wait_until(
        lambda: scalar(
            db_url, "SELECT action_deadline < now() FROM outbox.runs WHERE id = %s", [run.id]
        ),
        what="the database clock to pass the deadline",
    )
    queued = "SELECT count(*) FROM outbox.outbox WHERE tool_call_ref = %s"
    with relay_thread(db_url, lease_s=60.0, rescue_interval_s=3600.0):
        wait_until(
            lambda: scalar(db_url, queued, [ref]) == 0 or tools.tool("keyed").deliveries,
            what="the relay to claim or drop the retry",
        )
    assert tools.tool("keyed").deliveries == []
    assert run_status(db_url, run.id) == "requires_action"  # no sweep expired it
    with psycopg.connect(db_url) as conn:
        dropped = conn.execute(
            "SELECT attempt, detail FROM outbox.journal WHERE event = 'tool_call.dropped'"
        ).fetchall()
        assert dropped == [(1, {"reason": "run_over", "instead_of": "claim"})]
        assert conn.execute(
            "SELECT status, attempts FROM outbox.tool_calls WHERE id = %s", [ref]
        ).fetchone() == ("cancelled", 1)
        assert [r["status"] for r in lifecycle.expire_due_runs(conn)] == ["expired"]
        conn.commit()
    # the attempt that failed may have acted: the model is told so, not "not executed"
    assert tool_messages(db_url, run.thread_id)["k1"]["error"].startswith("outcome unknown: ")


@pytest.mark.parametrize("path", ["writer", "sql"])
def test_outputs_after_the_deadline_are_refused_without_a_sweep(db_url, path):
    with psycopg.connect(db_url) as conn:
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        conn.commit()
    run = start_batch(db_url, APPROVE, action_timeout_s=0.2)
    wait_until(
        lambda: scalar(
            db_url, "SELECT action_deadline < now() FROM outbox.runs WHERE id = %s", [run.id]
        ),
        what="the database clock to pass the deadline",
    )
    outputs = [{"tool_call_id": "c1", "output": {"approved": True}}]
    with psycopg.connect(db_url) as conn:
        if path == "writer":
            status = lifecycle.submit_tool_outputs(conn, TENANT, run.id, outputs)
        else:
            conn.execute("SELECT outbox.enter_tenant_v1(%s)", [TENANT])
            status = conn.execute(
                "SELECT outbox.submit_tool_outputs_v1(%s, %s, %s::jsonb)",
                [TENANT, run.id, json.dumps(outputs)],
            ).fetchone()[0]
        conn.commit()
    assert status == "expired"
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 0
    assert scalar(db_url, "SELECT reason FROM outbox.orphaned_results") == "deadline_passed"
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'deliver_batch'") == 0


def test_one_claim_judges_each_call_by_its_own_run(db_url, tools):
    """A claim over the calls of several runs reads each run once for all of its rows: the
    call of the run past its deadline is dropped, those of the live runs are taken, each
    with its own run's start (what its span hangs under)."""
    over = start_batch(db_url, APPROVE, KEYED, action_timeout_s=0.2)
    live = [start_batch(db_url, APPROVE, KEYED) for _ in range(2)]
    wait_until(
        lambda: scalar(
            db_url, "SELECT action_deadline < now() FROM outbox.runs WHERE id = %s", [over.id]
        ),
        what="the database clock to pass the first run's deadline",
    )
    worker = Worker(RelayConfig(database_url=db_url))
    link = worker.claim_link()
    try:
        rows = worker._claim(link, 10, ["tool_call"])
    finally:
        link.close()
    with psycopg.connect(db_url) as conn:
        started = dict(
            conn.execute("SELECT id, extract(epoch FROM created_at)::float8 FROM outbox.runs")
        )
        dropped = conn.execute(
            "SELECT run_id FROM outbox.journal WHERE event = 'tool_call.dropped'"
        ).fetchall()
    assert sorted(str(r.run_id) for r in rows) == sorted(str(r.id) for r in live)
    assert {r.run_id: r.run_started_at for r in rows} == {r.id: started[r.id] for r in live}
    assert dropped == [(over.id,)]
