"""A scripted model and a tool that take their time: thousands of requests open at once.

``python -m bench.latency_server --model-latency M --tool-latency T --calls K`` serves, on
one asyncio event loop (HTTP/1.1 with keep-alive, idle connections closed after
``KEEP_ALIVE_S``, parsed by ``h11``):

- ``POST /v1/responses`` (the OpenAI Responses API): after ``M`` seconds, a turn asking for
  ``K`` parallel calls of the tool ``slow`` when the input holds no tool output yet, else a
  final text. The relay's agent loop is thus model turn -> K tool calls -> model turn;
- ``POST /tools/slow``: after ``T`` seconds, ``{"ok": true}``; each ``Idempotency-Key`` is
  counted, so a call performed twice shows up as a duplicate;
- ``GET /_stats``: requests served, the most open at once (per route) and duplicates.

It prints its base URL on stdout once listening. A waiting request costs a coroutine and
a socket, no thread, so it can hold as many as the relay sends (the point of the bench).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import h11

BACKLOG = 4096  # pending connections the kernel may queue (net.core.somaxconn here)
# An idle keep-alive connection is closed after this long, as uvicorn does (5 s) and nginx
# (75 s): without it every connection a client ever opened stayed open, and at 10,000 runs
# in flight the server ran out of file descriptors.
KEEP_ALIVE_S = 5.0


@dataclass
class Stats:
    model_requests: int = 0
    tool_requests: int = 0
    open_model: int = 0
    open_tool: int = 0
    max_open_model: int = 0
    max_open_tool: int = 0
    keys: collections.Counter[str] = field(default_factory=collections.Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "model_requests": self.model_requests,
            "tool_requests": self.tool_requests,
            "max_open_model": self.max_open_model,
            "max_open_tool": self.max_open_tool,
            "duplicate_effects": sum(n - 1 for n in self.keys.values() if n > 1),
        }


class Server:
    def __init__(self, model_s: float, tool_s: float, calls: int) -> None:
        self.model_s = model_s
        self.tool_s = tool_s
        self.calls = calls
        self.stats = Stats()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read_request(conn, reader)
                if request is None:
                    return
                status, payload = await self.handle(request, body)
                data = json.dumps(payload).encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
                writer.write(conn.send(h11.Data(data=data)))
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError):
            return
        finally:
            writer.close()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if request is None:  # between requests: an idle keep-alive connection
                    try:
                        async with asyncio.timeout(KEEP_ALIVE_S):
                            data = await reader.read(65536)
                    except TimeoutError:
                        return None, b""
                else:
                    data = await reader.read(65536)
                conn.receive_data(data)
                if not data and request is None:
                    return None, b""
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def handle(self, request: h11.Request, body: bytes) -> tuple[int, Any]:
        path = request.target.decode()
        if path == "/v1/responses":
            return 200, await self.model(json.loads(body))
        if path.startswith("/tools/"):
            key = dict(request.headers).get(b"idempotency-key", b"").decode()
            return 200, await self.tool(key)
        if path == "/_stats":
            return 200, self.stats.as_json()
        return 404, {"error": {"message": f"no route {path}"}}

    async def model(self, body: dict[str, Any]) -> dict[str, Any]:
        s = self.stats
        s.model_requests += 1
        s.open_model += 1
        s.max_open_model = max(s.max_open_model, s.open_model)
        try:
            await asyncio.sleep(self.model_s)
        finally:
            s.open_model -= 1
        answered = any(
            isinstance(item, dict) and item.get("type") == "function_call_output"
            for item in body.get("input", [])
        )
        if answered:
            output = [
                {
                    "type": "message",
                    "id": "msg_" + uuid.uuid4().hex,
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            ]
        else:
            output = [
                {
                    "type": "function_call",
                    "id": "fc_" + uuid.uuid4().hex,
                    "call_id": "call_" + uuid.uuid4().hex,
                    "name": "slow",
                    "arguments": json.dumps({"i": i}),
                    "status": "completed",
                }
                for i in range(self.calls)
            ]
        return {
            "id": "resp_" + uuid.uuid4().hex,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 15,
            },
        }

    async def tool(self, key: str) -> dict[str, Any]:
        s = self.stats
        s.tool_requests += 1
        s.keys[key] += 1
        s.open_tool += 1
        s.max_open_tool = max(s.max_open_tool, s.open_tool)
        try:
            await asyncio.sleep(self.tool_s)
        finally:
            s.open_tool -= 1
        return {"ok": True}


async def serve(args: argparse.Namespace) -> None:
    server = Server(args.model_latency, args.tool_latency, args.calls)
    listener = await asyncio.start_server(
        server.connection, "127.0.0.1", args.port, backlog=BACKLOG
    )
    port = listener.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_server", description=__doc__)
    parser.add_argument("--model-latency", type=float, default=2.0, help="seconds per turn")
    parser.add_argument("--tool-latency", type=float, default=0.5, help="seconds per call")
    parser.add_argument("--calls", type=int, default=2, help="parallel tool calls per turn")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one socket per open request
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
