"""record_model_turns_v1 writes each table once for all the turns it is given: whatever it
records together must be exactly what recording the same turns one at a time records.

Two tenants get the same runs; one tenant's turns go in one call, the other's one call each
(record_model_turn_v1 is the same function for one turn, so a turn that leaked into its
neighbour's rows, a call joined to the wrong batch or a status taken from another run shows
as a difference between the two)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from outbox import budgets, writer
from outbox.errors import NotFound
from outbox.schemas import ModelTurnIn
from tests.helpers import add_tool, new_run, turn
from tests.relay_harness import scalar, wait_until

TOOLS = ["lookup_order", "ask_user", "wire_money"]


def runs_and_turns(conn: psycopg.Connection[Any], tenant: str) -> list[ModelTurnIn]:
    """One turn of each kind, each for its own run, in an order that mixes them."""

    def run() -> writer.RunRef:
        return new_run(conn, tenant=tenant, tools=TOOLS)

    repeated, cancelled = run(), run()
    writer.record_model_turn(conn, turn(repeated, 1, ("r1", "lookup_order", {"order_id": "9"})))
    row = writer.lock_run(conn, cancelled.id, None)
    writer.end_run(conn, row, "cancelled", "cancelled", actor="test")
    lookup = {"order_id": "1"}
    return [
        turn(run(), 1, ("a1", "lookup_order", lookup), ("a2", "lookup_order", {"order_id": "2"})),
        turn(run(), 1, text="all done"),
        turn(repeated, 1, ("r1", "lookup_order", {"order_id": "9"})),
        turn(run(), 1, ("b1", "no_such_tool", {}), ("b2", "lookup_order", lookup)),
        turn(run(), 1, ("c1", "lookup_order", lookup), ("c2", "ask_user", {"order_id": "3"})),
        turn(cancelled, 1, ("d1", "lookup_order", lookup)),
        turn(run(), 1, ("e1", "wire_money", {"order_id": "4"}), ("e2", "lookup_order", lookup)),
        turn(run(), 1, ("f1", "lookup_order", "{not json")),
        turn(run(), 1, text="also done"),
    ]


def snapshot(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> dict[str, Any]:
    """What a turn wrote for a run, without ids and keys that differ between runs."""

    def rows(query: str) -> list[tuple[Any, ...]]:
        return conn.execute(query, {"run": run_id}).fetchall()

    return {
        "run": rows(
            "SELECT status, step_count, tokens_used, cost, action_deadline IS NOT NULL, "
            "ended_at IS NOT NULL, failure_reason FROM outbox.runs WHERE id = %(run)s"
        ),
        "messages": rows(
            "SELECT seq, role, content FROM outbox.messages WHERE run_id = %(run)s ORDER BY seq"
        ),
        "turns": rows(
            "SELECT step_no, input_tokens, output_tokens, cached_tokens, cost, "
            "(SELECT seq FROM outbox.messages m WHERE m.id = t.message_id) "
            "FROM outbox.model_turns t WHERE run_id = %(run)s ORDER BY step_no"
        ),
        "batches": rows(
            "SELECT step_no, status, size, pending, "
            "(SELECT seq FROM outbox.messages m WHERE m.id = b.message_id) "
            "FROM outbox.tool_batches b WHERE run_id = %(run)s ORDER BY step_no"
        ),
        "calls": rows(
            "SELECT position, tool_call_id, tool_name, tool_version, arguments, arguments_raw, "
            "arguments_hash, executor, idempotency_mode, status, tc.id = (SELECT min(id) "
            "FROM outbox.tool_calls x WHERE x.batch_id = tc.batch_id) + position "
            "FROM outbox.tool_calls tc WHERE run_id = %(run)s ORDER BY position"
        ),
        "results": rows(
            "SELECT tc.position, r.status, r.error, r.source, r.attempt "
            "FROM outbox.tool_results r JOIN outbox.tool_calls tc ON tc.id = r.tool_call_ref "
            "WHERE tc.run_id = %(run)s ORDER BY tc.position"
        ),
        "outbox": rows(
            "SELECT o.kind, tc.position, o.tool_name, o.max_attempts, o.status, o.attempts, "
            "o.available_at = 'infinity', o.dedup_key = 'tool_call:' || o.tool_call_ref "
            "FROM outbox.outbox o LEFT JOIN outbox.tool_calls tc ON tc.id = o.tool_call_ref "
            "WHERE o.run_id = %(run)s ORDER BY o.kind, tc.position"
        ),
        "approvals": rows(
            "SELECT tc.position, a.tool_name, a.rule, a.approvers, a.status, "
            "a.arguments_digest = tc.arguments_hash, a.deadline > now() "
            "FROM outbox.approvals a JOIN outbox.tool_calls tc ON tc.id = a.tool_call_ref "
            "WHERE a.run_id = %(run)s ORDER BY tc.position"
        ),
        "journal": rows(
            "SELECT event, tool_call_id, detail - 'approval_id' - 'deadline' - 'batch_id', "
            "tool_call_ref IS NULL, batch_id IS NULL "
            "FROM outbox.journal WHERE run_id = %(run)s ORDER BY id"
        ),
    }


def test_turns_recorded_together_write_what_they_write_one_at_a_time(db_url):
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        add_tool(conn, "ask_user", executor="client")
        add_tool(conn, "wire_money", risk_tier="high")
        budgets.set_price(conn, "scripted", input_per_mtok="3", output_per_mtok="15")
        together, alone = runs_and_turns(conn, "tenant-t"), runs_and_turns(conn, "tenant-a")
        for tenant in ("tenant-t", "tenant-a"):
            writer.set_tenant_budget(conn, tenant, 10_000)
        conn.commit()

        records = writer.record_model_turns(conn, together)
        conn.commit()
        one_by_one = []
        for a_turn in alone:
            one_by_one += writer.record_model_turns(conn, [a_turn])
            conn.commit()

        def shape(record: writer.TurnRecord) -> tuple[Any, ...]:
            return record.run_status, record.created, len(record.tool_call_refs), record.batch_id

        assert [shape(r)[:3] for r in records] == [shape(r)[:3] for r in one_by_one]
        assert [shape(r)[3] is None for r in records] == [r.batch_id is None for r in one_by_one]
        assert [r.run_status for r in records] == [
            "in_progress", "completed", "in_progress", "in_progress", "requires_action",
            "cancelled", "in_progress", "in_progress", "completed",
        ]  # fmt: skip
        assert [r.created for r in records] == [True, True, False, True, True, False] + [True] * 3
        for a, b, record in zip(together, alone, records, strict=True):
            assert snapshot(conn, a.run_id) == snapshot(conn, b.run_id), a.tool_calls
            refs = conn.execute(
                "SELECT coalesce(array_agg(id ORDER BY position), '{}') FROM outbox.tool_calls "
                "WHERE run_id = %s AND batch_id IS NOT DISTINCT FROM %s",
                [a.run_id, record.batch_id],
            ).fetchone()
            assert refs is not None and record.tool_call_refs == refs[0]
        spent = dict(
            conn.execute("SELECT tenant_id, (tokens_used, cost_used) FROM outbox.tenant_budgets")
        )
        assert spent["tenant-t"] == spent["tenant-a"] != ("0", "0")


def test_two_turns_of_one_run_in_one_call_are_recorded_in_order(db_url):
    """The second sees the first: a repeat of a step gives the stored turn back."""
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        run = new_run(conn, tools=["lookup_order"])
        first = turn(run, 1, ("c1", "lookup_order", {"order_id": "1"}))
        records = writer.record_model_turns(conn, [first, first])
        assert [r.created for r in records] == [True, False]
        assert records[0].tool_call_refs == records[1].tool_call_refs
        assert records[0].model_turn_id == records[1].model_turn_id
        assert conn.execute("SELECT count(*) FROM outbox.outbox").fetchone() == (2,)  # + 1st turn


def test_a_missing_run_among_many_refuses_them_all_naming_it(db_url):
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        good = [turn(new_run(conn, tools=["lookup_order"]), 1, text="ok") for _ in range(3)]
        conn.commit()
        ghost = good[1].model_copy(update={"run_id": uuid.uuid4()})
        with pytest.raises(NotFound, match=str(ghost.run_id)):
            writer.record_model_turns(conn, [good[0], ghost, good[2]])
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM outbox.model_turns").fetchone() == (0,)


def test_calls_that_do_not_match_the_turns_are_refused_by_the_database(db_url):
    with psycopg.connect(db_url) as conn:
        run = new_run(conn)
        fields = turn(run, 1, text="x").model_dump(mode="json", exclude={"tool_calls"})
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="same length"):
            conn.execute(
                "SELECT * FROM outbox.record_model_turns_v1(%s, %s)",
                [Jsonb([fields]), Jsonb([[], []])],
            )


def test_a_turn_without_a_run_is_refused_as_a_missing_run(db_url):
    with psycopg.connect(db_url) as conn:
        fields = turn(new_run(conn), 1, text="x").model_dump(mode="json", exclude={"tool_calls"})
        conn.commit()
        for turns in ([{**fields, "run_id": None}], [fields, {**fields, "run_id": None}]):
            with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
                conn.execute(
                    "SELECT * FROM outbox.record_model_turns_v1(%s, %s)",
                    [Jsonb(turns), Jsonb([[] for _ in turns])],
                )
            conn.rollback()


def wake_ups(listener: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> list[str]:
    """The wake-ups committed on ``conn`` since the last call: a marker NOTIFY committed
    after them arrives after them (one session's notifications come in commit order)."""
    conn.execute("NOTIFY outbox_ready, 'marker'")
    conn.commit()
    got = []
    for notify in listener.notifies(timeout=30):
        if notify.payload == "marker":
            return got
        got.append(notify.payload)
    raise AssertionError(f"the marker did not arrive; got {got}")


def test_only_turns_that_queue_calls_wake_the_relays(db_url):
    """The NOTIFY trigger fires once per inserting statement, rows or not: a turn that
    queues nothing must not run the outbox insert, or every relay wakes for nothing."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN outbox_ready")
        with psycopg.connect(db_url) as conn:
            add_tool(conn)
            add_tool(conn, "ask_user", executor="client")
            quiet = [
                turn(new_run(conn), 1, text="done"),
                turn(new_run(conn, tools=["ask_user"]), 1, ("c1", "ask_user", {"order_id": "1"})),
            ]
            calls = turn(
                new_run(conn, tools=["lookup_order"]), 1, ("c2", "lookup_order", {"order_id": "7"})
            )
            refused = turn(new_run(conn, tools=["lookup_order"]), 1, ("c3", "no_such_tool", {}))
            wake_ups(listener, conn)  # the seeding's own
            writer.record_model_turns(conn, quiet)
            assert wake_ups(listener, conn) == []
            writer.record_model_turns(conn, [calls])  # a tool call to run
            assert wake_ups(listener, conn) == ["outbox"]
            writer.record_model_turns(conn, [refused])  # its batch's delivery, at once
            assert wake_ups(listener, conn) == ["outbox"]


def test_token_counts_past_a_32_bit_integer_add_up(db_url):
    with psycopg.connect(db_url) as conn:
        run = new_run(conn)
        big = turn(run, 1, text="long").model_copy(
            update={"input_tokens": 2_000_000_000, "output_tokens": 200_000_000}
        )
        assert writer.record_model_turn(conn, big).run_status == "completed"
        row = conn.execute("SELECT tokens_used FROM outbox.runs WHERE id = %s", [run.id]).fetchone()
        assert row == (2_200_000_000,)


def blocked(db_url: str, pid: int) -> bool:
    query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    return bool(scalar(db_url, query, [pid]))


def record_in_thread(db_url: str, turns: list[ModelTurnIn], out: list[Any]) -> threading.Thread:
    """Record ``turns`` on a connection of its own; its backend pid, then its outcome, go
    to ``out``."""

    def record() -> None:
        with psycopg.connect(db_url) as conn:
            out.append(conn.info.backend_pid)
            try:
                out.append(writer.record_model_turns(conn, turns))
                conn.commit()
            except Exception as err:
                out.append(err)

    thread = threading.Thread(target=record)
    thread.start()
    return thread


def test_a_run_named_twice_is_still_locked_in_id_order(db_url):
    """[hi, hi, lo] against a transaction holding lo and then asking for hi: with hi taken
    first (turn order) the two would deadlock; in id order the call waits for lo holding
    nothing."""
    with psycopg.connect(db_url) as conn:
        runs = sorted((new_run(conn) for _ in range(2)), key=lambda r: r.id)
        conn.commit()
    lo, hi = runs
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM outbox.runs WHERE id = %s FOR UPDATE", [lo.id])
        out: list[Any] = []
        first = record_in_thread(
            db_url, [turn(hi, 1, text="a"), turn(hi, 1, text="a"), turn(lo, 1, text="b")], out
        )
        wait_until(lambda: out and blocked(db_url, out[0]), what="the first caller waits for lo")
        holder.execute("SELECT 1 FROM outbox.runs WHERE id = %s FOR UPDATE", [hi.id])
        holder.commit()
        first.join(30)
    assert not isinstance(out[1], Exception), out[1]
    assert [r.created for r in out[1]] == [True, False, True]


def test_turns_of_several_tenants_take_their_budgets_in_name_order(db_url):
    """Each tenant's budget row stays locked to the end of the transaction: callers that
    took tenants in the order of their turns could deadlock (A then B against B then A)."""
    with psycopg.connect(db_url) as conn:
        for tenant in ("tenant-a", "tenant-b"):
            writer.set_tenant_budget(conn, tenant, 10_000)
        turns = [turn(new_run(conn, tenant=t), 1, text="x") for t in ("tenant-b", "tenant-a")]
        conn.commit()
    with psycopg.connect(db_url) as holder:
        holder.execute(
            "SELECT 1 FROM outbox.tenant_budgets WHERE tenant_id = 'tenant-a' FOR UPDATE"
        )
        out: list[Any] = []
        caller = record_in_thread(db_url, turns, out)
        wait_until(lambda: out and blocked(db_url, out[0]), what="the caller waits for tenant-a")
        with psycopg.connect(db_url) as other:  # tenant-b's row is not held meanwhile
            other.execute(
                "SELECT 1 FROM outbox.tenant_budgets WHERE tenant_id = 'tenant-b' FOR UPDATE NOWAIT"
            )
        holder.rollback()
        caller.join(30)
    assert not isinstance(out[1], Exception), out[1]
