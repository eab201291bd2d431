"""MCP tool calls through the relay's client beside HTTP tool calls doing the same work.

``python -m bench.mcp [--calls N] [--in-flight M] [--latency S]`` starts one server process
(``MCPServer`` of the official SDK over streamable HTTP, with a plain JSON route beside it
that does the same work) and measures, from this process:

- overhead: N calls one after another of a tool that answers at once, through
  ``relay.mcpclient.McpCaller`` (the relay's code path, its session opened once; the dispatch
  mark, a database write, is left out of both) and through ``relay.poster.Poster`` as an
  HTTP tool; p50 and p90 of each, and the difference of the p50s;
- in flight: M calls at once of a tool that answers after S seconds, on one event loop with
  the server's limit at M; the wall time beside the ideal S, the CPU per call of this
  process and of the server's, and the threads this process ran meanwhile (none is
  started per call).

With the server answering each call as an event stream (the SDK's default) and as a JSON
body, and against a server that does nothing but answer (``RAW_SERVER``: the relay's side
without the SDK server's CPU); and, as a baseline, the same calls through the official
SDK's ``ClientSession`` over its streamable HTTP transport (which the relay uses for stdio
servers only). docs/mcp.md has the figures and what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

from mcp_types import RequestParamsMeta

from outbox.mcpservers import META_KEY
from outbox.relay.executors import normalise
from outbox.relay.mcpclient import McpCaller, Server, Session
from outbox.relay.outcomes import Claimed
from outbox.relay.poster import Poster

SERVER = """
import asyncio, sys
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse

app = MCPServer("bench", log_level="WARNING")

@app.tool()
async def work(sleep_s: float = 0.0) -> dict:
    await asyncio.sleep(sleep_s)
    return {"done": True}

@app.custom_route("/tool", methods=["POST"])
async def tool(request: Request) -> JSONResponse:
    body = await request.json()
    await asyncio.sleep(body.get("sleep_s", 0.0))
    return JSONResponse({"done": True})

