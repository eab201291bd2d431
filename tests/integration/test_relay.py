"""The relay on a real PostgreSQL and real HTTP tools (docs/guarantees.md, invariants 2-6, 9)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import config as outbox_config
from outbox import registry, writer
from outbox.testing.server import FakeServer, Reply, Request
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
    with FakeToolService() as svc:
        svc.add_tool("keyed", "key")
        svc.add_tool("looked_up", "lookup")
        svc.add_tool("blind", "none")
        yield svc


@pytest.fixture
def tools(db_url: str, service: FakeToolService) -> FakeToolService:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key")
        register_tool(conn, service, "looked_up", "lookup")
        register_tool(conn, service, "blind", "none")
        register_tool(conn, service, "quick_timeout", "key", timeout_s=0.3, max_attempts=3)
        conn.commit()
    service.add_tool("quick_timeout", "key")
    return service


def args(n: int) -> dict[str, Any]:
    return {"n": n}


def test_drains_every_intent_once_and_delivers_each_batch_once(db_url, tools):
    refs = seed(db_url, ["keyed"], runs=30, calls_per_batch=4, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the outbox to drain")
    assert tool_call_states(db_url) == {"succeeded": len(refs)}
    keyed = tools.tool("keyed")
    assert len(keyed.effects) == len(refs)
    assert keyed.duplicate_effects() == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 30
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.tool_batches WHERE status = 'delivered'") == 30
    )
    # outputs entered the history in call order, one tool message per call
    assert scalar(db_url, "SELECT count(*) FROM outbox.messages WHERE role = 'tool'") == len(refs)
    # each delivered batch enqueued exactly the next model turn
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'model_turn'") == 30 * 2


def test_requests_carry_stable_key_and_trace_headers(db_url, tools):
    refs = seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    delivery = tools.tool("keyed").deliveries[0]
    with psycopg.connect(db_url) as conn:
        key, run_id, call_id, corr = conn.execute(
            "SELECT tc.idempotency_key, tc.run_id, tc.tool_call_id, r.correlation_id "
            "FROM outbox.tool_calls tc JOIN outbox.runs r ON r.id = tc.run_id WHERE tc.id = %s",
            refs,
        ).fetchone()
    assert delivery.key == key == writer.idempotency_key(run_id, call_id)
    assert delivery.headers["x-outbox-run-id"] == str(run_id)
    assert delivery.headers["x-outbox-tool-call-id"] == call_id
    assert delivery.headers["x-correlation-id"] == corr
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", delivery.headers["traceparent"])


def test_4xx_is_a_terminal_error_result_the_model_sees(db_url, tools):
    tools.tool("keyed").fail(status=400, n=1)
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    assert tool_call_states(db_url) == {"failed": 1}
    assert len(tools.tool("keyed").deliveries) == 1
    content = scalar(db_url, "SELECT content FROM outbox.messages WHERE role = 'tool'")
    assert "HTTP 400" in content


@contextlib.contextmanager
def endless_tool() -> Iterator[str]:
    """A tool answering 200 with a chunked body that never ends: its URL. Each connection
    is fed until the client hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"

    def feed(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(head)
            while True:
                conn.sendall(chunk)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=feed, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/endless"
    finally:
        listener.close()


def test_a_tool_answering_without_end_gets_an_error_result_at_the_cap(db_url):
    """The relay reads a tool's answer up to the cap of a result and no further: the call
    fails with what happened, the model sees it, the relay's memory is not the tool's."""
    with endless_tool() as url, psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="endless", executor="http", endpoint=url, timeout_s=10)
        registry.register(conn, spec)
        conn.commit()
        seed(db_url, ["endless"], runs=1, calls_per_batch=1, args=args)
        with relay_thread(db_url):
            wait_until(lambda: all_settled(db_url))
    assert tool_call_states(db_url) == {"failed": 1}
    content = scalar(db_url, "SELECT content FROM outbox.messages WHERE role = 'tool'")
    assert "not read further" in content
    assert f"over the cap of {outbox_config.MAX_PAYLOAD_BYTES} bytes" in content


