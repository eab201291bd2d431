"""An MCP server built with the official SDK's low-level ``Server`` (not ``MCPServer``, which
derives every schema from a function's signature and so cannot list a bad one) whose
``tools/list`` gives one tool a valid input schema and one an input schema that is not JSON
Schema (a ``minimum`` that is a string). Run as ``python tests/mcp_bad_schema.py`` (stdio).

``add(a, b)`` answers the sum; ``broken(n)`` answers ``n``, should anything call it.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOLS = [
    types.Tool(
        name="add",
        description="Add two numbers.",
        input_schema={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    ),
    types.Tool(
        name="broken",
        description="A tool whose input schema is not JSON Schema.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": "zero"}},
        },
    ),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    found = arguments["a"] + arguments["b"] if params.name == "add" else arguments.get("n")
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(found))])


server = Server("bad-schema", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
