"""``writer.deliver_batches``: many batches in one call, each as ``deliver_batch`` alone.

The relay delivers every batch of a completion transaction with one call. Each batch must
still end exactly as if delivered on its own: a normal batch moves its run on, a repeat is
a no-op, a closed batch delivers nothing, a run at its step cap or over its tenant's budget
fails, and every thread's history stays well-formed (each call answered once, in order).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from outbox import history, lifecycle, writer
from outbox.schemas import ToolResultIn
from tests.helpers import TENANT, add_tool, new_run, turn


def complete_batch(conn: psycopg.Connection[Any], **run_kw: Any) -> tuple[writer.RunRef, int]:
    """A run whose step-1 batch of three calls has all its results."""
    run = new_run(conn, tools=["lookup_order"], **run_kw)
    calls = [(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in range(3)]
    record = writer.record_model_turn(conn, turn(run, 1, *calls))
    for ref in reversed(record.tool_call_refs):  # results arrive out of order
        result = ToolResultIn(tenant_id=run.tenant_id, tool_call_ref=ref, status="ok", output=ref)
        writer.record_tool_result(conn, result)
    assert record.batch_id is not None
    return run, record.batch_id


def tool_answers(conn: psycopg.Connection[Any], run: writer.RunRef) -> list[str]:
    messages = history.stored_messages(conn, run.thread_id)
    return [m["tool_call_id"] for m in messages if m["role"] == "tool"]


def test_many_batches_in_one_call_each_end_as_alone(conn):
    add_tool(conn)
    normal, b_normal = complete_batch(conn)
    again, b_again = complete_batch(conn)
    writer.deliver_batch(conn, b_again)  # delivered before: the call is a repeat for it
    capped, b_capped = complete_batch(conn, max_steps=1)
    cancelled, b_cancelled = complete_batch(conn)
    lifecycle.cancel_run(conn, cancelled.id, TENANT, actor="test")  # closes its batch
    writer.set_tenant_budget(conn, "poor", 10)
    broke, b_broke = complete_batch(conn, tenant="poor")  # its turn used 15 of 10 tokens

    done = writer.deliver_batches(conn, [b_broke, b_cancelled, b_capped, b_again, b_normal])

    assert done[b_normal] == writer.Delivery("delivered", 2, "in_progress")
    assert done[b_again].outcome == "already"
    assert done[b_cancelled] == writer.Delivery("closed", None, "cancelled")
    assert done[b_capped] == writer.Delivery("delivered", None, "failed")
    assert done[b_broke] == writer.Delivery("delivered", None, "failed")
    reasons = {r: writer.get_run(conn, r.id)["failure_reason"] for r in (capped, broke, normal)}
    assert reasons == {capped: "step_cap", broke: "budget", normal: None}
    next_turns = conn.execute(
        "SELECT run_id FROM outbox.outbox WHERE kind = 'model_turn' AND payload->>'step_no' = '2'"
    ).fetchall()
    assert sorted(r[0] for r in next_turns) == sorted([normal.id, again.id])  # no others
    submissions = conn.execute(
        "SELECT batch_id, count(*) FROM outbox.submissions GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert submissions == sorted((b, 1) for b in (b_normal, b_again, b_capped, b_broke))
    for run in (normal, again, capped, cancelled, broke):  # every call answered once, in order
        assert tool_answers(conn, run) == ["c0", "c1", "c2"], run
    journaled = conn.execute(
        "SELECT count(*) FROM outbox.journal WHERE event = 'batch.delivered'"
    ).fetchone()
    assert journaled == (4,)


def test_delivering_the_same_batches_again_changes_nothing(conn):
    add_tool(conn)
    batches = [complete_batch(conn)[1] for _ in range(3)]
    first = writer.deliver_batches(conn, batches)
    messages = conn.execute("SELECT count(*) FROM outbox.messages").fetchone()
    again = writer.deliver_batches(conn, batches)
    assert {d.outcome for d in first.values()} == {"delivered"}
    assert {d.outcome for d in again.values()} == {"already"}
    assert conn.execute("SELECT count(*) FROM outbox.messages").fetchone() == messages


def test_tool_messages_hold_the_canonical_text_of_each_result(conn):
    """The delivery writes each message from the stored result, in PostgreSQL: a JSON
    string as itself, other JSON as its text (UTF-8, not escaped), an error as
    {"error": ...}; a call of a closed batch without a result is answered 'not executed'."""
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    outputs = [{"städte": ["Zürich", "Malmö"], "n": 2}, "plain text", None, "failed"]
    calls = [(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in range(len(outputs))]
    record = writer.record_model_turn(conn, turn(run, 1, *calls))
    assert record.batch_id is not None
    for ref, output in zip(record.tool_call_refs, outputs, strict=True):
        failed = output == "failed"
        writer.record_tool_result(
            conn,
            ToolResultIn(
                tenant_id=run.tenant_id,
                tool_call_ref=ref,
                status="error" if failed else "ok",
                output=None if failed else output,
                error='tool said "no" \n twice' if failed else None,
            ),
        )
    writer.deliver_batch(conn, record.batch_id)
    unanswered = new_run(conn, tools=["lookup_order"])
    writer.record_model_turn(conn, turn(unanswered, 1, ("c0", "lookup_order", {"order_id": "9"})))
    lifecycle.cancel_run(conn, unanswered.id, TENANT, actor="test")

    contents = [
        m["content"] for m in history.stored_messages(conn, run.thread_id) if m["role"] == "tool"
    ]
    assert contents == [
        '{"n": 2, "städte": ["Zürich", "Malmö"]}',  # jsonb's text: its key order, raw UTF-8
        "plain text",
        "null",
        '{"error": "tool said \\"no\\" \\n twice"}',
    ]
    for content in contents[:1] + contents[2:]:
        json.loads(content)  # each is JSON a model can read back
    (cancelled,) = [
        m["content"]
        for m in history.stored_messages(conn, unanswered.thread_id)
        if m["role"] == "tool"
    ]
    assert json.loads(cancelled)["error"].startswith("not executed: ")
