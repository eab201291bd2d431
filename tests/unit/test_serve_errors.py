"""What the server logs of an error it did not expect: a 500 without internals for the
client, and a JSON line on the server's logger with the traceback and the request's ids."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from starlette.requests import Request

from outbox.logs import JsonFormatter
from outbox.server import errors
from outbox.server.access import AccessLog
from tests.helpers import server_logs


def a_request(method: str, request_id: str, **scope: Any) -> Request:
    """A request of the tenant acme to /v1/responses, as the middlewares leave it."""
    state = {"request_id": request_id, "tenant_id": "acme"}
    return Request(
        {
            "type": "http",
            "method": method,
            "path": "/v1/responses",
            "headers": [],
            "query_string": b"",
            "state": state,
            **scope,
        }
    )


def test_an_unexpected_error_is_a_500_logged_with_its_traceback_and_request_id():
    with server_logs() as logged:
        try:
            raise RuntimeError("boom")
        except RuntimeError as err:
            answer = asyncio.run(errors.unexpected_error(a_request("POST", "req_1"), err))
    assert answer.status_code == 500
    assert b"boom" not in answer.body
    [line] = [json.loads(JsonFormatter().format(r)) for r in logged if r.msg == "api.unhandled"]
    assert "RuntimeError: boom" in line["exception"]
    assert (line["tenant_id"], line["correlation_id"]) == ("acme", "req_1")
    assert (line["method"], line["path"]) == ("POST", "/v1/responses")


def test_a_refusal_psycopg_raises_as_an_operational_error_is_no_outage():
    """54001 (statement too complex) is an ``OperationalError`` in psycopg: the same
    statement would be refused again, so it is a bug's 500, not a 503 to send again."""
    refusal = psycopg.errors.StatementTooComplex("stack depth limit exceeded")
    assert isinstance(refusal, psycopg.OperationalError)
    with server_logs() as logged:
        answer = asyncio.run(errors.database_error(a_request("GET", "req_2"), refusal))
    assert answer.status_code == 500
    assert [r.msg for r in logged] == ["api.unhandled"]


def test_a_session_the_server_ended_is_a_503_to_send_again():
    """25P03 (idle_in_transaction_session_timeout: the request was paused inside its
    transaction, and the database ended its session to free its locks) is an
    ``InternalError`` in psycopg, yet nothing of the request was stored: a 503 to send
    again, and the pool's connections checked, like any connection the database dropped."""
    checked: list[bool] = []
    store = SimpleNamespace(recheck=lambda: checked.append(True))
    app = SimpleNamespace(state=SimpleNamespace(config=SimpleNamespace(store=store)))
    ended = psycopg.errors.IdleInTransactionSessionTimeout("terminating connection")
    assert not isinstance(ended, psycopg.OperationalError)
    with server_logs() as logged:
        answer = asyncio.run(errors.database_error(a_request("POST", "req_3", app=app), ended))
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert json.loads(answer.body)["error"]["code"] == "database_unavailable"
    assert [r.msg for r in logged] == ["api.database_unavailable"] and checked == [True]


def test_an_error_no_handler_answered_is_a_500_logged_once_and_not_raised_further():
    """Raised further, Starlette's outermost middleware would have uvicorn log it a second
    time, as plain text; the 500 carries the request id like any answer."""

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/responses/resp_1",
        "headers": [(b"x-request-id", b"req_3")],
        "query_string": b"",
    }
    with server_logs() as logged:
        asyncio.run(AccessLog(broken)(scope, receive, send))
    start = sent[0]
    assert start["status"] == 500
    assert (b"x-request-id", b"req_3") in start["headers"]
    assert b"boom" not in b"".join(m.get("body", b"") for m in sent)
    assert [r.msg for r in logged if r.levelno >= logging.WARNING] == ["api.unhandled"]


def test_an_error_after_the_answer_began_goes_on_up():
    async def torn(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the stream broke")

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    with pytest.raises(RuntimeError, match="the stream broke"):
        asyncio.run(AccessLog(torn)(scope, receive, send))
