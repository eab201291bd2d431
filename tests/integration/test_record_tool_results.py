"""One rule records tool results, and its names are defined once.

``record_tool_results_v1`` is what the relay, the Python writer and ``submit_tool_outputs_v1``
call; here it is called directly with a set of results, as the relay does. The status sets
and dedup-key formats of ``outbox.constants`` must be what the SQL functions say.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from outbox import constants, writer
from tests.helpers import TENANT, add_tool, new_run, turn


def test_python_and_sql_agree_on_statuses_and_dedup_keys(conn):
    (check,) = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'runs_status_check'"
    ).fetchone()
    every = set(constants.ACTIVE) | set(constants.ENDED)
    for status in every:
        assert f"'{status}'" in check  # the table's CHECK knows every status of the sets
    for status in [*every, "something_else"]:
        active, ended = conn.execute(
            "SELECT outbox.run_active_v1(%s), outbox.run_ended_v1(%s)", [status, status]
        ).fetchone()
        assert (active, ended) == (status in constants.ACTIVE, status in constants.ENDED)
    run_id = uuid.uuid4()
    keys = conn.execute(
        "SELECT outbox.deliver_key_v1(42), outbox.tool_call_key_v1(7),"
        " outbox.model_turn_key_v1(%s, 3)",
        [run_id],
    ).fetchone()
    assert keys == (
        constants.deliver_key(42),
        constants.tool_call_key(7),
        constants.model_turn_key(run_id, 3),
    )


def _events(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT event, tool_call_ref, attempt, worker FROM outbox.journal"
        " WHERE run_id = %s AND event IN ('tool_result.stored', 'tool_result.orphaned',"
        " 'batch.complete') ORDER BY id",
        [run_id],
    ).fetchall()


def test_a_set_of_results_is_stored_counted_and_its_batch_delivered_once(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    calls = [(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in range(3)]
    refs = writer.record_model_turn(conn, turn(run, 1, *calls)).tool_call_refs
    result = {"status": "ok", "output": {"n": 1}, "error": None, "source": "relay", "attempt": 1}
    first = writer.record_tool_results(conn, [{"ref": refs[0], **result}], "w1")
    assert first == [(refs[0], "stored", None)]
    # The rest of the batch and a repeat of the first, in one call: the repeat changes
    # nothing, the last result completes the batch.
    rows = writer.record_tool_results(
        conn,
        [{"ref": r, **result, "attempt": 2, "lag_s": 0.5} for r in (refs[2], refs[0], refs[1])],
        "w2",
    )
    batch = conn.execute("SELECT id FROM outbox.tool_batches WHERE run_id = %s", [run.id])
    (batch_id,) = batch.fetchone()
    assert rows == [
        (refs[2], "stored", batch_id),  # the highest ref of the batch's last results
        (refs[0], "duplicate", None),
        (refs[1], "stored", None),
    ]
    (n,) = conn.execute(
        "SELECT count(*) FROM outbox.outbox WHERE dedup_key = %s AND kind = 'deliver_batch'",
        [constants.deliver_key(batch_id)],
    ).fetchone()
    assert n == 1
    pending, status = conn.execute(
        "SELECT pending, status FROM outbox.tool_batches WHERE id = %s", [batch_id]
    ).fetchone()
    assert (pending, status) == (0, "complete")
    assert _events(conn, run.id) == [
        ("tool_result.stored", refs[0], 1, "w1"),
        ("tool_result.stored", refs[1], 2, "w2"),
        ("tool_result.stored", refs[2], 2, "w2"),
        ("batch.complete", None, 2, "w2"),
    ]
    # Again, all of them: nothing moves, no second delivery, no event.
    again = writer.record_tool_results(conn, [{"ref": r, **result} for r in refs], "w3")
    assert [outcome for _, outcome, _ in again] == ["duplicate"] * 3
    assert len(_events(conn, run.id)) == 4


def test_results_for_a_closed_batch_are_orphaned_never_stored(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    refs = writer.record_model_turn(
        conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"}))
    ).tool_call_refs
    writer.end_run(conn, writer.lock_run(conn, run.id, TENANT), "cancelled", "cancelled")
    rows = writer.record_tool_results(
        conn,
        [
            {
                "ref": refs[0],
                "status": "error",
                "output": None,
                "error": "late",
                "source": "relay",
                "attempt": 1,
            }
        ],
        "w1",
    )
    assert rows == [(refs[0], "orphaned", None)]
    (stored,) = conn.execute(
        "SELECT count(*) FROM outbox.tool_results WHERE tool_call_ref = %s", [refs[0]]
    ).fetchone()
    (kept,) = conn.execute(
        "SELECT count(*) FROM outbox.orphaned_results"
        " WHERE tool_call_ref = %s AND reason = 'batch_closed'",
        [refs[0]],
    ).fetchone()
    assert (stored, kept) == (0, 1)


def test_results_of_several_batches_each_meet_their_own_batch_and_run(conn):
    # One call with the results of three runs' batches, interleaved: an open batch, a
    # closed one, and one its results complete. Each result is judged by its own batch's
    # status and journaled with its own run's correlation id (both are read once a batch).
    add_tool(conn)
    runs = [new_run(conn, tools=["lookup_order"]) for _ in range(3)]
    refs = [
        writer.record_model_turn(
            conn, turn(run, 1, *[(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in (1, 2)])
        ).tool_call_refs
        for run in runs
    ]
    writer.end_run(conn, writer.lock_run(conn, runs[1].id, TENANT), "cancelled", "cancelled")
    result = {"status": "ok", "output": {"n": 1}, "error": None, "source": "relay", "attempt": 1}
    writer.record_tool_results(conn, [{"ref": refs[2][0], **result}], "w1")
    order = [refs[2][1], refs[1][0], refs[0][0], refs[2][0], refs[1][1]]
    rows = writer.record_tool_results(conn, [{"ref": r, **result} for r in order], "w2")
    (completed,) = conn.execute(
        "SELECT id FROM outbox.tool_batches WHERE run_id = %s", [runs[2].id]
    ).fetchone()
    assert rows == [
        (refs[2][1], "stored", completed),
        (refs[1][0], "orphaned", None),
        (refs[0][0], "stored", None),
        (refs[2][0], "duplicate", None),
        (refs[1][1], "orphaned", None),
    ]
    journaled = conn.execute(
        "SELECT j.tool_call_ref, j.event, j.correlation_id = r.correlation_id"
        " FROM outbox.journal j JOIN outbox.runs r ON r.id = j.run_id"
        " WHERE j.worker = 'w2' AND j.event LIKE 'tool_result.%%' ORDER BY j.tool_call_ref"
    ).fetchall()
    assert journaled == sorted(
        [
            (refs[0][0], "tool_result.stored", True),
            (refs[1][0], "tool_result.orphaned", True),
            (refs[1][1], "tool_result.orphaned", True),
            (refs[2][1], "tool_result.stored", True),
        ]
    )
    correlations = conn.execute(
        "SELECT count(DISTINCT correlation_id) FROM outbox.runs WHERE id = ANY(%s)",
        [[run.id for run in runs]],
    ).fetchone()
    assert correlations == (3,)  # each run its own, so a mix-up would show above
