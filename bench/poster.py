"""CPU per request of the relay's HTTP client beside ``httpx2.AsyncClient``.

``python -m bench.poster [--requests N] [--at-once C]`` sends N POSTs, C at once, to the
tool route of ``bench.latency_server`` (its own process, 50 ms per answer, so requests
overlap as the relay's do), first through ``relay.poster.Poster`` and then through
``httpx2.AsyncClient``, interleaved twice, and prints this process's CPU per request
(``time.process_time``: user and system, every thread) for each. A warm-up round opens
the connections first, so what is counted is requests on kept-alive connections, as in
the relay under load. The answers are read as JSON, as the executors read them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import httpx2

from bench import report
from bench.inflight import LatencyServer
from outbox.relay.poster import Poster

ANSWER_S = 0.05  # the tool's latency: enough for C requests to be open at once
ROUNDS = 2  # each client measured this many times, interleaved


async def _send(post: Any, url: str, n: int, at_once: int) -> float:
    """CPU seconds per request for ``n`` POSTs through ``post``, ``at_once`` at a time."""

    async def one_by_one(count: int, worker: int) -> None:
        for i in range(count):
            response = await post(
                url,
                json={"worker": worker, "i": i, "pad": "x" * 200},
                headers={"idempotency-key": f"{worker}-{i}-{time.monotonic_ns()}"},
                timeout=30,
            )
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            response.json()

    await asyncio.gather(*(one_by_one(2, w) for w in range(at_once)))  # connections opened
    started = time.process_time()
    await asyncio.gather(*(one_by_one(n // at_once, w) for w in range(at_once)))
    return (time.process_time() - started) / (n // at_once * at_once)


async def _measure(url: str, n: int, at_once: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"relay.poster": [], "httpx2.AsyncClient": []}
    for _ in range(ROUNDS):
        poster = Poster()
        try:
            figures["relay.poster"].append(await _send(poster.post, url, n, at_once))
        finally:
            await poster.aclose()
        limits = httpx2.Limits(max_connections=at_once, max_keepalive_connections=at_once)
        async with httpx2.AsyncClient(limits=limits) as client:
            figures["httpx2.AsyncClient"].append(await _send(client.post, url, n, at_once))
    return figures


def run(n: int, at_once: int) -> dict[str, Any]:
    """The figures for ``make bench``: CPU milliseconds per request, per client and round."""
    at_once = max(1, min(at_once, n))
    server = LatencyServer(0.0, ANSWER_S, 1)
    try:
        figures = asyncio.run(_measure(server.url + "/tools/slow", n, at_once))
    finally:
        server.close()
    cpu_ms = {client: [round(1000 * v, 3) for v in values] for client, values in figures.items()}
    return {"requests": n, "at_once": at_once, "cpu_ms": cpu_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.poster", description=__doc__)
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--at-once", type=int, default=400)
    args = parser.parse_args(argv)
    print("\n".join(report.poster_lines(run(args.requests, args.at_once))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
