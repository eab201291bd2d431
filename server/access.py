"""The access log: one structured line per request (``api.request``), with the identities
every log line of the product carries (``outbox.logs``).

The tenant is the API key's (set by ``routes.tenant`` once the key is known; null for a
request refused before that); thread and run come from the path. The request id is the
caller's ``X-Request-Id`` or a new one, sent back in that header (OpenAI's SDK shows it on
errors) and logged as the correlation id. A streamed response is logged when its stream
ends, with how long it lasted.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outbox.logs import log
from outbox.server import errors, thread_pool

logger = logging.getLogger("server.access")
HEADER = b"x-request-id"
MAX_REQUEST_ID = 200  # characters of a caller's request id kept


class AccessLog:
    """ASGI middleware: log each HTTP request once it is answered. The outermost: it also
    starts each request as one of which nothing has begun (``thread_pool.new_request``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Whatever context its task started in (server.thread_pool); the app reads its client
        # through the queue's watch on it.
        fresh, receive = thread_pool.new_request(receive)
        given = dict(scope["headers"]).get(HEADER, b"").decode("latin-1")[:MAX_REQUEST_ID]
        request_id = given or f"req_{uuid.uuid4().hex}"
        # Handlers journal what they change under this id (routes.request_id): the journal
        # event and this log line, which names the key's tenant, find each other.
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        begun = False

        async def answer(message: Message) -> None:
            nonlocal status, begun
            if message["type"] == "http.response.start":
                begun = True
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0] != HEADER]
                message["headers"] = [*headers, (HEADER, request_id.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, answer)
        except Exception as exc:
            if begun:
                raise
            response = await errors.unexpected_error(Request(scope), exc)
            await response(scope, receive, answer)
        finally:
            thread_pool.end_request(fresh)
            params: dict[str, Any] = scope.get("path_params", {})
            log(
                logger,
                logging.INFO,
                "api.request",
                tenant_id=scope.get("state", {}).get("tenant_id"),
                thread_id=params.get("thread_id"),
                run_id=params.get("run_id"),
                correlation_id=request_id,
                method=scope["method"],
                path=scope["path"],
                status=status,
                ms=round((time.perf_counter() - started) * 1000, 1),
            )
