"""Relay processes under abuse: kill -9 at random, SIGSTOP past the lease, SIGTERM, restarts.

Every check reads the fake services' own audit trails and the database, never the relay's
opinion of itself.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest

from outbox.testing.relay import relay_workers
from outbox.testing.tools import FakeTool, FakeToolService
from tests.forked import Forked
from tests.relay_harness import (
    FAST,
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    seed,
    start_relay_process,
    tool_call_states,
    wait_until,
)


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        yield svc


def stop_all(processes: list[Forked]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def run_chaos(
    db_url: str, service: FakeToolService, tmp_path: Path, calls: int, kills: int
) -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "7")))
    for name, mode in (("keyed", "key"), ("looked_up", "lookup"), ("blind", "none")):
        service.add_tool(name, mode).latency(0.01, n=None)
    with psycopg.connect(db_url) as conn:
        for name, mode in (("keyed", "key"), ("looked_up", "lookup"), ("blind", "none")):
            register_tool(conn, service, name, mode, max_attempts=50)
        conn.commit()
    mix = ["keyed", "keyed", "keyed", "looked_up", "blind"]
    seed(db_url, mix, runs=calls // 5, calls_per_batch=5, args=lambda n: {"n": n})
    log = tmp_path / "relays.log"
    relays = [start_relay_process(db_url, log, "--concurrency", "8", *FAST) for _ in range(3)]
    try:
        done_kills = 0
        while done_kills < kills and not all_settled(db_url):
            time.sleep(rng.uniform(0.2, 0.8))  # chaos pacing: when the next kill lands
            victim = rng.randrange(len(relays))
            relays[victim].send_signal(signal.SIGKILL)
            relays[victim].wait(timeout=10)
            relays[victim] = start_relay_process(db_url, log, "--concurrency", "8", *FAST)
            done_kills += 1
        drain_s = 120 + calls / 100  # generous: seconds, growing with the work left to do
        wait_until(lambda: all_settled(db_url), timeout_s=drain_s, what="drain after the kills")
    finally:
        stop_all(relays)

    states = tool_call_states(db_url)
    assert sum(states.values()) == calls, states
    # 0 lost intents: every call has a result, except non-idempotent ones parked as unknown.
    assert set(states) <= {"succeeded", "outcome_unknown"}, states
    unknown = scalar(
        db_url,
        "SELECT count(*) FROM outbox.tool_calls WHERE status = 'outcome_unknown' "
        "AND idempotency_mode <> 'none'",
    )
    assert unknown == 0
    # 0 duplicate side effects, counted by the tools themselves.
    keyed = service.tool("keyed")
    n_keyed = scalar(db_url, "SELECT count(*) FROM outbox.tool_calls WHERE tool_name = 'keyed'")
    assert len(keyed.effects) == n_keyed and keyed.duplicate_effects() == 0
    assert service.tool("looked_up").duplicate_effects() == 0
    assert service.tool("blind").duplicate_effects() == 0  # never executed twice
    # Every batch whose calls all have results was delivered exactly once, in full.
    undelivered = scalar(
        db_url,
        "SELECT count(*) FROM outbox.tool_batches b WHERE b.status <> 'delivered' AND NOT EXISTS "
        "(SELECT 1 FROM outbox.tool_calls c WHERE c.batch_id = b.id "
        "AND c.status = 'outcome_unknown')",
    )
    if undelivered:
        with psycopg.connect(db_url) as conn:
            detail = conn.execute(
                "SELECT b.id, b.status, b.pending, b.size, "
                "(SELECT count(*) FROM outbox.tool_results r WHERE r.batch_id = b.id), "
                "(SELECT array_agg(c.tool_name || ':' || c.status || ':' || c.attempts || ':' "
                " || coalesce(c.dispatched_attempt, 0) || ':' || (r.tool_call_ref IS NOT NULL)) "
                " FROM outbox.tool_calls c LEFT JOIN outbox.tool_results r "
                " ON r.tool_call_ref = c.id WHERE c.batch_id = b.id) "
                "FROM outbox.tool_batches b WHERE b.status <> 'delivered' AND NOT EXISTS "
                "(SELECT 1 FROM outbox.tool_calls c WHERE c.batch_id = b.id "
                "AND c.status = 'outcome_unknown') LIMIT 3"
            ).fetchall()
            events = conn.execute(
                "SELECT event, tool_call_ref, attempt, worker, detail FROM outbox.journal "
                "WHERE batch_id = %s ORDER BY id",
                [detail[0][0]],
            ).fetchall()
        raise AssertionError(f"{undelivered} batches not delivered: {detail} {events}")
    delivered = scalar(
        db_url, "SELECT count(*) FROM outbox.tool_batches WHERE status = 'delivered'"
    )
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == delivered
    tool_messages = scalar(
        db_url,
        "SELECT count(*) FROM outbox.messages m JOIN outbox.tool_calls c ON c.id = m.tool_call_ref "
        "JOIN outbox.tool_batches b ON b.id = c.batch_id WHERE b.status = 'delivered'",
    )
    assert tool_messages == delivered * 5
    raw = sum(len(service.tool(n).deliveries) for n in ("keyed", "looked_up", "blind"))
    print(f"chaos: {calls} intents, {kills} kills, {raw} raw deliveries, states {states}")


def test_kill_9_relays_while_2000_tool_calls_run(db_url, service, tmp_path):
    run_chaos(db_url, service, tmp_path, calls=2000, kills=6)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_kill_9_soak(db_url, service, tmp_path):
    run_chaos(db_url, service, tmp_path, calls=20000, kills=60)


def a_call_answered_late(db_url: str, service: FakeToolService) -> Any:
    """One intent of a key-mode tool that answers 1.5 s after its effect, with a 3 s
    timeout: a relay paused mid-call is past its lease (2 s, ``FAST``) before it hears."""
    tool = service.add_tool("keyed", "key")
    tool.stall_after_commit(1.5, n=1)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key", timeout_s=3)
        conn.commit()
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    return tool


def a_second_relay_takes_over(db_url: str, first: Forked) -> None:
    """With ``first`` paused mid-call: a second relay (a thread: only the paused one must
    be a process) finishes the call under a claim of its own, after waiting, as a claim of
    its own, for the paused request to settle; then ``first`` wakes and its late write is
    fenced off."""
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the second relay to finish the call")
        assert scalar(db_url, "SELECT attempt FROM outbox.tool_results") > 1
        first.send_signal(signal.SIGCONT)
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'write.fenced'"
            ),
            what="the late write to be fenced off",
        )


def only_the_paused_claim_was_fenced(db_url: str, tool: Any) -> None:
    """One effect; the result is another claim's; the paused holder's write, whatever it
    says (its answer, or a timeout when its clock ran out first on waking), is refused:
    its fencing token is the first claim's."""
    assert len(tool.effects) == 1
    assert scalar(db_url, "SELECT attempt FROM outbox.tool_results") > 1
    fenced = "SELECT array_agg(attempt) FROM outbox.journal WHERE event = 'write.fenced'"
    assert scalar(db_url, fenced) == [1]


