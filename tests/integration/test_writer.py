"""The writer API on a real PostgreSQL: docs/guarantees.md, invariants 1, 2, 7, 8 under attack."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from outbox import db, orm, writer
from outbox.errors import (
    ActiveRunExists,
    IdempotencyKeyReused,
    NeedsTransaction,
    NotFound,
    PayloadTooLarge,
    WrongTenant,
)
from outbox.schemas import ToolResultIn
from tests.helpers import TENANT, add_tool, new_run, turn


def count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    row = conn.execute(f"SELECT count(*) FROM outbox.{table} WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def test_start_run_writes_message_run_and_first_turn(conn):
    run = new_run(conn)
    assert run.created and run.status == "queued"
    assert count(conn, "messages", "role = 'user'") == 1
    assert count(conn, "outbox", f"run_id = '{run.id}' AND kind = 'model_turn'") == 1
    assert count(conn, "journal", "event = 'run.created'") == 1


def test_same_idempotency_key_gives_one_run(conn):
    thread = writer.create_thread(conn, TENANT)
    first = new_run(conn, key="turn-1", thread_id=thread.id)
    again = new_run(conn, key="turn-1", thread_id=thread.id)
    assert again.id == first.id and not again.created
    assert count(conn, "runs") == 1
    assert count(conn, "messages") == 1


def test_same_key_on_another_thread_is_refused(conn):
    new_run(conn, key="turn-1")
    with pytest.raises(IdempotencyKeyReused):
        new_run(conn, key="turn-1")


def test_second_active_run_is_refused_naming_the_active_one(conn):
    thread = writer.create_thread(conn, TENANT)
    first = new_run(conn, key="a", thread_id=thread.id)
    with pytest.raises(ActiveRunExists) as err:
        new_run(conn, key="b", thread_id=thread.id)
    assert str(first.id) in str(err.value)
    assert count(conn, "runs") == 1


def test_partial_unique_index_refuses_a_second_active_run_written_by_hand(conn):
    run = new_run(conn)
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO outbox.runs (tenant_id, thread_id, model, correlation_id) "
            "VALUES (%s, %s, 'm', 'c')",
            [TENANT, run.thread_id],
        )


def test_concurrent_double_submit_gives_one_run_and_no_integrity_error(db_url):
    with psycopg.connect(db_url) as setup:
        thread = writer.create_thread(setup, TENANT)
        setup.commit()
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def submit() -> None:
        with psycopg.connect(db_url) as conn:
            barrier.wait()
            try:
                results.append(new_run(conn, key="same-turn", thread_id=thread.id))
                conn.commit()
            except Exception as err:  # the test fails below if anything was raised
                results.append(err)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, writer.RunRef) for r in results), results
    assert len({r.id for r in results}) == 1
    assert sorted(r.created for r in results) == [False, True]


def test_concurrent_same_model_turn_records_one_intent(db_url):
    with psycopg.connect(db_url) as setup:
        add_tool(setup)
        run = new_run(setup, tools=["lookup_order"])
        setup.commit()
    the_turn = turn(run, 1, ("call_1", "lookup_order", {"order_id": "42"}))
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def record() -> None:
        with psycopg.connect(db_url) as conn:
            barrier.wait()
            try:
                results.append(writer.record_model_turn(conn, the_turn))
                conn.commit()
            except Exception as err:
                results.append(err)

    threads = [threading.Thread(target=record) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, writer.TurnRecord) for r in results), results
    assert sorted(r.created for r in results) == [False, True]
    assert results[0].tool_call_refs == results[1].tool_call_refs
    with psycopg.connect(db_url) as check:
        assert count(check, "tool_calls") == 1
        assert count(check, "outbox", "kind = 'tool_call'") == 1
        assert count(check, "messages", "role = 'assistant'") == 1


def test_rolled_back_transaction_leaves_no_trace(db_url):
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        conn.commit()
        run = new_run(conn, tools=["lookup_order"])
        writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"})))
        conn.rollback()
        for table in ("threads", "runs", "messages", "tool_calls", "tool_batches", "outbox"):
            assert count(conn, table) == 0, table


def test_model_turn_records_batch_intents_and_outbox_rows_together(conn):
    add_tool(conn)
    add_tool(conn, "refund")
    run = new_run(conn, tools=["lookup_order", "refund"])
    record = writer.record_model_turn(
        conn,
        turn(
            run,
            1,
            ("c1", "lookup_order", {"order_id": "1"}),
            ("c2", "refund", {"order_id": "1"}),
        ),
    )
    assert record.created and record.run_status == "in_progress"
    assert len(record.tool_call_refs) == 2
    assert count(conn, "tool_batches", "pending = 2 AND status = 'open'") == 1
    assert count(conn, "outbox", "kind = 'tool_call'") == 2
    keys = conn.execute(
        "SELECT idempotency_key FROM outbox.tool_calls ORDER BY position"
    ).fetchall()
    assert [k[0] for k in keys] == [
        writer.idempotency_key(run.id, "c1"),
        writer.idempotency_key(run.id, "c2"),
    ]


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements a connection sends (every ``execute`` is a round trip)."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.sent += 1
        return super().execute(*args, **kwargs)


@pytest.mark.parametrize("calls", [1, 16])
def test_a_model_turn_is_a_few_round_trips_however_many_calls_it_asks_for(db_url, calls):
    """The relay records thousands of turns: each is a fixed few statements (the plan's
    reads and one call of record_model_turn_v1), not one per row it writes."""
    with psycopg.connect(db_url, cursor_factory=CountingCursor) as conn:
        add_tool(conn)
        run = new_run(conn, tools=["lookup_order"])
        asked = [(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in range(calls)]
        CountingCursor.sent = 0
        record = writer.record_model_turn(conn, turn(run, 1, *asked))
        assert CountingCursor.sent <= 4
        assert record.created and len(record.tool_call_refs) == calls
        assert count(conn, "outbox", "kind = 'tool_call'") == calls
        assert count(conn, "journal", "event = 'tool_call.intended'") == calls


def test_many_model_turns_are_a_few_round_trips_per_tenant(db_url):
    """A completer records all the turns of its transaction together: per tenant a scope,
    two reads to plan its calls and one statement recording all its turns, whatever their
    number; each record is its own turn's, in order."""
    with psycopg.connect(db_url, cursor_factory=CountingCursor) as conn:
        add_tool(conn)
        runs = [new_run(conn, tools=["lookup_order"]) for _ in range(6)]
        runs += [new_run(conn, tenant="tenant-b", tools=["lookup_order"]) for _ in range(3)]
        turns = [
            turn(run, 1, *[(f"c{i}{x}", "lookup_order", {"order_id": x}) for x in "ab"])
            for i, run in enumerate(runs)
        ]
        CountingCursor.sent = 0
        records = writer.record_model_turns(conn, turns)
        assert CountingCursor.sent <= 2 * 4
        for run, record in zip(runs, records, strict=True):
            refs = conn.execute(
                "SELECT array_agg(id ORDER BY position) FROM outbox.tool_calls WHERE run_id = %s",
                [run.id],
            ).fetchone()
            assert record.created and refs is not None and record.tool_call_refs == refs[0]
        assert count(conn, "outbox", "kind = 'tool_call'") == 18


