"""``outbox serve`` beside the writer API: what the network surface adds to starting a run.

Three ways to start the same run (a thread, a user message, a queued model turn), each
``runs`` times one after the other on one scratch database, in the same process run:

- **writer**: ``writer.create_thread`` + ``writer.start_run`` and a commit, on a connection
  kept open (what a Python backend does);
- **api**: ``POST /v1/threads/runs`` (create-and-run) to a live ``outbox serve`` on loopback,
  time to the JSON answer;
- **api stream**: the same with ``stream=true``, time to the first SSE event
  (``thread.created``), as a client that streams the run sees it.

No relay runs: the model turn stays queued, so only the surface is measured. The target:
the API adds under 5 ms p50 to the writer. ``python -m bench.serve [RUNS]``
runs it alone on the embedded server.
"""

from __future__ import annotations

import socket
import statistics
import sys
import threading
import time
from typing import Any

import httpx2
import psycopg
import uvicorn

from bench import db as bdb
from bench.throughput import stderr
from outbox import db, keys, writer
from outbox.schemas import StartRun
from outbox.server.app import create_app

TENANT = "bench"
MODEL = "bench-model"
START_TIMEOUT_S = 20.0


def measure(server: str, runs: int) -> dict[str, Any]:
    with bdb.scratch(server, "serve") as url:
        with psycopg.connect(url) as conn:
            _, key = keys.create_key(conn, TENANT, name="bench")
            conn.commit()
        out: dict[str, Any] = {"runs": runs}
        out["writer"] = _writer(url, runs)
        with _serving(url) as base:
            headers = {"Authorization": f"Bearer {key}", "OpenAI-Beta": "assistants=v2"}
            with httpx2.Client(base_url=base, headers=headers, timeout=30.0) as client:
                made = client.post("/assistants", json={"model": MODEL})
                assistant = made.raise_for_status().json()["id"]
                out["api"] = _api(client, assistant, runs, stream=False)
                out["api_stream"] = _api(client, assistant, runs, stream=True)
        out["api_adds_p50_ms"] = out["api"]["p50_ms"] - out["writer"]["p50_ms"]
    return out


def _summary(samples: list[float], wall_s: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "per_s": len(samples) / wall_s,
    }


def _writer(url: str, runs: int) -> dict[str, float]:
    samples = []
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        for n in range(runs):
            t0 = time.perf_counter()
            thread = writer.create_thread(conn, TENANT)
            writer.start_run(
                conn,
                StartRun(tenant_id=TENANT, thread_id=thread.id, model=MODEL, message=f"hi {n}"),
            )
            conn.commit()
            samples.append(time.perf_counter() - t0)
        return _summary(samples, time.perf_counter() - started)


def _api(client: httpx2.Client, assistant: str, runs: int, *, stream: bool) -> dict[str, float]:
    samples = []
    started = time.perf_counter()
    for n in range(runs):
        body = {
            "assistant_id": assistant,
            "model": MODEL,
            "thread": {"messages": [{"role": "user", "content": f"hi {n}"}]},
            "stream": stream,
        }
        t0 = time.perf_counter()
        if stream:
            with client.stream("POST", "/threads/runs", json=body) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        samples.append(time.perf_counter() - t0)
                        break
        else:
            client.post("/threads/runs", json=body).raise_for_status()
            samples.append(time.perf_counter() - t0)
    return _summary(samples, time.perf_counter() - started)


class _serving:
    """``outbox serve``'s app under uvicorn on a free loopback port, in a thread."""

    def __init__(self, url: str, *, listen: bool = True) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            create_app(url, listen=listen), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="bench-serve")

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("outbox serve did not start")
            time.sleep(0.02)  # polling a condition with a deadline
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def run(server: str, runs: int) -> dict[str, Any]:
    stderr(f"outbox serve beside the writer API: {runs} runs each")
    out = measure(server, runs)
    stderr(
        f"  start a run: writer p50 {out['writer']['p50_ms']:.1f} ms, api p50 "
        f"{out['api']['p50_ms']:.1f} ms, first SSE event p50 {out['api_stream']['p50_ms']:.1f} ms"
    )
    return out


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 500
    out = run(db.database_url(start=True), runs)
    for name in ("writer", "api", "api_stream"):
        row = out[name]
        print(
            f"{name:<11} p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:6.1f} ms  "
            f"{row['per_s']:6.0f} runs/s"
        )
    print(f"the API adds {out['api_adds_p50_ms']:.1f} ms p50")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
