"""A call of a run that is over never starts again, with real processes.

A relay executing a call is killed with ``kill -9`` while its run expires or is cancelled;
another relay rescues the expired lease. The call must not reach the tool a second time,
and a ``none`` call must not be parked for an operator: the run is over, and its tool
message says the outcome is unknown.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox import history, lifecycle, registry, writer
from outbox.testing.tools import FakeToolService
from tests.forked import Forked
from tests.helpers import TENANT, new_run, turn
from tests.relay_harness import (
    FAST,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        yield svc


def relay_ready(db_url: str) -> bool:
    """A relay's claim loop is connected: a run started now is claimed at once."""
    return bool(
        scalar(
            db_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'outbox-relay-claim'",
        )
    )


def stop(process: Forked) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


@pytest.mark.parametrize(("mode", "end"), [("key", "expire"), ("none", "cancel")])
def test_the_call_of_a_killed_relay_is_not_run_again_once_its_run_is_over(
    db_url: str, service: FakeToolService, tmp_path: Path, mode: str, end: str
) -> None:
    tool = service.add_tool("slow", mode)
    tool.stall_after_commit(60.0, n=1)  # the effect happens; the answer never comes back
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", mode, timeout_s=120.0)
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        conn.commit()
    log = tmp_path / "relays.log"
    first = start_relay_process(db_url, log, *FAST)
    try:
        # The run starts once the relay is up, so its call is claimed before its deadline
        # (1 s; the killed relay's lease, 2 s, outlives it), or never ends by itself (cancel).
        wait_until(lambda: relay_ready(db_url), what="the first relay to be up")
        with psycopg.connect(db_url) as conn:
            run = new_run(
                conn, tools=["approve", "slow"], action_timeout_s=1.0 if end == "expire" else 600
            )
            writer.record_model_turn(
                conn, turn(run, 1, ("c1", "approve", {}), ("s1", "slow", {"n": 1}))
            )
            conn.commit()
        wait_until(lambda: tool.deliveries, what="the tool to get the call")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        stop(first)
    if end == "cancel":
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, run.id, TENANT, actor="test")
            conn.commit()
    # The relay that takes over runs in a thread: only the killed one must be a process.
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url,
                "SELECT count(*) FROM outbox.journal WHERE event LIKE 'lease.expired.%%'",
            ),
            what="the second relay to take back the expired lease",
        )
        wait_until(
            lambda: (
                scalar(db_url, "SELECT status FROM outbox.runs") in ("expired", "cancelled")
                and not scalar(
                    db_url,
                    "SELECT count(*) FROM outbox.outbox WHERE status IN ('ready', 'leased')",
                )
            ),
            what="the run to be over and nothing left to run",
        )
    assert len(tool.deliveries) == 1  # never a second attempt at the tool
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox") == 0  # nothing for an operator
    assert scalar(db_url, "SELECT status FROM outbox.tool_calls WHERE tool_name = 'slow'") != (
        "outcome_unknown"
    )
    with psycopg.connect(db_url) as conn:
        messages, _ = history.replay(conn, run.thread_id, TENANT, api="chat")
    answers = {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    assert answers["s1"]["error"].startswith("outcome unknown: ")