def test_bad_calls_become_error_results_not_exceptions(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    record = writer.record_model_turn(
        conn,
        turn(
            run,
            1,
            ("c1", "lookup_order", "{not json"),
            ("c2", "lookup_order", {"order": 5}),
            ("c3", "no_such_tool", {}),
        ),
    )
    errors = conn.execute(
        "SELECT r.error FROM outbox.tool_results r "
        "JOIN outbox.tool_calls c ON c.id = r.tool_call_ref ORDER BY c.position"
    ).fetchall()
    assert "not valid JSON" in errors[0][0]
    assert "'order_id' is a required property" in errors[1][0]
    assert "unknown tool 'no_such_tool'" in errors[2][0]
    assert count(conn, "outbox", "kind = 'tool_call'") == 0
    # Nothing left to run: the batch is complete and its delivery is enqueued at once.
    assert count(conn, "outbox", f"kind = 'deliver_batch' AND batch_id = {record.batch_id}") == 1


def test_tool_result_for_missing_call_is_refused_by_the_database(conn):
    run = new_run(conn)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(
            "INSERT INTO outbox.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status, "
            "source) VALUES (999999, %s, %s, 1, 'ok', 'relay')",
            [TENANT, run.id],
        )


def test_tool_result_must_name_its_own_calls_batch_and_run(conn):
    add_tool(conn)
    mine = writer.record_model_turn(
        conn,
        turn(new_run(conn, tools=["lookup_order"]), 1, ("c1", "lookup_order", {"order_id": "1"})),
    )
    other_run = new_run(conn, tools=["lookup_order"])
    other = writer.record_model_turn(
        conn, turn(other_run, 1, ("c1", "lookup_order", {"order_id": "1"}))
    )
    # The call exists and so does the batch named, but it is another call's.
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="tool_results_call_batch_fk"):
        conn.execute(
            "INSERT INTO outbox.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status, "
            "source) VALUES (%s, %s, %s, %s, 'ok', 'relay')",
            [mine.tool_call_refs[0], TENANT, other_run.id, other.batch_id],
        )


