"""What the server logs of an error it did not expect: a 500 without internals for the
client, and a JSON line on the server's logger with the traceback and the request's ids."""

from __future__ import annotations

import asyncio
import json

import psycopg
from starlette.requests import Request

from outbox.logs import JsonFormatter
from outbox.server import errors
from tests.helpers import server_logs


def test_an_unexpected_error_is_a_500_logged_with_its_traceback_and_request_id():
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/responses",
        "headers": [],
        "query_string": b"",
        "state": {"request_id": "req_1", "tenant_id": "acme"},
    }
    with server_logs() as logged:
        try:
            raise RuntimeError("boom")
        except RuntimeError as err:
            answer = asyncio.run(errors.unexpected_error(Request(scope), err))
    assert answer.status_code == 500
    assert b"boom" not in answer.body
    [line] = [json.loads(JsonFormatter().format(r)) for r in logged if r.msg == "api.unhandled"]
    assert "RuntimeError: boom" in line["exception"]
    assert (line["tenant_id"], line["correlation_id"]) == ("acme", "req_1")
    assert (line["method"], line["path"]) == ("POST", "/v1/responses")


def test_a_refusal_psycopg_raises_as_an_operational_error_is_no_outage():
    """54001 (statement too complex) is an ``OperationalError`` in psycopg: the same
    statement would be refused again, so it is a bug's 500, not a 503 to send again."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/responses",
        "headers": [],
        "query_string": b"",
        "state": {"request_id": "req_2", "tenant_id": "acme"},
    }
    refusal = psycopg.errors.StatementTooComplex("stack depth limit exceeded")
    assert isinstance(refusal, psycopg.OperationalError)
    with server_logs() as logged:
        answer = asyncio.run(errors.database_error(Request(scope), refusal))
    assert answer.status_code == 500
    assert [r.msg for r in logged] == ["api.unhandled"]