def test_worker_paused_past_its_lease_cannot_overwrite_the_new_holder(db_url, service, tmp_path):
    tool = a_call_answered_late(db_url, service)
    first = start_relay_process(db_url, tmp_path / "relays.log", *FAST)
    try:
        owner = f"%:{first.pid}:%"
        wait_until(
            lambda: (
                scalar(
                    db_url, "SELECT count(*) FROM outbox.outbox WHERE lease_owner LIKE %s", [owner]
                )
                and len(tool.deliveries) == 1
            ),
            what="the first relay to be mid-call",
        )
        first.send_signal(signal.SIGSTOP)
        a_second_relay_takes_over(db_url, first)
    finally:
        first.send_signal(signal.SIGCONT)
        stop_all([first])
    only_the_paused_claim_was_fenced(db_url, tool)


def test_worker_paused_inside_a_transaction_holds_its_rows_no_longer_than_its_lease(
    db_url, service, tmp_path
):
    """The pause lands where the random one above rarely does: inside the heartbeat's
    transaction, the row locked. The server ends that session after a lease idle in a
    transaction (relay/links.py), so the rescue can take the row; without that, SKIP LOCKED
    passes it over for as long as the pause lasts."""
    tool = a_call_answered_late(db_url, service)
    log = tmp_path / "relays.log"
    at_the_tool = tmp_path / "the call is at the tool"
    env = {
        "OUTBOX_FAILPOINT": "heartbeat.before_commit:stop",
        "OUTBOX_FAILPOINT_WHEN": str(at_the_tool),
    }
    first = start_relay_process(db_url, log, *FAST, env=env)
    try:
        wait_until(lambda: len(tool.deliveries) == 1, what="the call at the tool")
        at_the_tool.touch()
        wait_until(
            lambda: psutil.Process(first.pid).status() == psutil.STATUS_STOPPED,
            what="the first relay to stop inside its heartbeat's transaction",
        )
        a_second_relay_takes_over(db_url, first)
        wait_until(
            lambda: "idle-in-transaction timeout" in log.read_text(),
            what="the paused relay to find its heartbeat's session ended by the server",
        )
    finally:
        first.send_signal(signal.SIGCONT)
        stop_all([first])
    only_the_paused_claim_was_fenced(db_url, tool)