def test_tool_message_must_answer_a_call_of_the_same_thread(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    rec = writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"})))
    other = writer.create_thread(conn, TENANT)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        writer.append_message(
            conn, other.id, TENANT, "tool", "{}", tool_call_ref=rec.tool_call_refs[0]
        )


def test_repeated_result_is_a_noop_returning_the_stored_one(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    rec = writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"})))
    ref = rec.tool_call_refs[0]
    first = writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output={"n": 1})
    )
    again = writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output={"n": 2})
    )
    assert first.outcome == "stored" and first.batch_complete
    assert again.outcome == "duplicate" and again.result is not None
    assert again.result["output"] == {"n": 1}
    assert count(conn, "outbox", "kind = 'deliver_batch'") == 1


def test_last_result_of_a_batch_enqueues_one_delivery_under_concurrency(db_url):
    with psycopg.connect(db_url) as setup:
        add_tool(setup)
        run = new_run(setup, tools=["lookup_order"])
        calls = [(f"c{i}", "lookup_order", {"order_id": str(i)}) for i in range(8)]
        rec = writer.record_model_turn(setup, turn(run, 1, *calls))
        setup.commit()
    barrier = threading.Barrier(len(rec.tool_call_refs))
    errors: list[Exception] = []

    def finish(ref: int) -> None:
        with psycopg.connect(db_url) as conn:
            barrier.wait()
            try:
                writer.record_tool_result(
                    conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output=1)
                )
                conn.commit()
            except Exception as err:
                errors.append(err)

    threads = [threading.Thread(target=finish, args=(r,)) for r in rec.tool_call_refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with psycopg.connect(db_url) as check:
        assert count(check, "outbox", "kind = 'deliver_batch'") == 1
        assert count(check, "tool_batches", "status = 'complete' AND pending = 0") == 1


def test_wrong_tenant_is_refused(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    rec = writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "1"})))
    with pytest.raises(WrongTenant):
        writer.record_tool_result(
            conn,
            ToolResultIn(tenant_id="evil", tool_call_ref=rec.tool_call_refs[0], status="ok"),
        )
    with pytest.raises(NotFound):
        writer.get_run(conn, uuid.uuid4(), TENANT)


def test_oversized_message_is_refused_with_the_cap(conn):
    thread = writer.create_thread(conn, TENANT)
    with pytest.raises(PayloadTooLarge, match="over the cap"):
        writer.append_message(conn, thread.id, TENANT, "user", "x" * (300 * 1024))


def test_autocommit_connection_outside_a_transaction_is_refused(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn, pytest.raises(NeedsTransaction):
        writer.create_thread(conn, TENANT)


def test_works_through_a_sqlalchemy_session(db_url):
    engine = create_engine(db.sqlalchemy_url(db_url))
    with Session(engine) as session:
        thread = writer.create_thread(session, TENANT)
        new_run(session, thread_id=thread.id)
        session.rollback()
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(orm.Run)) == 0
        thread = writer.create_thread(session, TENANT)
        run = new_run(session, thread_id=thread.id)
        session.commit()
        stored = session.get(orm.Run, run.id)
        assert stored is not None and stored.status == "queued"
    engine.dispose()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE outbox.journal SET event = 'x'",
        "DELETE FROM outbox.journal",
        "TRUNCATE outbox.journal",
    ],
)
def test_journal_refuses_changes(conn, statement):
    writer.create_thread(conn, TENANT)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute(statement)
