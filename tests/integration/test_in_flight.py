"""What a tool declares of a request it is still acting on, and what that lets the relay do
after an ambiguous attempt (docs/relay.md, "What a tool declares").

A request the relay gave up on may still act at the tool. Without a declaration the next
attempt neither resends nor trusts a lookup's "not found" until that request can no longer
act (``test_relay.py``, ``test_chaos.py``). Here, tools that know their requests in flight
are asked again at once and answered without a second effect, long before that bound; and
the bound itself counts from when the relay gave up on a request, not only from when it
was marked, so a request sent late is given its full settle time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from outbox import registry, writer
from outbox.relay.outcomes import Claimed
from outbox.sql import Queries
from outbox.testing.tools import FakeToolService
from tests.helpers import new_run, turn
from tests.relay_harness import (
    REPO,
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    seed,
    tool_call_states,
    wait_until,
)

RELAY_Q = Queries(REPO / "relay" / "queries" / "relay.sql", "outbox")
WORKER = "relay:1:test"
# Long enough that a relay waiting for the earlier request to settle could not settle the
# call within the tests' wait: only asking again at once can.
SETTLE_S = 60.0
TIMEOUT_S = 0.3
ACTS_AFTER_S = TIMEOUT_S + 0.7  # the timed-out request acts (and records its key) then


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


@pytest.mark.parametrize("mode", ["key", "lookup"])
def test_a_tool_that_knows_its_requests_in_flight_is_asked_again_at_once(db_url, service, mode):
    """The relay gives up on a request after the timeout; the tool acts on it a while later.
    A key tool that refuses a key in use is resent at once and answers 409 until the first
    request is done, then that request's answer; a lookup answers "in progress", then
    "found". Either way one effect, and the call settles long before the settle bound."""
    tool = service.add_tool("tracked", mode, tracks_in_flight=True)
    tool.act_after(ACTS_AFTER_S)
    declared = {"refuses_key_in_use": True} if mode == "key" else {}
    with psycopg.connect(db_url) as conn:
        register_tool(
            conn, service, "tracked", mode, timeout_s=TIMEOUT_S, settle_s=SETTLE_S, **declared
        )
        conn.commit()
    seed(db_url, ["tracked"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), timeout_s=SETTLE_S / 2, what="the call settled")
    wait_until(lambda: tool.in_flight == 0, what="the timed-out request done at the tool")
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert len(tool.effects) == 1, tool.effects
    statuses = [d.status for d in tool.deliveries]
    if mode == "key":
        assert 409 in statuses  # resent while the first request acted: refused, not acted on
        assert tool.deliveries[-1].replayed  # then answered from the first request's record
    else:
        assert len(tool.starts) == 1  # never called again: the lookup found the effect
        assert tool.lookups >= 2  # "in progress" at once, "found" once it acted
        found = "SELECT source FROM outbox.tool_results"
        assert scalar(db_url, found) == "lookup"
    waited = "SELECT count(*) FROM outbox.journal WHERE detail->>'error' LIKE '%no resend%'"
    assert scalar(db_url, waited) == 0
    asked_again = (
        "SELECT count(*) FROM outbox.journal WHERE event = 'tool_call.retry_scheduled'"
        " AND detail->>'error' LIKE '%asked again shortly%'"
    )
    assert scalar(db_url, asked_again) >= 1


def test_a_409_of_a_key_tool_that_declared_nothing_is_an_error_the_model_sees(db_url, service):
    """Only a tool that declared it refuses a key in use has its 409 read as "still acting":
    for any other tool a 409 is the tool's answer, an error result, never a resend."""
    tool = service.add_tool("conflicted", "key")
    tool.fail(409, n=1)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "conflicted", "key")
        conn.commit()
    seed(db_url, ["conflicted"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call settled")
    assert tool_call_states(db_url) == {"failed": 1}
    assert len(tool.deliveries) == 1
    assert tool.effects == []


def test_only_a_key_tool_over_http_may_declare_it_refuses_a_key_in_use():
    for mode in ("lookup", "none"):
        with pytest.raises(ValueError, match="refuses_key_in_use"):
            registry.ToolSpec(
                name="t",
                endpoint="http://127.0.0.1:9/t",
                lookup_endpoint="http://127.0.0.1:9/l",
                idempotency_mode=mode,
                refuses_key_in_use=True,
            )
    with pytest.raises(ValueError, match="refuses_key_in_use"):
        registry.ToolSpec(
            name="t", executor="python", callable="os:getcwd", refuses_key_in_use=True
        )


def test_settle_time_defaults_to_the_tool_timeout():
    spec = registry.ToolSpec(name="t", endpoint="http://127.0.0.1:9/t", timeout_s=7.0)
    assert spec.settle_s == 7.0
    spec = registry.ToolSpec(name="t", endpoint="http://127.0.0.1:9/t", settle_s=0.0)
    assert spec.settle_s == 0.0


def a_marked_call(conn: psycopg.Connection[Any], service: FakeToolService) -> tuple[int, int]:
    """A call whose attempt 1 ``WORKER`` leased and marked as dispatched (the relay's own
    statements), its mark then set back an hour: as a request queued or stalled in its
    relay for that long before it left. Its queue row and call."""
    service.add_tool("keyed", "key")
    register_tool(conn, service, "keyed", "key", timeout_s=2.0, settle_s=5.0)
    run = new_run(conn, tools=["keyed"])
    writer.record_model_turn(conn, turn(run, 1, ("k1", "keyed", {"n": 1})))
    row = conn.execute(
        "UPDATE outbox.outbox SET status = 'leased', lease_owner = %s, attempts = 1,"
        " lease_expires_at = now() + interval '1 minute', claimed_at = now()"
        " WHERE kind = 'tool_call' RETURNING id, tool_call_ref",
        [WORKER],
    ).fetchone()
    assert row is not None
    outbox_id, ref = int(row[0]), int(row[1])
    marked = conn.execute(
        RELAY_Q.mark_dispatched,
        {"tool_call_ref": ref, "attempt": 1, "id": outbox_id, "worker": WORKER},
    ).fetchone()
    assert marked is not None
    conn.execute(
        "UPDATE outbox.tool_calls SET dispatched_at = now() - interval '1 hour' WHERE id = %s",
        [ref],
    )
    return outbox_id, ref


def gave_up_and_claimed_again(
    conn: psycopg.Connection[Any], outbox_id: int, ref: int, **status: bool
) -> Claimed:
    """The relay's write of attempt 1's outcome (``call_status``), its row put back, and the
    claim of attempt 2."""
    conn.execute(
        RELAY_Q.call_status,
        {"status": "pending", "attempt": 1, "error": "no answer", "tool_call_ref": ref}
        | {"unsent": False, "answered": False}
        | status,
    )
    conn.execute(
        "UPDATE outbox.outbox SET status = 'ready', lease_owner = NULL,"
        " lease_expires_at = NULL, available_at = now() WHERE id = %s",
        [outbox_id],
    )
    claimed = conn.execute(
        RELAY_Q.claim,
        {"kinds": ["tool_call"], "limit": 10, "worker": "relay:2:test", "lease_s": 30}
        | {"tenant_cap": 1000, "held": Jsonb({})},
    ).fetchall()
    assert len(claimed) == 1
    return Claimed(*claimed[0])


def test_a_request_sent_late_is_given_its_settle_time_from_when_its_relay_gave_up(db_url, service):
    """Attempt 1 was marked an hour ago but its relay gave up on it only now: its request
    may have left late and may act at the tool for settle_s more. By the mark alone it
    would have been over for an hour, and the next attempt would resend at once."""
    with psycopg.connect(db_url) as conn:
        outbox_id, ref = a_marked_call(conn, service)
        row = gave_up_and_claimed_again(conn, outbox_id, ref)
    assert row.dispatched_attempt == 1 and row.attempt == 2
    assert row.settle_wait_s is not None and 4.0 < row.settle_wait_s <= 5.0


def test_a_request_the_tool_answered_leaves_nothing_to_wait_for(db_url, service):
    """A 5xx of the tool itself: the request is over there, whenever the relay gave up."""
    with psycopg.connect(db_url) as conn:
        outbox_id, ref = a_marked_call(conn, service)
        row = gave_up_and_claimed_again(conn, outbox_id, ref, answered=True)
    assert row.dispatched_attempt == 1 and row.settle_wait_s is None