def test_5xx_retries_with_the_same_key_then_succeeds(db_url, tools):
    tools.tool("keyed").fail(status=500, n=2)
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    deliveries = tools.tool("keyed").deliveries
    assert [d.status for d in deliveries] == [500, 500, 200]
    assert len({d.key for d in deliveries}) == 1
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event LIKE '%retry_scheduled'")
        == 2
    )


def test_out_of_attempts_is_quarantined_with_its_last_error(db_url, tools):
    tools.tool("quick_timeout").fail(status=503, n=None)
    seed(db_url, ["quick_timeout"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert tool_call_states(db_url) == {"quarantined": 1}
    assert len(tools.tool("quick_timeout").deliveries) == 3
    error = scalar(db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'")
    assert "HTTP 503" in error


def test_timeout_after_side_effect_with_key_tool_makes_one_effect(db_url, tools):
    tools.tool("quick_timeout").stall_after_commit(1.0, n=1)
    seed(db_url, ["quick_timeout"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    tool = tools.tool("quick_timeout")
    assert len(tool.deliveries) == 2  # the timed-out one and the retry with the same key
    assert len(tool.effects) == 1
    assert tool_call_states(db_url) == {"succeeded": 1}


def test_timeout_after_side_effect_with_lookup_tool_is_reconciled(db_url, tools):
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outbox.tools SET timeout_s = 0.3 WHERE name = 'looked_up'")
        conn.commit()
    tools.tool("looked_up").stall_after_commit(1.0, n=1)
    seed(db_url, ["looked_up"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    tool = tools.tool("looked_up")
    assert len(tool.effects) == 1
    assert len(tool.deliveries) == 1  # never sent again: the lookup found it
    assert tool.lookups == 1
    assert scalar(db_url, "SELECT source FROM outbox.tool_results") == "lookup"
    assert tool_call_states(db_url) == {"succeeded": 1}


@pytest.mark.parametrize("mode", ["key", "lookup"])
def test_no_resend_and_no_trusted_not_found_while_a_timed_out_request_may_still_act(
    db_url, service, mode
):
    """The relay stops waiting after the tool's timeout, but the tool acts on the request
    later (and only then records its key or its effect): the retry neither resends nor
    takes the lookup's "not found" for an answer before the request's dispatch + timeout +
    settle, so it finds the effect instead of making a second one."""
    timeout_s, settle_s = 0.3, 1.0
    tool = service.add_tool("late_actor", mode)
    tool.act_after(timeout_s + 0.5)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "late_actor", mode, timeout_s=timeout_s, settle_s=settle_s)
        conn.commit()
    seed(db_url, ["late_actor"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    wait_until(lambda: tool.in_flight == 0, what="the timed-out request done at the tool")
    assert len(tool.effects) == 1
    assert tool_call_states(db_url) == {"succeeded": 1}
    # The lookup that found the effect (a lookup asked at once heard "not found" and was
    # not trusted), or the resend answered from the tool's record.
    again = tool.lookup_starts[-1] if mode == "lookup" else tool.starts[1]
    # The mark is committed just before the request leaves: its arrival is a few ms later.
    assert again - tool.starts[0] >= timeout_s + settle_s - 0.2
    if mode == "lookup":
        assert len(tool.starts) == 1
    waited = "SELECT count(*) FROM outbox.journal WHERE detail->>'error' LIKE '%no resend%'"
    assert scalar(db_url, waited) == 1


class DeepLookup(FakeServer):
    """A lookup endpoint that says the effect happened, with a result nested 100,000 deep."""

    def handle(self, request: Request) -> Reply:
        deep = b"[" * 100_000 + b"]" * 100_000
        return Reply(200, b'{"found": true, "result": ' + deep + b"}")


def test_a_lookup_answer_that_cannot_be_stored_is_an_error_result_not_a_call(db_url, tools):
    """The lookup said what happened in a form that cannot be kept: asking again would hear
    the same and calling the tool might act twice, so the call ends with an error result
    naming the problem, and the tool is not called."""
    seed(db_url, ["looked_up"], runs=1, calls_per_batch=1, args=args)
    with DeepLookup() as lookup, psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outbox.tools SET lookup_endpoint = %s", [lookup.url + "/lookup"])
        # What a relay that died mid-call long ago leaves of the call.
        conn.execute(
            "UPDATE outbox.tool_calls SET dispatched_attempt = 1, "
            "dispatched_at = now() - interval '1 hour', status = 'running'"
        )
        conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', attempts = 1, lease_owner = 'dead', "
            "lease_expires_at = now() - interval '1 second' WHERE kind = 'tool_call'"
        )
        conn.commit()
        with relay_thread(db_url):
            wait_until(lambda: tool_call_states(db_url) == {"failed": 1})
    assert tools.tool("looked_up").deliveries == []
    assert "nested more than" in scalar(db_url, "SELECT error FROM outbox.tool_results")


def test_timeout_after_side_effect_with_none_tool_is_never_repeated(db_url, tools):
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outbox.tools SET timeout_s = 0.3 WHERE name = 'blind'")
        conn.commit()
    tools.tool("blind").stall_after_commit(1.0, n=1)
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert len(tools.tool("blind").deliveries) == 1
    assert tool_call_states(db_url) == {"outcome_unknown": 1}
    assert "outcome" in scalar(
        db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'"
    )


def test_none_tool_reclaimed_after_a_crash_mid_call_is_not_called_again(db_url, tools):
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=args)
    with psycopg.connect(db_url) as conn:
        # A worker that claimed the row, marked it dispatched, then died.
        conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', attempts = 1, lease_owner = 'dead', "
            "lease_expires_at = now() - interval '1 second' WHERE kind = 'tool_call'"
        )
        conn.execute("UPDATE outbox.tool_calls SET dispatched_attempt = 1, status = 'running'")
        conn.commit()
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert tools.tool("blind").deliveries == []
    assert tool_call_states(db_url) == {"outcome_unknown": 1}
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'lease.expired.rescued'")
        == 1
    )


def test_late_write_of_an_expired_lease_holder_is_fenced(db_url, tools):
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', attempts = 1, lease_owner = 'ghost', "
            "lease_expires_at = now() - interval '1 second' WHERE kind = 'tool_call'"
        )
        conn.commit()
        row_id = conn.execute("SELECT id FROM outbox.outbox WHERE kind = 'tool_call'").fetchone()
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    # The ghost wakes up and tries to complete its (old) attempt: the fence refuses it.
    from outbox.relay.worker import Worker
    from tests.relay_harness import config

    ghost = Worker(config(db_url, worker_id="ghost"))
    from outbox.relay.outcomes import Claimed, Outcome

    claimed = Claimed(
        failures=0,
        id=row_id[0],
        kind="tool_call",
        tenant_id="acme",
        thread_id=None,
        run_id=None,
        batch_id=None,
        tool_call_ref=None,
        correlation_id=None,
        attempt=1,
        max_attempts=8,
        payload={},
        lag_s=0.0,
    )
    with psycopg.connect(db_url) as conn, conn.transaction():
        what = ghost.completer.apply(conn, Outcome(claimed, "result", "ok", {"late": True}))
    assert what == "fenced"
    assert scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'write.fenced'") == 1
    assert scalar(db_url, "SELECT output FROM outbox.tool_results") != {"late": True}


@pytest.mark.parametrize(
    "limits,started",
    [
        # one place: one slow call takes it, the other waits behind it
        ({"concurrency": 1}, 1),
        # places are free, but the tenant holds all one tenant may hold (2 of 4)
        ({"concurrency": 4, "tenant_share": 0.5}, 2),
    ],
    ids=["every-place-busy", "tenant-at-its-cap"],
)
def test_a_complete_batch_is_delivered_while_slow_calls_hold_the_places(
    db_url, tools, limits, started
):
    """Two slow calls hold what the relay may give (every place, or all a tenant may
    hold); another run's complete batch of that tenant is still delivered at once, not
    after those calls: a delivery takes no place."""
    from outbox.schemas import ToolResultIn

    tools.add_tool("slow", "key").stall_after_commit(5.0, n=None)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, tools, "slow", "key", timeout_s=10)
        conn.commit()
    slow = seed(db_url, ["slow"], runs=2, calls_per_batch=1, args=args)
    (done,) = seed(db_url, ["slow"], runs=1, calls_per_batch=1, args=args)
    with psycopg.connect(db_url) as conn:  # its result came from the backend
        conn.execute("DELETE FROM outbox.outbox WHERE tool_call_ref = %s", (done,))
        writer.record_tool_result(
            conn, ToolResultIn(tenant_id="acme", tool_call_ref=done, status="ok", output={})
        )
        conn.commit()
    with relay_thread(db_url, **limits):
        wait_until(lambda: len(tools.tool("slow").deliveries) == started, what="slow calls")
        wait_until(
            lambda: scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 1,
            what="the complete batch delivered",
        )
        results = "SELECT count(*) FROM outbox.tool_results WHERE tool_call_ref = ANY(%s)"
        assert scalar(db_url, results, (slow,)) == 0  # both slow calls still in flight


def test_relay_survives_its_connections_being_killed(db_url, tools):
    tools.tool("keyed").latency(0.02, n=None)
    refs = seed(db_url, ["keyed"], runs=40, calls_per_batch=5, args=args)
    with relay_thread(db_url, concurrency=4):
        wait_until(lambda: tool_call_states(db_url).get("succeeded", 0) >= 20)
        killed = scalar(
            db_url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'outbox-relay-%'",
        )
        assert killed >= 2
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="drain after the kill")
    assert tool_call_states(db_url) == {"succeeded": len(refs)}
    assert tools.tool("keyed").duplicate_effects() == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 40


def test_complete_batch_with_a_lost_delivery_is_driven_on(db_url, tools):
    refs = seed(db_url, ["keyed"], runs=1, calls_per_batch=2, args=args)
    with psycopg.connect(db_url) as conn:
        from outbox.schemas import ToolResultIn

        for ref in refs:
            writer.record_tool_result(
                conn, ToolResultIn(tenant_id="acme", tool_call_ref=ref, status="ok", output=1)
            )
        conn.execute("DELETE FROM outbox.outbox")  # the delivery row is lost
        conn.commit()
    with relay_thread(db_url):
        wait_until(lambda: scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 1)
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'batch.delivery_rescued'")
        == 1
    )


