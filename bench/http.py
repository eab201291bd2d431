"""End to end over HTTP, and the latency from an intent's commit to the tool's request.

The tool is the fake service's ``noop`` tool, served by a separate process
(``python -m outbox.testing.tools``), so the relay and the tool server do not share a GIL.
Its own rate is measured with ``CLIENTS`` keep-alive connections per process (or the
bench's ``--concurrency`` when given), a thread each, one ``httpx2`` client per process, so
the ratio says what the relay costs around each call, not what the server can do.

Latency: intents are committed one by one at a fixed rate with NOTIFY on, and the commit
time (taken when ``commit()`` returns) is compared with the tool's own audit timestamp of
the request (``at``); both clocks are this machine's.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import psycopg

from bench import seed
from bench.throughput import Drain, run_timed, start_relay, stop_relay
from outbox import writer

REPO = Path(__file__).resolve().parent.parent


class ToolServer:
    """The fake tool service in its own process."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "outbox.testing.tools", "--port", "0"]
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().decode().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the tool server did not start")

    def endpoint(self, name: str = "noop") -> str:
        return f"{self.url}/tools/{name}"

    def reset(self, name: str = "noop") -> None:
        """Mount a fresh ``name`` tool (empty audit, empty idempotency store)."""
        httpx2.post(f"{self.url}/_tools", json={"name": name, "mode": "key"}).raise_for_status()

    def audit(self, name: str = "noop") -> dict[str, Any]:
        response = httpx2.get(f"{self.url}/_audit", timeout=60)
        response.raise_for_status()
        tools: dict[str, Any] = response.json()["tools"]
        return dict(tools[name])

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- the tool server alone ---------------------------------------------------------------

CLIENTS = 16  # threads per process calling the tool server alone (64 or 256 were slower)
RELAY_CONCURRENCY = 64  # the relays' in-flight calls per process, unless --concurrency says
# The tool server starts a thread per connection: at the relay's own 1000 a process, two
# relay processes held 2,000 of them open and measured that server's threads, not the relay
# (1,150-1,490 calls/s against 2,200-2,800 for one process; 2,300 for two at 64).


def _client_worker(
    endpoint: str, n: int, concurrency: int, prefix: str, ready: Any, go: Any
) -> None:
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx2.Client(limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:

        def call(i: int) -> None:
            headers = {"Idempotency-Key": f"{prefix}-{i}"}
            client.post(endpoint, json={"n": i}, headers=headers, timeout=30).raise_for_status()

        list(pool.map(call, range(min(concurrency, n))))  # open the connections first
        ready.set()
        go.wait()
        list(pool.map(call, range(concurrency, n)))


def server_alone(server: ToolServer, n: int, processes: int, concurrency: int) -> Drain:
    """The rate ``server`` sustains for ``n`` calls with ``processes x concurrency`` clients."""
    server.reset()
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    readies = [context.Event() for _ in range(processes)]
    share = -(-n // processes) + concurrency  # the warm-up calls are not timed
    workers = [
        context.Process(
            target=_client_worker,
            args=(server.endpoint(), share, concurrency, f"p{i}", readies[i], go),
        )
        for i in range(processes)
    ]
    elapsed = run_timed(workers, readies, go)
    return Drain((share - concurrency) * processes, elapsed)


# -- latency -----------------------------------------------------------------------------


def latency(
    url: str, server: ToolServer, intents: int, rate_per_s: float, log_path: Path
) -> dict[str, float]:
    """p50/p99 in ms from an intent's commit to the tool receiving its request."""
    server.reset()
    seed.register_http_tool(url, "noop", server.endpoint(), timeout_s=10)
    with psycopg.connect(url) as conn:
        runs = [seed.start_run(conn, "noop") for _ in range(intents)]
        # The step-1 model turns belong to a model relay, which this bench does not run.
        conn.execute("DELETE FROM outbox.outbox WHERE kind = 'model_turn'")
        conn.commit()
    relay = start_relay(url, 1, None, log_path)
    committed: dict[str, float] = {}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while not conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN outbox_ready%'"
            ).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline or relay.poll() is not None:
                    raise RuntimeError(f"the relay did not start listening; see {log_path}")
                time.sleep(0.05)  # waiting for the relay's LISTEN
        with psycopg.connect(url) as conn:
            started = time.monotonic()
            for i, run in enumerate(runs):
                time.sleep(max(0.0, started + i / rate_per_s - time.monotonic()))  # pacing
                writer.record_model_turn(conn, seed.turn(run, "noop", i, 1))
                conn.commit()
                committed[writer.idempotency_key(run.id, "call_0")] = time.time()
        deadline = time.monotonic() + 60
        while len(server.audit()["deliveries"]) < intents:
            if time.monotonic() > deadline:
                raise RuntimeError("not every intent reached the tool")
            time.sleep(0.2)  # waiting for the last requests
    finally:
        stop_relay(relay)
    delays = sorted(
        (d["at"] - committed[d["key"]]) * 1000.0
        for d in server.audit()["deliveries"]
        if d["key"] in committed
    )
    return {
        "n": float(len(delays)),
        "p50_ms": percentile(delays, 50),
        "p99_ms": percentile(delays, 99),
        "max_ms": delays[-1],
    }


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    rank = max(1, -(-len(values) * pct // 100))
    return values[int(rank) - 1]