def stalled_keyed_calls(db_url: str, service: Any, stall_s: float, calls: int) -> Any:
    """``calls`` intents of a key-mode tool that answers ``stall_s`` after its effect."""
    tool = service.add_tool("keyed", "key")
    tool.stall_after_commit(stall_s, n=None)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key", timeout_s=10)
        conn.commit()
    seed(db_url, ["keyed"], runs=1, calls_per_batch=calls, args=lambda n: {"n": n})
    return tool


def test_sigterm_finishes_in_flight_calls_and_leaves_the_rest(db_url, service, tmp_path):
    tool = stalled_keyed_calls(db_url, service, 1.0, 6)
    relay = start_relay_process(db_url, tmp_path / "r.log", "--concurrency", "2", *FAST)
    try:
        wait_until(lambda: len(tool.deliveries) == 2, what="two calls in flight")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
    finally:
        stop_all([relay])
    assert tool_call_states(db_url) == {"succeeded": 2, "pending": 4}
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'leased'") == 0
    # No row is claimed that cannot start: the other four were never leased, and no
    # attempt was charged to anything (a restart must not use attempts up).
    released = "SELECT count(*) FROM outbox.outbox WHERE last_error LIKE 'released by %'"
    assert scalar(db_url, released) == 0
    assert scalar(db_url, "SELECT max(attempts) FROM outbox.outbox WHERE kind = 'tool_call'") == 0
    assert scalar(db_url, "SELECT max(failures) FROM outbox.outbox") == 0


def test_sigterm_past_the_grace_period_releases_in_flight_rows(db_url, service, tmp_path):
    tool = stalled_keyed_calls(db_url, service, 5.0, 1)
    relay = start_relay_process(db_url, tmp_path / "r.log", "--grace", "0.2", *FAST)
    try:
        wait_until(lambda: len(tool.deliveries) == 1, what="the call in flight")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
    finally:
        stop_all([relay])
    assert scalar(db_url, "SELECT status FROM outbox.outbox WHERE kind = 'tool_call'") == "ready"
    assert "released" in scalar(
        db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'"
    )
    # The fencing token is not reused, and the attempt is not charged: the relay stopped,
    # the tool did not fail.
    assert scalar(db_url, "SELECT attempts FROM outbox.outbox WHERE kind = 'tool_call'") == 1
    assert scalar(db_url, "SELECT failures FROM outbox.outbox WHERE kind = 'tool_call'") == 0
    assert scalar(db_url, "SELECT lost_leases FROM outbox.outbox WHERE kind = 'tool_call'") == 1


def test_sigterm_past_the_grace_period_claims_nothing_it_cannot_start(db_url, service, tmp_path):
    """With one place in flight, the second row is not claimed to wait behind the first;
    the first overruns the grace period and is released. Neither is charged an attempt."""
    tool = stalled_keyed_calls(db_url, service, 5.0, 2)
    relay = start_relay_process(
        db_url, tmp_path / "r.log", "--concurrency", "1", "--grace", "0.2", *FAST
    )
    try:
        wait_until(lambda: len(tool.deliveries) == 1, what="the first call in flight")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
    finally:
        stop_all([relay])
    attempts = (
        "SELECT array_agg(attempts ORDER BY attempts) FROM outbox.outbox WHERE kind = 'tool_call'"
    )
    assert scalar(db_url, attempts) == [0, 1]
    assert scalar(db_url, "SELECT max(failures) FROM outbox.outbox") == 0
    ready = "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call' AND status = 'ready'"
    assert scalar(db_url, ready) == 2
    assert len(tool.deliveries) == 1