def test_claim_uses_the_partial_index(db_url, tools):
    seed(db_url, ["keyed"], runs=50, calls_per_batch=10, args=args)
    from outbox.relay.worker import Worker
    from tests.relay_harness import config

    worker = Worker(config(db_url))
    with psycopg.connect(db_url) as conn:
        conn.execute("ANALYZE outbox.outbox")
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + worker.q.claim,
            {"limit": 10, "worker": "w", "lease_s": 30, "kinds": ["tool_call"]}
            | {"tenant_cap": 1000, "held": "{}"},
        ).fetchone()[0]
        conn.rollback()
    assert "outbox_ready" in str(plan), plan


def test_notify_wakes_an_idle_relay_long_before_its_poll(db_url, tools):
    with relay_thread(db_url, poll_interval_s=120.0):
        wait_until(
            lambda: scalar(
                db_url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN outbox_ready%'",
            )
        )
        seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
        wait_until(lambda: all_settled(db_url), timeout_s=20, what="a NOTIFY wake-up")


def test_without_listen_the_relay_polls(db_url, tools):
    with relay_thread(db_url, listen=False, poll_interval_s=0.1):
        seed(db_url, ["keyed"], runs=2, calls_per_batch=2, args=args)
        wait_until(lambda: all_settled(db_url))
    assert tool_call_states(db_url) == {"succeeded": 4}


