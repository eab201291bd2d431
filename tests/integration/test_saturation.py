"""A relay whose places are all busy while rows are due says so.

A fixed `--concurrency` of 1,000 once made 10,000 runs take six times as long as they
needed, and the relay said nothing. Here a relay process with 2 places and slow tools has
more due calls than places: it logs `relay.saturated` naming `--concurrency`, and its
metrics show the gauge at 1; once the queue is drained, the saturation is over.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import psycopg
import pytest

from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import (
    FAST,
    all_settled,
    register_tool,
    seed,
    start_relay_process,
    wait_until,
)

PLACES = 2
CALLS = 6  # three times the places: four wait while two run
TOOL_S = 1.5  # seconds each call takes


@pytest.fixture
def slow_tool(db_url: str) -> Iterator[FakeToolService]:
    with FakeToolService() as service:
        service.add_tool("slow", "key").latency(TOOL_S, n=None)
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "slow", "key", timeout_s=30)
            conn.commit()
        yield service


def metric(port: int, name: str) -> float | None:
    for line in httpx2.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def events(log_text: str, event: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log_text.splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == event]


def test_a_relay_with_every_place_busy_while_rows_wait_says_so(db_url, slow_tool, tmp_path):
    seed(db_url, ["slow"], runs=CALLS, calls_per_batch=1, args=lambda n: {"n": n})
    port = free_port()
    log = tmp_path / "relay.log"
    # One tenant: at the default --tenant-share its rows could hold 1 of the 2 places only.
    relay = start_relay_process(
        db_url, log, "--concurrency", str(PLACES), "--tenant-share", "1",
        "--metrics-port", str(port), "--log-level", "INFO", *FAST,
    )  # fmt: skip
    try:
        wait_until(
            lambda: events(log.read_text(), "relay.saturated") or relay.poll() is not None,
            what="the relay to say its places are all busy",
        )
        assert relay.poll() is None, log.read_text()
        saturated = events(log.read_text(), "relay.saturated")[0]
        assert saturated["concurrency"] == PLACES and saturated["in_flight"] == PLACES
        assert saturated["worker"] and "--concurrency" in str(saturated["hint"])
        assert metric(port, "outbox_relay_saturated") == 1.0
        assert metric(port, "outbox_relay_concurrency") == PLACES

        wait_until(lambda: all_settled(db_url), what="every call to be done")
        wait_until(
            lambda: metric(port, "outbox_relay_saturated") == 0.0,
            what="the saturation to be over once nothing waits",
        )
        assert metric(port, "outbox_relay_saturated_seconds_total") > 0
    finally:
        relay.terminate()
        relay.wait(timeout=30)
    assert len(events(log.read_text(), "relay.saturated")) == 1  # once a minute at most
    assert events(log.read_text(), "relay.saturation_ended")
    assert len(slow_tool.tool("slow").effects) == CALLS