def test_supervisor_restarts_a_killed_worker_and_stops_cleanly(db_url, service, tmp_path):
    service.add_tool("keyed", "key")
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key")
        conn.commit()
    supervisor = start_relay_process(db_url, tmp_path / "s.log", "--processes", "2", *FAST)
    try:
        parent = psutil.Process(supervisor.pid)

        def workers() -> list[int]:
            return [c.pid for c in relay_workers(supervisor.pid)]

        victim = wait_until(lambda: len(workers()) == 2 and workers())[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: len(workers()) == 2 and victim not in workers(), what="a replacement worker"
        )
        seed(db_url, ["keyed"], runs=5, calls_per_batch=4, args=lambda n: {"n": n})
        wait_until(lambda: all_settled(db_url))
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
        assert parent.is_running() is False or parent.status() == psutil.STATUS_ZOMBIE
    finally:
        stop_all([supervisor])
    assert tool_call_states(db_url) == {"succeeded": 20}
    assert service.tool("keyed").duplicate_effects() == 0


def test_supervisor_ends_a_killed_workers_leases_at_once(db_url, service, tmp_path):
    """The supervisor saw its worker die: the rows it held run again long before their
    lease (600 s here) would have run out, once, and the killed attempt costs nothing."""
    service.add_tool("keyed", "key")
    with psycopg.connect(db_url) as conn:
        # Resent once the killed request can no longer act (timeout + settle: 5.5 s), long
        # before the lease would have run out.
        register_tool(conn, service, "keyed", "key", timeout_s=5.0, settle_s=0.5)
        conn.commit()
    # The first request commits its effect and is held: its worker keeps the lease.
    service.tool("keyed").stall_after_commit(60)
    long_lease = [*FAST]
    long_lease[long_lease.index("--lease") + 1] = "600"
    supervisor = start_relay_process(db_url, tmp_path / "s.log", "--processes", "2", *long_lease)
    leased = "SELECT lease_owner FROM outbox.outbox WHERE kind = 'tool_call' AND status = 'leased'"
    try:
        seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
        owner = wait_until(
            lambda: len(service.tool("keyed").effects) == 1 and scalar(db_url, leased),
            what="the call's effect done, its answer held, its row leased",
        )
        os.kill(int(owner.split(":")[1]), signal.SIGKILL)
        wait_until(lambda: all_settled(db_url), what="the call run again by another worker")
    finally:
        stop_all([supervisor])
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert service.tool("keyed").duplicate_effects() == 0
    rescued = (
        "SELECT detail->>'previous_owner' FROM outbox.journal WHERE event = 'lease.expired.rescued'"
    )
    assert scalar(db_url, rescued) == owner
    assert scalar(db_url, "SELECT failures FROM outbox.outbox WHERE kind = 'tool_call'") in (
        None,  # done rows leave the queue
        0,
    )


ACTING_TIMEOUT_S = 3.0  # seconds: the tool's timeout in kill_the_worker_of_an_acting_request