def test_metrics_endpoint_counts_the_work(db_url, tools):
    import httpx2

    port = free_port()
    tools.tool("keyed").fail(status=500, n=1)
    seed(db_url, ["keyed"], runs=2, calls_per_batch=3, args=args)
    with relay_thread(db_url, metrics_port=port):
        wait_until(lambda: all_settled(db_url))
        wait_until(
            lambda: "outbox_queue_depth{" in httpx2.get(f"http://127.0.0.1:{port}/metrics").text,
            what="the depth gauges",
        )
        text = httpx2.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'outbox_relay_claimed_total{kind="tool_call"} 7.0' in text  # 6 calls + 1 retry
    assert "outbox_relay_retried_total 1.0" in text
    assert 'outbox_relay_succeeded_total{kind="deliver_batch"} 2.0' in text
    assert "outbox_relay_claim_to_start_seconds_count" in text
    assert "outbox_queue_depth{" in text and "outbox_queue_oldest_ready_seconds" in text
    lags = scalar(
        db_url,
        "SELECT count(*) FROM outbox.journal "
        "WHERE event = 'tool_result.stored' AND detail ? 'lag_s'",
    )
    assert lags == 6


def test_log_lines_carry_every_identity(db_url, tools, tmp_path):
    import json as json_module

    from outbox.logs import IDENTITY_FIELDS
    from tests.relay_harness import start_relay_process

    refs = seed(db_url, ["keyed"], runs=1, calls_per_batch=2, args=args)
    log = tmp_path / "relay.log"
    relay = start_relay_process(db_url, log, "--poll-interval", "0.1", "--log-level", "INFO")
    try:
        wait_until(lambda: all_settled(db_url))
    finally:
        relay.terminate()
        relay.wait(timeout=30)
    lines = [
        json_module.loads(line) for line in log.read_text().splitlines() if line.startswith("{")
    ]
    results = [line for line in lines if line["event"] == "tool_call.result_stored"]
    assert len(results) == len(refs)
    for line in results:
        assert set(IDENTITY_FIELDS) <= set(line)
        assert all(line[f] is not None for f in IDENTITY_FIELDS), line


