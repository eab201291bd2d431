"""The engine's HTTP client shards: idle clients are closed, a client in use never is."""

from __future__ import annotations

import asyncio
import contextlib
import time

from relay.engine import IDLE_CLIENT_S, Shards
from relay.poster import SHARD_CONNECTIONS


class Client:
    def __init__(self) -> None:
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


def test_a_client_is_closed_once_idle_and_made_again_when_needed() -> None:
    async def scenario() -> None:
        shards = Shards(3, Client)
        async with shards.acquire() as first:
            pass
        assert await shards.close_idle(time.monotonic()) == 0  # freed just now
        assert await shards.close_idle(time.monotonic() + IDLE_CLIENT_S + 1) == 1
        assert first.closed and shards.clients == [None, None, None]
        async with shards.acquire() as again:
            assert again is not first and not again.closed

    asyncio.run(scenario())


def test_a_client_with_a_place_taken_is_never_closed() -> None:
    async def scenario() -> None:
        shards = Shards(1, Client)
        later = time.monotonic() + IDLE_CLIENT_S + 1
        async with shards.acquire() as busy:
            async with shards.acquire():
                pass  # a place of the same client freed: the client is still in use
            assert await shards.close_idle(later) == 0
            assert not busy.closed
        assert await shards.close_idle(time.monotonic() + IDLE_CLIENT_S + 1) == 1
        assert busy.closed

    asyncio.run(scenario())


def test_more_requests_than_planned_add_clients_that_are_swept_too() -> None:
    async def scenario() -> None:
        shards = Shards(1, Client)
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(shards.acquire())
                for _ in range(SHARD_CONNECTIONS + 1)
            ]
            assert len({id(c) for c in clients}) == 2
        assert await shards.close_idle(time.monotonic() + IDLE_CLIENT_S + 1) == 2
        assert all(c.closed for c in clients)

    asyncio.run(scenario())