def kill_the_worker_of_an_acting_request(
    db_url: str,
    service: FakeToolService,
    tmp_path: Path,
    tool: FakeTool,
    *,
    settle_s: float,
    settled_within_s: float = 30.0,
    **declared: Any,
) -> None:
    """One call of ``tool`` (it acts 1.5 s after taking a request) through a
    supervised relay of two workers; the worker holding the call is killed with -9 while
    its request is at the tool. Returns once the call settled (within
    ``settled_within_s``) and the killed worker's request is done at the tool."""
    tool.act_after(1.5)
    with psycopg.connect(db_url) as conn:
        register_tool(
            conn,
            service,
            tool.name,
            tool.mode,
            timeout_s=ACTING_TIMEOUT_S,
            settle_s=settle_s,
            **declared,
        )
        conn.commit()
    supervisor = start_relay_process(db_url, tmp_path / "s.log", "--processes", "2", *FAST)
    leased = "SELECT lease_owner FROM outbox.outbox WHERE kind = 'tool_call' AND status = 'leased'"
    try:
        seed(db_url, [tool.name], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
        owner = wait_until(
            lambda: len(tool.starts) == 1 and scalar(db_url, leased),
            what="the request at the tool, its row leased",
        )
        os.kill(int(owner.split(":")[1]), signal.SIGKILL)
        wait_until(lambda: all_settled(db_url), timeout_s=settled_within_s, what="the call settled")
        wait_until(lambda: tool.in_flight == 0, what="the killed worker's request done")
    finally:
        stop_all([supervisor])


@pytest.mark.parametrize("mode", ["lookup", "key"])
def test_a_request_of_a_killed_worker_is_not_repeated_while_it_may_still_act(
    db_url, service, tmp_path, mode
):
    """A worker is killed with -9 while its request is at the tool, which acts on it only
    a while later (and records the key only then). The supervisor ends the dead worker's
    leases at once and another worker takes the row, but it neither trusts the lookup's
    "not found" nor resends before the request's dispatch + the tool's timeout (+ settle):
    asked earlier, the lookup answers "not found" and a resend would act again."""
    timeout_s = ACTING_TIMEOUT_S
    tool = service.add_tool("slow", mode)
    kill_the_worker_of_an_acting_request(db_url, service, tmp_path, tool, settle_s=1.0)
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert len(tool.effects) == 1, tool.effects
    first = tool.starts[0]
    if mode == "lookup":
        assert len(tool.starts) == 1  # the lookup found the effect: no second request
        assert tool.lookup_starts and tool.lookup_starts[-1] - first >= timeout_s
    else:
        assert len(tool.starts) == 2  # the same key again, answered from the tool's record
        assert tool.starts[1] - first >= timeout_s
        assert tool.deliveries[-1].replayed
    waited = "SELECT count(*) FROM outbox.journal WHERE detail->>'error' LIKE '%no resend%'"
    assert scalar(db_url, waited) >= 1


@pytest.mark.parametrize("mode", ["lookup", "key"])
def test_a_killed_workers_request_at_a_tool_that_knows_it_is_asked_about_at_once(
    db_url, service, tmp_path, mode
):
    """The same kill, at tools that know their requests in flight: the ticketing lookup
    answers "in progress", the key tool refuses a key in use with 409. The next worker asks
    at once, long before the settle bound, and still makes no second effect."""
    settle_s = 60.0
    tool = service.add_tool("slow", mode, tracks_in_flight=True)
    declared = {"refuses_key_in_use": True} if mode == "key" else {}
    # Settled well inside the settle bound: only asking at once settles it in time.
    kill_the_worker_of_an_acting_request(
        db_url,
        service,
        tmp_path,
        tool,
        settle_s=settle_s,
        settled_within_s=settle_s / 2,
        **declared,
    )
    assert tool_call_states(db_url) == {"succeeded": 1}
    assert len(tool.effects) == 1, tool.effects
    if mode == "lookup":
        assert len(tool.starts) == 1  # asked, never called again
    else:
        assert tool.deliveries[-1].replayed  # the first request's answer, from its record
    waited = "SELECT count(*) FROM outbox.journal WHERE detail->>'error' LIKE '%no resend%'"
    assert scalar(db_url, waited) == 0


def test_workers_stop_when_their_supervisor_is_killed(db_url, service, tmp_path):
    supervisor = start_relay_process(db_url, tmp_path / "s.log", "--processes", "2", *FAST)
    children = wait_until(
        lambda: len(relay_workers(supervisor.pid)) == 2 and relay_workers(supervisor.pid),
        what="two workers",
    )
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"workers outlived their supervisor: {alive}"
    assert len(gone) == 2


def test_sigterm_exits_even_when_the_database_is_gone(db_url, server_url, service, tmp_path):
    tool = service.add_tool("keyed", "key")
    tool.stall_after_commit(1.0, n=None)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "keyed", "key", timeout_s=10)
        conn.commit()
    seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    # The grace period outlasts the call: its outcome is queued while the database is gone.
    relay = start_relay_process(db_url, tmp_path / "r.log", "--grace", "2", *FAST)
    try:
        wait_until(lambda: len(tool.deliveries) == 1, what="the call in flight")
        name = urlsplit(db_url).path.lstrip("/")
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        relay.send_signal(signal.SIGTERM)
        # The outcome can never be written: the relay gives up after its grace period
        # (the rows' leases would expire and another worker rescue them) instead of hanging.
        assert relay.wait(timeout=45) == 0
    finally:
        stop_all([relay])