def test_a_heartbeat_extends_only_the_leases_about_half_their_term_into_it(db_url, tools):
    """Each extension writes a new version of the row (an entry in every index of the
    outbox): a lease with more than half its term and a round left is left as it
    is, and extended once it has less."""
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=args)
    from outbox.relay.worker import Worker
    from tests.relay_harness import config

    worker = Worker(config(db_url, worker_id="w1"))
    lease_s = worker.cfg.lease_s
    row_id = scalar(db_url, "SELECT id FROM outbox.outbox WHERE kind = 'tool_call'")
    version = "SELECT xmin::text, lease_expires_at - now() FROM outbox.outbox WHERE id = %s"

    def lease_for(seconds: float) -> None:
        with psycopg.connect(db_url) as conn:
            conn.execute(
                "UPDATE outbox.outbox SET status = 'leased', attempts = 1, lease_owner = 'w1',"
                " lease_expires_at = now() + make_interval(secs => %s) WHERE id = %s",
                [seconds, row_id],
            )

    def heartbeat() -> tuple[str, Any]:
        link = worker.link("maintenance", prepare=False)
        try:
            worker.maintenance.due = lambda within_s: [row_id]
            worker.maintenance._heartbeat(link)
        finally:
            link.close()
        with psycopg.connect(db_url) as conn:
            row = conn.execute(version, [row_id]).fetchone()
        assert row is not None
        return row[0], row[1].total_seconds()

    lease_for(lease_s)
    with psycopg.connect(db_url) as conn:
        before = conn.execute(version, [row_id]).fetchone()
    assert before is not None
    assert heartbeat()[0] == before[0]  # fresh: not rewritten
    lease_for(lease_s / 2)
    written, left = heartbeat()
    assert written != before[0] and left > lease_s * 0.9  # half spent: extended


def test_a_relay_never_thinks_a_lease_ends_later_than_the_database_and_heartbeats_only_those_due(
    db_url, tools
):
    """The heartbeat names only the rows whose lease may be due by the relay's clock, so
    that clock must never put a lease's end later than the database's: it counts from
    before the claim was sent. A claim held up on a lock (its now() taken before the wait)
    would show an end counted from its answer as later than the database's."""
    from outbox.relay.worker import Worker
    from tests.relay_harness import config

    seed(db_url, ["keyed"], runs=3, calls_per_batch=1, args=args)
    worker = Worker(config(db_url, worker_id="w1"))
    renew_below_s = worker.maintenance.renew_below_s
    assert renew_below_s < worker.cfg.lease_s  # else every lease is due at every round
    claim_link, link = worker.claim_link(), worker.link("maintenance", prepare=False)
    claimer = claim_link.get().info.backend_pid
    held = threading.Event()

    def hold_the_table() -> None:
        with psycopg.connect(db_url) as holder:
            holder.execute("LOCK TABLE outbox.outbox IN SHARE MODE")
            held.set()
            wait_until(
                lambda: scalar(
                    db_url,
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    [claimer],
                ),
                what="the claim waiting for the table",
            )
            holder.execute("SELECT pg_sleep(0.5)")  # the claim stays held up this long

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert held.wait(10)
        rows = worker._claim(claim_link, 3)
        holder.join()
        assert len(rows) == 3
        ids = [row.id for row in rows]
        left = (
            "SELECT extract(epoch FROM lease_expires_at - now()) FROM outbox.outbox WHERE id = %s"
        )
        for row_id in ids:
            in_the_database = float(scalar(db_url, left, [row_id]))
            assert worker.lease_ends[row_id] - time.monotonic() <= in_the_database
        assert worker._due(renew_below_s) == []  # fresh: none read by the next heartbeat

        # One of them as if claimed a term ago, in the database and by the relay's clock.
        due = ids[0]
        worker._extended([due], time.monotonic() - worker.cfg.lease_s)
        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE outbox.outbox SET lease_expires_at = now() WHERE id = %s", [due])
        assert worker._due(renew_below_s) == [due]
        worker.maintenance._heartbeat(link)
        assert float(scalar(db_url, left, [due])) > renew_below_s  # extended
        assert worker._due(renew_below_s) == []  # and known to be
    finally:
        claim_link.close()
        link.close()


