"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Handlers raise ``APIError``; the library's refusals (``OutboxError``) are turned into one
here, so a status code means the same thing everywhere. Another tenant's object is
invisible under row-level security, so it is a 404 like a missing one, never a 403.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import psycopg
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from outbox import db
from outbox.errors import (
    ActiveRunExists,
    BudgetExceeded,
    DatabaseUnavailable,
    IdempotencyKeyReused,
    NotFound,
    OutboxError,
    WrongTenant,
)
from outbox.logs import log
from outbox.server.thread_pool import RETRY_AFTER_MAX_S, ClientGone, ServerBusy

logger = logging.getLogger("server.errors")  # JSON lines as every server log (outbox.logs)
OUTAGE_RETRY_AFTER_S = 1  # what a 503 for the database gone asks a client to wait, at least


class APIError(Exception):
    """An error answer: HTTP ``status`` and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def not_found(what: str, ident: object) -> APIError:
    """OpenAI's 404 for an id nobody (of this tenant) has."""
    return APIError(404, f"No {what} found with id '{ident}'.", code=None)


def from_library(err: OutboxError) -> APIError:
    """The answer a refusal of the library means."""
    message = err.args[0] if err.args else str(err)
    if isinstance(err, NotFound | WrongTenant):
        return APIError(404, message)
    if isinstance(err, ActiveRunExists):
        return APIError(400, f"Thread already has an active run {err.run_id}.")
    if isinstance(err, IdempotencyKeyReused):
        return APIError(409, message, code="idempotency_key_reused")
    if isinstance(err, BudgetExceeded):
        return APIError(429, message, type="insufficient_quota", code="insufficient_quota")
    if isinstance(err, DatabaseUnavailable):
        return APIError(503, message, type="server_error", code="database_unavailable")
    return APIError(400, f"{message} ({err.hint})" if err.hint else message)


async def api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _identities(request: Request) -> dict[str, Any]:
    """What a log line of a request names (server.access sets the request id)."""
    state = request.scope.get("state", {})
    return {"tenant_id": state.get("tenant_id"), "correlation_id": state.get("request_id")}


def _warn(request: Request, event: str, **fields: Any) -> None:
    """A request answered without being served, logged with its identities and path."""
    log(logger, logging.WARNING, event, **_identities(request), path=request.url.path, **fields)


def _retry_after(seconds: float) -> dict[str, str]:
    """What a 503 asks its client to wait: ``Retry-After`` in whole seconds, and
    ``retry-after-ms``, which OpenAI's SDKs read first, a delay of each client's own
    between that and twice that, so that resends do not arrive together."""
    spread = min(seconds * random.uniform(1, 2), RETRY_AFTER_MAX_S)
    return {"Retry-After": str(math.ceil(seconds)), "retry-after-ms": str(round(spread * 1000))}


async def server_busy(request: Request, exc: Exception) -> JSONResponse:
    """A request shed before anything of it was done (server.thread_pool): a 503 its client
    retries (the openai SDK does, after ``Retry-After``), logged with what it waited."""
    assert isinstance(exc, ServerBusy)
    _warn(
        request,
        "api.shed",
        waited_s=round(exc.waited_s, 3),
        queue_timeout_s=exc.timeout_s,
        retry_after_s=round(exc.retry_after_s, 3),
    )
    err = APIError(
        503,
        f"The server is busy: this request waited {exc.waited_s:.1f} s for a database "
        f"connection, past its queue timeout of {exc.timeout_s:g} s, and was not started; "
        f"nothing of it was stored. Send it again in {math.ceil(exc.retry_after_s)} s or later, "
        "when the requests queued now have been served (Retry-After; an "
        "operator raises `outbox serve --db-connections` or `--workers`, or the queue "
        "timeout).",
        type="server_error",
        code="server_busy",
        headers=_retry_after(exc.retry_after_s),
    )
    return await api_error(request, err)


async def database_error(request: Request, exc: Exception) -> JSONResponse:
    """The database could not be reached or dropped the request's connection: a 503 the
    client sends again (the openai SDK does, after ``Retry-After``), and a check of the
    pool's other connections. A refusal psycopg raises as ``OperationalError`` (``db.refused``)
    is a bug's 500, like any other; a session the server ended (``db.SESSION_ENDED``: a
    request paused inside its transaction) is a 503 too."""
    assert isinstance(exc, psycopg.Error)
    if not db.unreachable(exc):
        return await unexpected_error(request, exc)
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    _warn(request, "api.database_unavailable", error=said)
    request.app.state.config.store.recheck()
    err = APIError(
        503,
        f"The database could not be reached, or went away during this request ({said}). "
        "Send it again in a second or later: with the same Idempotency-Key, a request whose "
        "write was stored before the database went away is answered from it, never stored "
        "twice.",
        type="server_error",
        code="database_unavailable",
        headers=_retry_after(OUTAGE_RETRY_AFTER_S),
    )
    return await api_error(request, err)


async def client_gone(request: Request, exc: Exception) -> JSONResponse:
    """A request dropped, nothing of it done, because its client left while it queued
    (server.thread_pool): logged; the answer (499, as proxies say it) reaches nobody."""
    assert isinstance(exc, ClientGone)
    _warn(
        request,
        "api.client_gone",
        waited_s=round(exc.waited_s, 3),
        hint="the client gave up before its request had a database connection: its "
        "timeout is shorter than the queue (outbox serve --queue-timeout), or the "
        "server needs more --db-connections or --workers",
    )
    err = APIError(499, f"{exc}; nothing of it was done.", type="server_error", code="client_gone")
    return await api_error(request, err)


async def library_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OutboxError)
    err = from_library(exc)
    return JSONResponse(err.body(), status_code=err.status)


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """Input the library's models refused (a run's fields): a 400 naming the field."""
    assert isinstance(exc, ValidationError)
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    message = str(first["msg"]).removeprefix("Value error, ")
    err = APIError(400, f"Invalid value for '{param}': {message}", param=param)
    return JSONResponse(err.body(), status_code=400)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug: logged with its traceback, answered without internals (an outage is
    ``database_error``'s)."""
    logger.error(
        "api.unhandled",
        exc_info=exc,
        extra={"ctx": {**_identities(request), "method": request.method, "path": request.url.path}},
    )
    err = APIError(500, "The server had an error processing your request.", type="server_error")
    return JSONResponse(err.body(), status_code=500)
