"""An idempotency key names one request: the same request again returns
its run; another request under the same key is refused, and nothing is dropped silently."""

from __future__ import annotations

import psycopg
import pytest

from outbox import writer
from outbox.errors import IdempotencyKeyReused
from outbox.schemas import StartRun
from tests.helpers import TENANT, add_tool
from tests.relay_harness import scalar


def request(**changes) -> StartRun:
    fields = {
        "tenant_id": TENANT,
        "model": "scripted",
        "message": "refund order 42",
        "tools": ["lookup_order", "refund"],
        "idempotency_key": "request-7f3a",
    }
    fields.update(changes)
    return StartRun(**fields)


@pytest.mark.parametrize(
    "change",
    [
        {"message": "refund order 43"},
        {"message": None},
        {"tools": ["lookup_order"]},
        {"model": "another-model"},
        {"thread_id": "other"},
    ],
)
def test_a_key_reused_for_another_request_is_refused(db_url, change):
    with psycopg.connect(db_url) as conn:
        add_tool(conn, "lookup_order")
        add_tool(conn, "refund")
        thread = writer.create_thread(conn, TENANT)
        first = writer.start_run(conn, request(thread_id=thread.id))
        conn.commit()
        if change.get("thread_id") == "other":
            change = {"thread_id": writer.create_thread(conn, TENANT).id}
        # The same request (tools in another order) is a resend: the same run.
        again = writer.start_run(
            conn, request(thread_id=thread.id, tools=["refund", "lookup_order"])
        )
        assert (again.id, again.created) == (first.id, False)
        with pytest.raises(IdempotencyKeyReused, match="request-7f3a"):
            writer.start_run(conn, request(**{"thread_id": thread.id, **change}))
        conn.commit()
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 1
    assert scalar(db_url, "SELECT count(*) FROM outbox.messages WHERE role = 'user'") == 1
