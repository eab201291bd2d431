"""``relay.mcpclient.answered_within``, the bound of a stdio MCP call: an answer that
reached the process before its timeout passed is returned however late the loop reads it,
and a call with no answer is a ``TimeoutError``, cancelled."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from outbox.relay.mcpclient import answered_within


async def relayed_line(reader: asyncio.StreamReader) -> bytes:
    """A line read by one task and handed on through a queue to another, as the SDK hands
    an answer from its reader task to the waiting call."""
    handed: asyncio.Queue[bytes] = asyncio.Queue()

    async def read() -> None:
        await handed.put(await reader.readline())

    task = asyncio.ensure_future(read())
    try:
        return await handed.get()
    finally:
        task.cancel()


def test_an_answer_in_the_pipe_when_the_timeout_passes_is_returned():
    """While the call waits, the other end writes the answer and the loop is held past the
    timeout before it has read a byte (a process paused, and woken with its timers due)."""
    near, far = socket.socketpair()

    def answer_and_hold() -> None:
        far.sendall(b"the answer\n")
        time.sleep(0.8)  # the loop held past the timeout, on purpose

    async def main() -> bytes:
        ours, our_end = await asyncio.open_connection(sock=near)
        asyncio.get_running_loop().call_later(0.05, answer_and_hold)
        try:
            return await answered_within(relayed_line(ours), 0.3)
        finally:
            our_end.close()
            far.close()

    assert asyncio.run(main()) == b"the answer\n"


def test_a_call_without_an_answer_is_a_timeout_and_is_cancelled():
    ended: list[str] = []

    async def never() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    with pytest.raises(TimeoutError):
        asyncio.run(answered_within(never(), 0.2))
    assert ended == ["cancelled"]
