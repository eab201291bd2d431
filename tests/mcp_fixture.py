"""A small MCP server built with the official SDK (``MCPServer``), for the tests to call.

Run as ``python tests/mcp_fixture.py http PORT AUDIT`` (streamable HTTP on 127.0.0.1, each
answer an event stream), ``python tests/mcp_fixture.py http-json PORT AUDIT`` (each answer a
JSON body) or ``python tests/mcp_fixture.py stdio AUDIT``. Every call a tool receives is
appended to the file AUDIT as one JSON line, written before the tool acts and flushed to
disk, so a test can count what the server saw even when a relay or the server is killed
mid-call: the tool, its arguments, the ``_meta`` it came with, the ``Idempotency-Key``
header (HTTP) and this process's id.

Its tools and their annotations:

- ``create_ticket(title, hold_s=0)``: an effect that is neither read-only nor idempotent;
  ``hold_s`` keeps the call open that long after it is recorded. It logs a line to the
  client first (a ``notifications/message`` ahead of the answer on its event stream).
- ``read_ticket(title, hold_s=0)``: read-only; held only the first time a call arrives.
- ``set_label(label)``: idempotent, and deduplicated here by the key of ``_meta`` the way
  docs/mcp.md tells server authors to: a key seen before returns the first answer
  (``hold_s`` as for ``create_ticket``).
- ``reject(reason)``: answers ``isError: true``.
- ``big(size)``: a text of ``size`` characters.
- ``echo_auth()``: answers with the ``Authorization`` header it was sent.
- ``die()``: the process exits mid-call (the server's death).
- ``whoami()``: this process's id.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

META_KEY = "agent-outbox/call"
AUDIT = sys.argv[-1]
app = MCPServer("outbox-test-fixture", log_level="WARNING")
labels: dict[str, str] = {}  # idempotency key -> the label's answer
in_flight = [0]


def audit(tool: str, ctx: Context, **arguments: Any) -> dict[str, Any]:
    meta = dict(ctx.request_context.meta or {})
    headers = ctx.headers or {}
    line = {
        "tool": tool,
        "arguments": arguments,
        "meta": meta,
        "idempotency_key_header": headers.get("idempotency-key"),
        "pid": os.getpid(),
        "in_flight": in_flight[0],  # calls of create_ticket open here when this one arrived
    }
    with open(AUDIT, "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return meta


def received(meta: dict[str, Any]) -> int:
    """How many times this server (this process or an earlier one) received the call."""
    key = (meta.get(META_KEY) or {}).get("idempotency_key")
    with open(AUDIT) as f:
        lines = [json.loads(line) for line in f]
    return sum(
        1 for line in lines if (line["meta"].get(META_KEY) or {}).get("idempotency_key") == key
    )


@app.tool(
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False)
)
async def create_ticket(title: str, ctx: Context, hold_s: float = 0.0) -> dict[str, Any]:
    """Open a ticket titled TITLE."""
    in_flight[0] += 1
    try:
        audit("create_ticket", ctx, title=title, hold_s=hold_s)
        await ctx.info(f"opening {title}")  # a notification on the answer's stream before it
        await asyncio.sleep(hold_s)
    finally:
        in_flight[0] -= 1
    return {"ticket": title}


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def read_ticket(title: str, ctx: Context, hold_s: float = 0.0) -> str:
    """Read the ticket titled TITLE (held ``hold_s`` the first time a call is received)."""
    meta = audit("read_ticket", ctx, title=title, hold_s=hold_s)
    if received(meta) == 1:
        await asyncio.sleep(hold_s)
    return f"ticket {title}: open"


@app.tool(
    annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=False)
)
async def set_label(label: str, ctx: Context, hold_s: float = 0.0) -> str:
    """Set the label (deduplicated by the caller's idempotency key)."""
    meta = audit("set_label", ctx, label=label, hold_s=hold_s)
    key = (meta.get(META_KEY) or {}).get("idempotency_key")
    if key is not None and key in labels:
        return labels[key]
    answer = f"label {label} set"
    if key is not None:
        labels[key] = answer
    await asyncio.sleep(hold_s)
    return answer


@app.tool()
async def reject(reason: str, ctx: Context) -> str:
    """Always refuses, saying REASON."""
    audit("reject", ctx, reason=reason)
    raise ToolError(f"refused: {reason}")


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def big(size: int, ctx: Context) -> str:
    """A text of SIZE characters."""
    audit("big", ctx, size=size)
    return "x" * size


@app.tool()
async def die(ctx: Context) -> str:
    """The server exits in the middle of the call."""
    audit("die", ctx)
    os._exit(3)


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def echo_auth(ctx: Context) -> str:
    """The Authorization header this call came with (a tool that leaks its credential)."""
    audit("echo_auth", ctx)
    return f"I was sent {(ctx.headers or {}).get('authorization')}"


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def whoami(ctx: Context) -> int:
    """This server process's id."""
    audit("whoami", ctx)
    return os.getpid()


if __name__ == "__main__":
    if sys.argv[1].startswith("http"):
        app.run("streamable-http", port=int(sys.argv[2]), json_response=sys.argv[1] == "http-json")
    else:
        app.run("stdio")
