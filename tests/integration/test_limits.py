"""Limits per tool and per tenant hold across relay processes; claims are fair across tenants.

The limits are checked by what the tool service itself saw (requests it was answering at
once), never by the relay's word; a rate by the database's own record of each claim (a
trigger the test adds). No wall-clock assertion: a rate is checked as a count of claims
within windows of the database's clock.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import limits, registry, writer
from outbox.errors import InvalidInput
from outbox.relay.worker import Worker
from outbox.testing.tools import RETRY_AFTER_S, FakeToolService
from tests.helpers import new_run, turn
from tests.relay_harness import (
    FAST,
    all_settled,
    config,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    tool_call_states,
    wait_until,
)
from tests.relay_harness import TENANT as ACME


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        svc.add_tool("slow", "key")
        yield svc


def seed_calls(db_url: str, tenant: str, tool: str, runs: int, calls: int) -> None:
    with psycopg.connect(db_url) as conn:
        for _ in range(runs):
            run = new_run(conn, tenant=tenant, tools=[tool])
            asked = [(f"call_{i}", tool, {"n": i}) for i in range(calls)]
            writer.record_model_turn(conn, turn(run, 1, *asked))
        conn.commit()


def python_tool(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="echo", executor="python", callable="tests.tooling:echo")
        registry.register(conn, spec)
        conn.commit()
    return "echo"


def set_limits(db_url: str, scope: Any, name: str, **kw: Any) -> None:
    with psycopg.connect(db_url) as conn:
        limits.set_limits(conn, scope, name, **kw)
        conn.commit()


def stop(processes: list[Any]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except Exception:
            process.kill()
            process.wait()


# -- fairness ---------------------------------------------------------------------------


def test_one_tenants_backlog_does_not_hold_back_another(db_url):
    tool = python_tool(db_url)
    seed_calls(db_url, ACME, tool, runs=50, calls=20)  # 1,000 older rows of one tenant
    seed_calls(db_url, "globex", tool, runs=1, calls=1)
    worker = Worker(config(db_url))
    link = worker.claim_link()
    try:
        claimed = worker._claim(link, 10)
    finally:
        link.close()
    assert len(claimed) == 10
    assert [r.tenant_id for r in claimed].count("globex") == 1


def test_a_claim_takes_tenants_round_robin(db_url):
    tool = python_tool(db_url)
    for tenant in ("t1", "t2", "t3"):
        seed_calls(db_url, tenant, tool, runs=3, calls=10)
    worker = Worker(config(db_url))
    link = worker.claim_link()
    try:
        claimed = worker._claim(link, 9)
    finally:
        link.close()
    assert sorted(r.tenant_id for r in claimed) == ["t1"] * 3 + ["t2"] * 3 + ["t3"] * 3


def test_one_tenant_never_fills_the_relay_so_a_newcomer_finds_a_place(db_url, service):
    """--tenant-share: a tenant's backlog takes at most its share of the places; the rest
    is the next tenant's at its first claim, while the busy tenant's calls still run."""
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow_key", "key")
        conn.commit()
    seed_calls(db_url, ACME, "slow_key", runs=20, calls=10)  # 200 calls of one tenant
    worker = Worker(config(db_url, concurrency=10, tenant_share=0.8))
    link = worker.claim_link()
    try:
        first = worker._claim(link, worker._free())
        assert [r.tenant_id for r in first] == [ACME] * 8  # 8 of 10 places, not 10
        assert worker._claim(link, 2) == []  # at its cap: the last places stay free
        seed_calls(db_url, "globex", "slow_key", runs=1, calls=3)
        newcomer = worker._claim(link, 2)
        assert [r.tenant_id for r in newcomer] == ["globex"] * 2
    finally:
        link.close()


def test_the_cap_holds_when_a_claim_fills_other_tenants_shares(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow_key", "key")
        conn.commit()
    seed_calls(db_url, ACME, "slow_key", runs=20, calls=10)
    seed_calls(db_url, "globex", "slow_key", runs=1, calls=1)
    worker = Worker(config(db_url, concurrency=10, tenant_share=0.6))
    link = worker.claim_link()
    try:
        claimed = worker._claim(link, 10)  # globex's unused share goes to acme up to its cap
        tenants = [r.tenant_id for r in claimed]
        assert tenants.count("globex") == 1 and tenants.count(ACME) == 6
        assert worker._claim(link, 3) == []
    finally:
        link.close()


# -- limits across relays ----------------------------------------------------------------
# Two relays, each its own worker with its own connections, hold one limit between them:
# the limit is counted in the database. They run in threads of the test (a relay process
# costs about 0.5 s of CPU to start); a killed relay is a process.


def test_a_tools_concurrency_limit_holds_across_two_relays(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        limits.set_limits(conn, "tool", "slow", max_concurrency=3)
        conn.commit()
    service.tool("slow").latency(0.2, n=None)  # every request takes a while
    seed_calls(db_url, ACME, "slow", runs=6, calls=5)
    with relay_thread(db_url), relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), timeout_s=120, what="30 calls done")
    assert tool_call_states(db_url) == {"succeeded": 30}
    assert 1 <= service.tool("slow").max_in_flight <= 3
    assert service.tool("slow").duplicate_effects() == 0


def test_a_tenants_concurrency_limit_holds_across_two_relays(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        limits.set_limits(conn, "tenant", ACME, max_concurrency=2)
        conn.commit()
    service.tool("slow").latency(0.2, n=None)
    seed_calls(db_url, ACME, "slow", runs=4, calls=5)
    with relay_thread(db_url), relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), timeout_s=120, what="20 calls done")
    assert tool_call_states(db_url) == {"succeeded": 20}
    assert 1 <= service.tool("slow").max_in_flight <= 2


def test_a_tools_rate_limit_caps_the_calls_started_per_second(db_url, service):
    rate = 5.0
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        limits.set_limits(conn, "tool", "slow", rate=rate)
        # The bucket is taken by the claim, at the claim's now(); a call's arrival at the
        # tool comes after a delivery delay of its own (a busy machine holds the first
        # burst back while a later claim goes out at once), so the rate is judged on the
        # claims' times. Every claim of the tool is written down, in its transaction (not a
        # lease's extension: the row was not leased before).
        conn.execute("CREATE TABLE outbox.test_claims (at timestamptz NOT NULL)")
        conn.execute(
            """
            CREATE FUNCTION outbox.test_note_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO outbox.test_claims VALUES (now());
                RETURN NULL;
            END $$
            """
        )
        conn.execute(
            "CREATE TRIGGER test_note_claim AFTER UPDATE ON outbox.outbox FOR EACH ROW"
            " WHEN (OLD.status <> 'leased' AND NEW.status = 'leased' AND NEW.tool_name = 'slow')"
            " EXECUTE FUNCTION outbox.test_note_claim()"
        )
        conn.commit()
    seed_calls(db_url, ACME, "slow", runs=3, calls=5)
    with relay_thread(db_url, poll_interval_s=0.05):
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="15 calls done")
    assert len(service.tool("slow").starts) == 15
    with psycopg.connect(db_url) as conn:
        claims = [
            at.timestamp()
            for (at,) in conn.execute("SELECT at FROM outbox.test_claims ORDER BY at")
        ]
    assert len(claims) >= 15
    # A bucket of burst max(1, rate) refilled at `rate`: within any window of W seconds at
    # most burst + rate * W calls are claimed.
    for i, first in enumerate(claims):
        for j in range(i, len(claims)):
            window = claims[j] - first
            assert j - i + 1 <= rate + rate * window + 1e-6, (i, j, window)


def test_a_killed_relay_gives_its_slots_back(db_url, service, tmp_path):
    """A limit counts rows in flight, so a relay killed with a call in flight holds its slot
    only until the lease is rescued: the others go on."""
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        limits.set_limits(conn, "tool", "slow", max_concurrency=1)
        conn.commit()
    service.tool("slow").stall_after_commit(60)  # the first call is held past its timeout
    seed_calls(db_url, ACME, "slow", runs=1, calls=4)
    victim = start_relay_process(db_url, tmp_path / "victim.log", *FAST)
    leased = "SELECT count(*) FROM outbox.outbox WHERE status = 'leased'"
    try:
        wait_until(lambda: len(service.tool("slow").effects) == 1, what="the first call held")
        assert scalar(db_url, leased) == 1  # the limit: one in flight, three waiting
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        stop([victim])
    # The relay that takes over runs in a thread: only the killed one must be a process.
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="every call done")
    assert tool_call_states(db_url) == {"succeeded": 4}
    assert service.tool("slow").duplicate_effects() == 0


def test_a_limit_removed_while_calls_wait_lets_them_all_run(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        limits.set_limits(conn, "tool", "slow", max_concurrency=1)
        conn.commit()
    service.tool("slow").latency(0.1, n=None)
    seed_calls(db_url, ACME, "slow", runs=2, calls=5)
    with relay_thread(db_url, poll_interval_s=0.05):
        wait_until(lambda: tool_call_states(db_url).get("succeeded", 0) >= 2, what="2 done")
        assert service.tool("slow").max_in_flight == 1
        set_limits(db_url, "tool", "slow", max_concurrency=None)
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="every call done")
    assert tool_call_states(db_url) == {"succeeded": 10}


# -- Retry-After and bad input -------------------------------------------------------------


def test_a_tools_retry_after_delays_the_call_as_asked(db_url, service):
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "slow", "key")
        conn.commit()
    service.tool("slow").fail(status=429)
    seed_calls(db_url, ACME, "slow", runs=1, calls=1)
    with relay_thread(db_url, poll_interval_s=0.05, retry_base_s=0.01):
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="the call done")
    delay = scalar(
        db_url,
        "SELECT (detail->>'delay_s')::float8 FROM outbox.journal "
        "WHERE event = 'tool_call.retry_scheduled'",
    )
    assert delay == pytest.approx(RETRY_AFTER_S, abs=0.01)  # not the 0.01 s backoff
    assert tool_call_states(db_url) == {"succeeded": 1}


@pytest.mark.parametrize(
    ("scope", "kw", "words"),
    [
        ("tool", {"max_concurrency": 0}, "at least 1"),
        ("tool", {"max_concurrency": None, "rate": -1.0}, "positive"),
        ("tool", {"max_concurrency": None, "rate": float("nan")}, "positive"),
        ("tenant", {"max_concurrency": 2, "rate": 1.0}, "per tool"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(db_url, scope, kw, words):
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidInput, match=words):
            limits.set_limits(conn, scope, "x", **kw)
        conn.rollback()
        assert limits.in_flight(conn) == []


# -- the command line ----------------------------------------------------------------------


def test_limits_from_the_command_line(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def run(*args: str) -> Any:
        done = runner.invoke(cli.main, [*args, "--json"], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return json.loads(done.output)

    lane = run("tools", "limit", "search", "--max-concurrency", "4", "--rate", "2.5")
    assert (lane["max_concurrency"], lane["rate"]) == (4, 2.5)
    lane = run("tools", "limit", "search", "--rate", "none")  # the other limit stays
    assert (lane["max_concurrency"], lane["rate"]) == (4, None)
    assert run("tenants", "limit", ACME, "--max-concurrency", "7")["max_concurrency"] == 7
    listed = {(r["scope"], r["name"]): r for r in run("limits")}
    assert listed[("tool", "search")]["in_flight"] == 0
    assert listed[("tenant", ACME)]["max_concurrency"] == 7
    run("tools", "limit", "search", "--max-concurrency", "none")
    assert run("tools", "limit", "search")["max_concurrency"] is None
    registered = run("tools", "register", "fetch", "--executor", "client", "--max-concurrency", "3")
    assert registered["limits"]["max_concurrency"] == 3
    with psycopg.connect(db_url) as conn:
        events = [e for (e,) in conn.execute("SELECT event FROM outbox.journal ORDER BY id")]
    assert events.count("lane.limited") == 4 and events.count("lane.unlimited") == 1


@pytest.mark.parametrize(
    "args",
    [
        ["tools", "limit", "search", "--max-concurrency", "0"],
        ["tools", "limit", "search", "--rate", "fast"],
        ["tenants", "limit", ACME, "--max-concurrency", "-2"],
        ["tenants", "limit", ACME, "--rate", "3"],
    ],
)
def test_bad_limits_on_the_command_line_are_usage_errors(db_url, monkeypatch, args):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    done = CliRunner().invoke(cli.main, args)
    assert done.exit_code == 2, done.output
    with psycopg.connect(db_url) as conn:
        assert limits.in_flight(conn) == []


def test_a_tool_at_its_limit_does_not_hold_back_its_tenants_other_tools(db_url):
    """Rows of a tool at its limit are passed over: a later call of another tool of the
    same tenant is in the next claim, ahead of the limited tool's backlog."""
    tool = python_tool(db_url)
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn, registry.ToolSpec(name="busy", executor="python", callable="tests.tooling:echo")
        )
        conn.commit()
    set_limits(db_url, "tool", "busy", max_concurrency=1)
    seed_calls(db_url, ACME, "busy", runs=20, calls=10)  # 200 older calls of the busy tool
    seed_calls(db_url, ACME, tool, runs=1, calls=1)
    worker = Worker(config(db_url))
    link = worker.claim_link()
    try:
        first = worker._claim(link, 10)
        second = worker._claim(link, 10)
        third = worker._claim(link, 10)
    finally:
        link.close()
    # The first claim finds the busy tool free and takes its one place (its oldest rows
    # filled the candidates); from then on its rows are passed over.
    assert [r.tool_name for r in first] == ["busy"]
    assert [r.tool_name for r in second] == [tool]
    assert third == []
    waiting = "SELECT max(attempts) FROM outbox.outbox WHERE status = 'ready'"
    assert scalar(db_url, waiting) == 0  # rows at a limit wait uncharged