app.run("streamable-http", port=int(sys.argv[1]), json_response=sys.argv[2] == "json")
"""


# A server that does nothing but answer (streamable HTTP with JSON answers, one session),
# to measure the relay's side without the SDK server's CPU in the wall time.
RAW_SERVER = """
import asyncio, json, sys

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            lines = head.split(b"\\r\\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if lines[0].split()[1] == b"/tool":
                await asyncio.sleep(body.get("sleep_s", 0.0))
                out, kind = b'{"done": true}', b"application/json"
            elif "id" not in body:
                writer.write(b"HTTP/1.1 202 Accepted\\r\\ncontent-length: 0\\r\\n\\r\\n")
                continue
            else:
                if body["method"] == "initialize":
                    result = {"protocolVersion": body["params"]["protocolVersion"],
                              "capabilities": {"tools": {}},
                              "serverInfo": {"name": "raw", "version": "1"}}
                else:
                    await asyncio.sleep(body["params"]["arguments"].get("sleep_s", 0.0))
                    result = {"content": [{"type": "text", "text": '{"done": true}'}],
                              "structuredContent": {"done": True}, "isError": False}
                out = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
                kind = b"application/json"
            head = b"HTTP/1.1 200 OK\\r\\ncontent-type: %s\\r\\nmcp-session-id: raw\\r\\n" % kind
            writer.write(head + b"content-length: %d\\r\\n\\r\\n" % len(out) + out)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await server.serve_forever()

asyncio.run(main())
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _row(i: int, sleep_s: float, server: Server, url: str) -> Claimed:
    return Claimed(
        id=i,
        kind="tool_call",
        tenant_id="bench",
        thread_id=None,
        run_id="00000000-0000-0000-0000-000000000000",
        batch_id=1,
        tool_call_ref=i,
        correlation_id=None,
        attempt=1,
        failures=0,
        max_attempts=1,
        payload=None,
        lag_s=0.0,
        tool_call_id=f"call_{i}",
        tool_name="work",
        arguments={"sleep_s": sleep_s},
        idempotency_key=f"bench-{i}",
        idempotency_mode="key",
        executor="mcp",
        endpoint=url,
        timeout_s=60.0,
        mcp={"tool": "work", "server": {**server.__dict__}},
    )


async def _sdk(port: int, calls: int, n: int, latency_s: float) -> dict[str, Any]:
    """The same calls through the official SDK's ``ClientSession`` over its streamable HTTP
    transport (what the relay used before, and still uses for stdio servers)."""
    server = Server("bench", "bench", "http", url=f"http://127.0.0.1:{port}/mcp", max_concurrency=n)
    session = Session(server, {})
    await session.open()
    assert session.client is not None
    client = session.client

    async def call(sleep_s: float, key: str) -> bool:
        meta = cast(RequestParamsMeta, {META_KEY: {"idempotency_key": key}})
        answer = await client.call_tool("work", {"sleep_s": sleep_s}, meta=meta)
        return not answer.is_error

    for i in range(20):
        await call(0.0, f"warm-{i}")
    took: list[float] = []
    used = time.process_time()
    for i in range(calls):
        started = time.perf_counter()
        assert await call(0.0, f"one-{i}")
        took.append((time.perf_counter() - started) * 1000)
    cpu_ms = (time.process_time() - used) * 1000 / calls
    used, started = time.process_time(), time.perf_counter()
    answers = await asyncio.gather(
        *(call(latency_s, f"many-{i}") for i in range(n)), return_exceptions=True
    )
    wall = time.perf_counter() - started
    await session.close()
    return {
        "p50_ms": round(statistics.median(took), 3),
        "client_cpu_ms_per_call": round(cpu_ms, 3),
        "in_flight": n,
        "wall_s": round(wall, 3),
        "x_ideal": round(wall / latency_s, 3),
        "in_flight_client_cpu_ms_per_call": round((time.process_time() - used) * 1000 / n, 3),
        "failed": sum(a is not True for a in answers),
    }


async def _marked(row: Claimed) -> bool:
    return True


def _headers(row: Claimed) -> dict[str, str]:
    return {"Idempotency-Key": row.idempotency_key or "", "X-Outbox-Tool-Call-Id": "c"}


async def _overhead(port: int, calls: int) -> dict[str, Any]:
    server = Server("bench", "bench", "http", url=f"http://127.0.0.1:{port}/mcp")
    tool_url = f"http://127.0.0.1:{port}/tool"
    caller = McpCaller(_marked)
    poster = Poster()
    mcp_ms: list[float] = []
    http_ms: list[float] = []
    cpu = {"mcp": 0.0, "http": 0.0}
    for i in range(calls + 20):  # the first 20 of each warm up (session, connections)
        row = _row(i, 0.0, server, tool_url)
        started, used = time.perf_counter(), time.process_time()
        outcome = await caller.call(row, None, _headers(row))
        took = (time.perf_counter() - started) * 1000
        assert outcome.status == "ok", outcome.error
        if i >= 20:
            mcp_ms.append(took)
            cpu["mcp"] += time.process_time() - used
        started, used = time.perf_counter(), time.process_time()
        response = await poster.post(
            tool_url, json=row.arguments, headers=_headers(row), timeout=30
        )
        outcome = normalise(row, response)
        took = (time.perf_counter() - started) * 1000
        assert outcome.status == "ok", outcome.error
        if i >= 20:
            http_ms.append(took)
            cpu["http"] += time.process_time() - used
    await caller.sessions.aclose()
    await poster.aclose()

    def pct(values: list[float], q: int) -> float:
        return round(statistics.quantiles(values, n=100)[q - 1], 3)

    return {
        "calls": calls,
        "mcp_p50_ms": pct(mcp_ms, 50),
        "mcp_p90_ms": pct(mcp_ms, 90),
        "http_p50_ms": pct(http_ms, 50),
        "http_p90_ms": pct(http_ms, 90),
        "extra_p50_ms": round(pct(mcp_ms, 50) - pct(http_ms, 50), 3),
        "mcp_client_cpu_ms_per_call": round(cpu["mcp"] * 1000 / calls, 3),
        "http_client_cpu_ms_per_call": round(cpu["http"] * 1000 / calls, 3),
    }


async def _in_flight(port: int, n: int, latency_s: float) -> dict[str, Any]:
    server = Server("bench", "bench", "http", url=f"http://127.0.0.1:{port}/mcp", max_concurrency=n)
    caller = McpCaller(_marked)
    warm = _row(0, 0.0, server, "")
    assert (await caller.call(warm, None, _headers(warm))).status == "ok"
    threads = threading.active_count()
    cpu = time.process_time()
    started = time.perf_counter()
    rows = [_row(i, latency_s, server, "") for i in range(1, n + 1)]
    outcomes = await asyncio.gather(*(caller.call(r, None, _headers(r)) for r in rows))
    wall = time.perf_counter() - started
    cpu_ms = (time.process_time() - cpu) * 1000 / n
    peak_threads = threading.active_count()
    await caller.sessions.aclose()
    failed = [o.error for o in outcomes if o.status != "ok"]
    return {
        "in_flight": n,
        "latency_s": latency_s,
        "wall_s": round(wall, 3),
        "x_ideal": round(wall / latency_s, 3),
        "client_cpu_ms_per_call": round(cpu_ms, 3),
        "failed": len(failed),
        "first_failure": failed[0] if failed else None,
        "threads_before": threads,
        "threads_after": peak_threads,
    }


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(calls: int, in_flight: int, latency_s: float, answers: str = "sse") -> dict[str, Any]:
    """``answers``: how the server answers a call, "sse" (the SDK's default: an event
    stream per request), "json" (a JSON body), or "raw" (JSON bodies from ``RAW_SERVER``,
    not the SDK's)."""
    port = _port()
    script = RAW_SERVER if answers == "raw" else SERVER
    server = subprocess.Popen(
        [sys.executable, "-c", script, str(port), answers],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench MCP server did not start") from None
                time.sleep(0.1)  # the server process is starting
        overhead = asyncio.run(_overhead(port, calls))
        before = _cpu_s(server.pid)
        flight = asyncio.run(_in_flight(port, in_flight, latency_s))
        flight["server_cpu_ms_per_call"] = round(
            (_cpu_s(server.pid) - before) * 1000 / in_flight, 3
        )
        if answers == "raw":  # it lists no tools, which the SDK asks for to check a result
            return {"overhead": overhead, "in_flight": flight}
        sdk = asyncio.run(_sdk(port, calls, in_flight, latency_s))
        return {"overhead": overhead, "in_flight": flight, "sdk_baseline": sdk}
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--servers", default="sse,json,raw", help="of sse, json, raw")
    args = parser.parse_args(argv)
    servers = args.servers.split(",")
    results = {a: run(args.calls, args.in_flight, args.latency, a) for a in servers}
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
