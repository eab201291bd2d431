"""The server's queue deadline (server.thread_pool), without a database: a request's first
call that may write is refused once it waited past the timeout, never a later one, and
a key's look-up does not count as a start; each request starts afresh, whatever context
its task inherited."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from outbox.server import thread_pool
from outbox.server.access import AccessLog
from outbox.server.db_pool import DB_CONNECTIONS

TIMEOUT_S = 0.05


class Turn:
    """Where a request stops before its last call: ``await turn()`` says its first calls
    are done, then waits until the thread is held."""

    def __init__(self, go: asyncio.Event) -> None:
        self.prepared, self.go = asyncio.Event(), go

    async def __call__(self) -> None:
        self.prepared.set()
        await self.go.wait()


Request = Callable[[Turn], Awaitable[str]]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One thread and a short timeout; the defaults again afterwards."""
    thread_pool.size(1)
    thread_pool.queue_timeout(TIMEOUT_S)
    yield
    thread_pool.size(DB_CONNECTIONS)
    thread_pool.queue_timeout(thread_pool.QUEUE_TIMEOUT_S)


async def last_calls_held(requests: list[Request]) -> list[Any]:
    """Each request in a task of its own: its first calls run on the free thread, then its
    last call queues behind a held thread past the timeout. What each returned or raised."""
    go, holding, gate = asyncio.Event(), threading.Event(), threading.Event()
    turns = [Turn(go) for _ in requests]
    # The first calls share the one thread too: on a slow machine one of them could wait
    # past the short timeout, be refused, and never reach its turn. Only the last calls
    # are the ones under test, so only they are queued under it (a call keeps the timeout
    # of when it queued).
    thread_pool.queue_timeout(60)
    tasks = [asyncio.ensure_future(r(t)) for r, t in zip(requests, turns, strict=True)]

    def hold() -> None:
        holding.set()
        gate.wait()

    try:
        for turn in turns:
            await turn.prepared.wait()
        held = asyncio.ensure_future(thread_pool.in_thread(hold))
        await _until(holding.is_set)
        thread_pool.queue_timeout(TIMEOUT_S)
        go.set()
        await _until(lambda: thread_pool._waiting == len(requests))
        await asyncio.sleep(TIMEOUT_S * 3)  # the time the feature is about
    finally:
        gate.set()  # never leave the thread held: the interpreter would wait for it
    await held
    return await asyncio.gather(*tasks, return_exceptions=True)


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the calls did not queue"
        await asyncio.sleep(0.002)


async def wrote_then_reads(turn: Turn) -> str:
    await thread_pool.in_thread(lambda: "wrote")
    await turn()
    return await thread_pool.in_thread(lambda: "read")


async def looked_up_then_writes(turn: Turn) -> str:
    await thread_pool.read_in_thread(lambda: "key")
    await turn()
    return await thread_pool.in_thread(lambda: "wrote")


async def writes(turn: Turn) -> str:
    await turn()
    return await thread_pool.in_thread(lambda: "wrote")


async def wrote_then_a_new_request_writes(turn: Turn) -> str:
    await thread_pool.in_thread(lambda: "wrote")
    thread_pool.new_request(no_message)  # the next request on this task's context (pipelined)
    await turn()
    return await thread_pool.in_thread(lambda: "wrote")


async def no_message() -> Any:
    await asyncio.Event().wait()  # a client that neither sends nor leaves


def test_only_a_requests_first_call_that_may_write_is_shed():
    requests = [wrote_then_reads, looked_up_then_writes, writes, wrote_then_a_new_request_writes]
    ended = asyncio.run(last_calls_held(requests))
    assert ended[0] == "read"  # it wrote: never refused, however long it waited
    for refused in ended[1:]:
        assert isinstance(refused, thread_pool.ServerBusy)
        assert refused.waited_s > TIMEOUT_S and refused.retry_after_s >= 1.0


def test_each_request_starts_with_nothing_begun_whatever_its_task_inherited():
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(thread_pool._begun.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def one_request_after_another() -> bool:
        thread_pool.begun()  # as the request before on the same connection left it

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(_message: Any) -> None:
            return None

        scope = {"type": "http", "method": "GET", "path": "/v1/x", "headers": []}
        await AccessLog(app)(scope, receive, send)
        return thread_pool._begun.get()

    assert asyncio.run(one_request_after_another()) is True  # its own, given back after
    assert seen == [False]


def test_a_request_whose_client_left_while_it_queued_is_dropped_and_its_call_never_runs():
    """The client's disconnect, the next message after the body, is seen while the call
    queues behind a held thread (no timeout: that is another rule)."""
    thread_pool.queue_timeout(60)
    ran: list[str] = []

    async def scenario() -> tuple[Any, Any]:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await messages.put({"type": "http.request", "body": b"{}", "more_body": False})
        holding, gate = threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            gate.wait()

        held = asyncio.ensure_future(thread_pool.in_thread(hold))
        await _until(holding.is_set)
        try:

            async def leaving() -> str:
                _tokens, receive = thread_pool.new_request(messages.get)
                await receive()  # the body
                return await thread_pool.in_thread(lambda: ran.append("left") or "ran")

            async def staying() -> str:
                thread_pool.new_request(no_message)
                return await thread_pool.in_thread(lambda: ran.append("stayed") or "ran")

            left = asyncio.ensure_future(leaving())
            stayed = asyncio.ensure_future(staying())
            await _until(lambda: thread_pool._waiting == 2)
            await messages.put({"type": "http.disconnect"})
            await _until(lambda: messages.empty())  # the watcher took it
        finally:
            gate.set()
        await held
        return tuple(await asyncio.gather(left, stayed, return_exceptions=True))  # type: ignore[return-value]

    left, stayed = asyncio.run(scenario())
    assert isinstance(left, thread_pool.ClientGone)
    assert stayed == "ran" and ran == ["stayed"]
