"""A request that certainly did not reach a ``none`` tool is retried, not parked: only an
attempt that may have reached the tool is ambiguous.

``docs/relay.md`` promises a retry in every mode for a refused connection and for 408, 429
and 503 (the tool says it did not process the request). The dispatch mark written before
such an attempt must not turn the next attempt into ``outcome_unknown``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import (
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    seed,
    tool_call_states,
    wait_until,
)


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        svc.add_tool("blind", "none")
        yield svc


def args(n: int) -> dict[str, Any]:
    return {"n": n}


@pytest.mark.parametrize("status", [503, 429, 408])
def test_a_none_tool_that_did_not_process_the_request_is_called_again(db_url, service, status):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "blind", "none")
        conn.commit()
    service.tool("blind").fail(status, n=1)
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to settle")
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert [d.status for d in service.tool("blind").deliveries] == [status, 200]
    assert len(service.tool("blind").effects) == 1


def closed_port() -> int:
    """A local port nothing listens on (connections to it are refused)."""
    return free_port()


def test_a_none_tool_that_refused_the_connection_is_retried_until_out_of_attempts(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(
            conn,
            service,
            "blind",
            "none",
            endpoint=f"http://127.0.0.1:{closed_port()}/tools/blind",
            max_attempts=3,
        )
        conn.commit()
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            ),
            what="the call to run out of attempts",
        )
    # Three real attempts, none ambiguous: parked for running out, not for an unknown outcome.
    assert tool_call_states(db_url) == {"quarantined": 1}
    row = "FROM outbox.outbox WHERE kind = 'tool_call'"
    assert scalar(db_url, f"SELECT attempts {row}") == 3
    assert "could not reach" in scalar(db_url, f"SELECT last_error {row}")
    assert scalar(db_url, "SELECT dispatched_attempt FROM outbox.tool_calls") is None


# -- a call with a deadline: unsent attempts uncharged, bounded by the deadline ------------


def attempts_made(db_url: str) -> int:
    return int(scalar(db_url, "SELECT attempts FROM outbox.tool_calls") or 0)


def test_a_tool_down_past_the_calls_deadline_ends_it_not_executed_at_the_deadline(db_url, service):
    """max_attempts 1, yet the refused attempts are retried (uncharged) until the deadline;
    then the call ends, never sent, with an error result the model sees: not parked, not
    ambiguous, and never after the deadline (by the database's clock)."""
    with psycopg.connect(db_url) as conn:
        register_tool(
            conn,
            service,
            "blind",
            "none",
            endpoint=f"http://127.0.0.1:{closed_port()}/tools/blind",
            max_attempts=1,
            deadline_s=2.0,
        )
        conn.commit()
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to end at its deadline")
    assert tool_call_states(db_url) == {"failed": 1}
    assert attempts_made(db_url) >= 2  # uncharged: max_attempts 1 would have parked the first
    error = scalar(db_url, "SELECT error FROM outbox.tool_results")
    assert error.startswith("not executed: the call's deadline passed"), error
    assert scalar(db_url, "SELECT dispatched_attempt FROM outbox.tool_calls") is None
    assert scalar(
        db_url,
        "SELECT r.created_at >= c.created_at + interval '2 seconds' "
        "FROM outbox.tool_results r JOIN outbox.tool_calls c ON c.id = r.tool_call_ref",
    )
    retried = scalar(
        db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'tool_call.retry_scheduled'"
    )
    assert retried >= attempts_made(db_url) - 1 >= 1  # each refused attempt put back
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'") == 0


def test_a_tool_back_before_the_calls_deadline_gets_the_call_once(db_url):
    """Refused until the tool starts, uncharged (max_attempts 1), then sent once."""
    port = closed_port()
    with psycopg.connect(db_url) as conn, FakeToolService(standard_tools=False) as elsewhere:
        register_tool(
            conn,
            elsewhere,
            "blind",
            "none",
            endpoint=f"http://127.0.0.1:{port}/tools/blind",
            max_attempts=1,
            deadline_s=120.0,
        )
        conn.commit()
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: attempts_made(db_url) >= 3, what="refused attempts, uncharged")
        back = FakeToolService(standard_tools=False, port=port)
        back.add_tool("blind", "none")  # before it listens: a call then would be a 404
        with back:
            wait_until(lambda: all_settled(db_url), what="the call to be made")
            assert tool_call_states(db_url) == {"succeeded": 1}
            assert len(back.tool("blind").effects) == 1
            assert [d.status for d in back.tool("blind").deliveries] == [200]
