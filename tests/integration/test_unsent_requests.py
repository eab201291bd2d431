"""A request that certainly did not reach a ``none`` tool is retried, not parked: only an
attempt that may have reached the tool is ambiguous.

``docs/relay.md`` promises a retry in every mode for a refused connection and for 408, 429
and 503 (the tool says it did not process the request). The dispatch mark written before
such an attempt must not turn the next attempt into ``outcome_unknown``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox.testing.tools import FakeToolService
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
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
