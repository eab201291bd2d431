"""What a model turn keeps while it waits for its answer, against a real server on loopback.

A run in flight spends most of its life waiting for its model (seconds to minutes, with
thousands of others), so the history and the tools it posted must not be held by anything
once its request is encoded: not the prepared turn, not the frames awaiting the answer,
whether or not its run compacts (a context-length refusal reads them again:
``relay.compaction``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
import weakref
from typing import Any

from outbox import context
from outbox.relay import compaction
from outbox.relay.model_turns import ModelServer
from outbox.relay.poster import Poster
from outbox.relay.preparer import Turn

RUN = {
    "id": uuid.uuid4(),
    "tenant_id": "acme",
    "thread_id": uuid.uuid4(),
    "api": "chat",
    "model": "gpt-5",
    "instructions": "Be brief.",
}
ANSWER = {
    "id": "cmpl_1",
    "choices": [{"message": {"role": "assistant", "content": "done"}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 1},
}


class Watched(dict[str, Any]):
    """A history message or a tool that can be watched with a weak reference (a dict
    cannot)."""


def awaited_locals(task: asyncio.Task[Any]) -> list[Any]:
    """The local variables of every frame of ``task``'s chain of awaits, outermost first."""
    found = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None)
        if frame is not None:
            found += list(frame.f_locals.values())
        awaited = getattr(awaited, "cr_await", None)
    return found


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """The coroutines of ``task``'s chain of awaits, outermost first."""
    names = []
    awaited: Any = task.get_coro()
    while getattr(awaited, "cr_frame", None) is not None:
        names.append(awaited.__qualname__)
        awaited = awaited.cr_await
    return names


def request_parts(values: list[Any]) -> list[Any]:
    """Of ``values``, the request's encoded parts: its bytes (the body holds the history's
    ``"hi"``) and its headers (a dict with ``authorization``)."""
    return [
        value
        for value in values
        if (isinstance(value, bytes | bytearray) and b'"hi"' in value)
        or (isinstance(value, dict) and "authorization" in value)
        or (isinstance(value, list) and any(isinstance(v, bytes) for v in value))
    ]


async def held_while_waiting(window: context.Window | None) -> list[bool]:
    """Whether the turn's history or its tools are still alive while its model holds the
    answer back; and that no frame awaiting the answer holds the request's bytes or
    headers (what it sent, encoded)."""
    received = asyncio.Event()
    release = asyncio.Event()

    async def model(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert json.loads(await reader.readexactly(length))["messages"][-1]["content"] == "hi"
        received.set()
        await release.wait()
        body = json.dumps(ANSWER).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(model, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    poster = Poster()
    try:
        message = Watched(role="user", content="hi")
        tool = Watched(name="lookup", description="finds", json_schema={"type": "object"})
        watched = [weakref.ref(message), weakref.ref(tool)]
        run = {**RUN, "base_url": f"http://127.0.0.1:{port}/v1"}
        turn = Turn(run, [message], {"lookup": tool}, None, window)
        del message, tool
        models = ModelServer(poster, f"http://127.0.0.1:{port}/v1", "key")

        async def again() -> Turn:
            raise AssertionError("read again without a refusal")

        call = asyncio.create_task(compaction.call(models.post, turn, 1, again))
        await asyncio.wait_for(received.wait(), 10)
        gc.collect()
        held = [ref() is not None for ref in watched]
        assert request_parts(awaited_locals(call)) == []
        # The poster awaits the answer's future itself: each coroutine is a frame more,
        # kept by every request in flight.
        assert awaiting(call)[-1] == "Poster.post"
        release.set()
        answer, compacted = await asyncio.wait_for(call, 10)
        assert (answer.content, compacted) == ("done", None)
        return held
    finally:
        await poster.aclose()
        server.close()


def test_a_waiting_turn_holds_neither_its_history_nor_its_tools():
    assert asyncio.run(held_while_waiting(None)) == [False, False]
    window = context.Window(budget=100_000, mode="last_messages")
    assert asyncio.run(held_while_waiting(window)) == [False, False]


def test_a_turn_that_may_be_compacted_holds_them_no_more():
    window = context.Window(budget=100_000, mode="compact")
    assert asyncio.run(held_while_waiting(window)) == [False, False]
