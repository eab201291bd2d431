"""A POST through ``httpx2``'s transport: what the relay's effects send, at the least CPU.

Every model turn and HTTP tool call of a relay process is a request on its one event
loop, so each request's CPU is the relay's throughput. ``httpx2.AsyncClient.post`` spends
about a fifth of a request's CPU in layers the relay does not use (URL merging, auth,
redirects, cookies, event hooks), and the ``openai`` SDK's client on top of it as much
again for a model call (measured: about 2.0 ms per request through the client, 3.0 ms
through the SDK, 1.6 ms through the transport, on this 2-core machine under load).
``Poster`` builds the ``httpx2.Request`` and hands it to the transport: the answer is the
``httpx2.Response`` ``AsyncClient.post`` gives (read whole) and the errors are its errors
(``httpx2.HTTPError`` and kin), so the executors' failure classes are unchanged.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx2

SHARD_CONNECTIONS = 4  # connections per pool (relay.engine.Shards says why so few)
TLS = ssl.create_default_context()  # shared: a context per pool took milliseconds to build


class Poster:
    """POSTs through one ``httpx2.AsyncHTTPTransport`` (a pool of ``SHARD_CONNECTIONS``):
    ``AsyncClient.post``'s answer (an ``httpx2.Response``, read whole) and its errors
    (``httpx2.HTTPError`` and kin), without the client's layers."""

    def __init__(self) -> None:
        limits = httpx2.Limits(
            max_connections=SHARD_CONNECTIONS, max_keepalive_connections=SHARD_CONNECTIONS
        )
        self.transport = httpx2.AsyncHTTPTransport(verify=TLS, limits=limits)

    async def post(
        self,
        url: str,
        *,
        timeout: float,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx2.Response:
        """``timeout`` (seconds) bounds each phase: connect, write, each read, pool wait."""
        phases = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        request = httpx2.Request(
            "POST",
            url,
            json=json,
            content=content,
            headers=headers,
            extensions={"timeout": phases},
        )
        response = await self.transport.handle_async_request(request)
        response.request = request
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()