def test_prepare_turns_finds_each_run_by_its_key_however_many_runs_there_are(db_url):
    """The model turns of a batch read their runs one by primary key each: a hash join
    would scan every run the table holds at every batch (measured at 10,000 runs in flight,
    bench.statements: 64 buffers a turn against 20 at 1,000)."""
    from outbox.relay.worker import Worker
    from tests.helpers import new_run
    from tests.relay_harness import config

    with psycopg.connect(db_url) as conn:
        run = new_run(conn)
        conn.execute(
            "INSERT INTO outbox.runs SELECT (jsonb_populate_record(r, jsonb_build_object("
            "'id', gen_random_uuid(), 'status', 'completed'))).* "
            "FROM outbox.runs r, generate_series(1, 20000)"
        )
        conn.commit()
        conn.execute("ANALYZE outbox.runs")
        ids = [r[0] for r in conn.execute("SELECT id FROM outbox.runs LIMIT 300")]
        assert run.id
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN (COSTS OFF) " + Worker(config(db_url)).q.prepare_turns,
                {"run_ids": ids, "steps": [1] * len(ids)},
            )
        )
        conn.rollback()
    assert "Seq Scan on runs" not in plan, plan
    assert re.search(r"Index Scan using \w+ on runs\b", plan), plan


def test_every_lookup_of_prepare_turns_goes_through_an_index(db_url):
    """A lookup without an index of its own scans a whole table or index at every batch of
    model turns, a cost that grows with every call stored (a thread's calls found by
    thread_id, which leads no index of tool_calls: 82 buffers a turn at 10,000 runs in
    flight against 20 at 1,000, `python -m bench.statements`). With sequential scans priced
    out, the plan needs none, and no index searched by a column it does not lead with."""
    from outbox.relay.worker import Worker
    from tests.helpers import new_run
    from tests.relay_harness import config

    with psycopg.connect(db_url) as conn:
        run = new_run(conn)
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN (COSTS OFF) " + Worker(config(db_url)).q.prepare_turns,
                {"run_ids": [run.id], "steps": [1]},
            )
        )
        conn.rollback()
    # run_defaults holds one row by construction (the platform's defaults): its scan is
    # one page, whatever the tables around it hold.
    scans = [line for line in plan.splitlines() if "Seq Scan" in line]
    assert all("on run_defaults" in line for line in scans), plan
    # (id, thread_id, tenant_id) searched by thread_id alone: a skip scan, one search per
    # call stored; searched by its id (a message's call), one search
    lines = plan.splitlines()
    for at, line in enumerate(lines):
        if "using tool_calls_id_thread_key" in line:
            assert re.search(r"Index Cond: \(+id = ", lines[at + 1]), plan


def test_a_threads_calls_are_read_through_an_index_it_leads(db_url):
    """The history of a thread (outbox.history) reads its calls through its messages, not
    by thread_id, which leads no index of tool_calls: searched alone it reads every call
    stored."""
    from outbox.history import Q

    with psycopg.connect(db_url) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN (COSTS OFF) " + Q.thread_calls, {"thread_id": uuid.uuid4()}
            )
        )
        conn.rollback()
    assert "Seq Scan" not in plan, plan
    assert "using tool_calls_id_thread_key" not in plan, plan
