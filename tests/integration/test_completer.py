"""The completer's set-based fast path writes what the per-row path writes.

Several terminal results are written in one completion transaction: fenced together,
stored together, batches counted together. These tests drive ``Worker._write`` directly
with hand-made leases, so each invariant is checked on the rows themselves: fencing per
row (a row leased to someone else is refused, journaled and its result orphaned), one
result per call, the delivery enqueued exactly once when the last result of a batch lands,
results for a closed batch in ``orphaned_results``, a journal event per result.
"""

from __future__ import annotations

from typing import Any

import psycopg

from outbox.relay.outcomes import Claimed, Outcome
from outbox.relay.worker import Link, Worker
from tests.helpers import TENANT, add_tool, new_run, turn
from tests.relay_harness import config, scalar, seed

WORKER = "completer-under-test"


def lease(db_url: str, owner: str, attempt: int = 1, kind: str = "tool_call") -> dict[Any, Claimed]:
    """Lease every ready row of ``kind`` to ``owner``; the claimed rows by tool call (by
    run for model turns)."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', attempts = %s, lease_owner = %s, "
            "lease_expires_at = now() + interval '1 minute' "
            "WHERE kind = %s AND status = 'ready' "
            "RETURNING id, batch_id, tool_call_ref, run_id, thread_id",
            [attempt, owner, kind],
        ).fetchall()
        conn.commit()
    return {
        ref if kind == "tool_call" else run_id: Claimed(
            failures=0,
            id=row_id,
            kind=kind,
            tenant_id=TENANT,
            thread_id=thread_id,
            run_id=run_id,
            batch_id=batch_id,
            tool_call_ref=ref,
            correlation_id=None,
            attempt=attempt,
            max_attempts=5,
            payload={},
            lag_s=0.0,
        )
        for row_id, batch_id, ref, run_id, thread_id in rows
    }


def write(db_url: str, outcomes: list[Outcome]) -> list[str]:
    worker = Worker(config(db_url, worker_id=WORKER))
    link = Link(db_url, "test")
    applied: list[str] = []
    original = worker.completer._after_commit
    worker.completer._after_commit = lambda o, a: (applied.extend(a), original(o, a))  # type: ignore[method-assign]
    try:
        worker.completer.write(link, outcomes)
    finally:
        link.close()
    return applied


def events(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT event, count(*) FROM outbox.journal GROUP BY 1").fetchall()
    return dict(rows)


def test_many_results_in_one_transaction_keep_every_invariant(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("SET outbox.notify = 'off'")
        register_tool_stub(conn)
        conn.commit()
    refs = seed(db_url, ["stub"], runs=2, calls_per_batch=3, args=lambda n: {"n": n})
    claimed = lease(db_url, WORKER)
    first, second = refs[:3], refs[3:]
    with psycopg.connect(db_url) as conn:  # one row of the first batch now belongs elsewhere
        conn.execute(
            "UPDATE outbox.outbox SET lease_owner = 'someone-else' WHERE tool_call_ref = %s",
            [first[2]],
        )
        conn.commit()
    outcomes = [
        Outcome(claimed[first[0]], "result", "ok", {"a": 1}),
        Outcome(claimed[first[1]], "result", "error", None, "it broke"),
        Outcome(claimed[first[2]], "result", "ok", {"late": True}),
        *[Outcome(claimed[ref], "result", "ok", {"ref": ref}) for ref in second],
    ]
    applied = write(db_url, outcomes)

    by_ref = dict(zip([o.row.tool_call_ref for o in outcomes], applied, strict=True))
    assert by_ref[first[2]] == "fenced"
    assert [by_ref[r] for r in (first[0], first[1], *second)] == ["result_stored"] * 5
    with psycopg.connect(db_url, autocommit=True) as conn:
        statuses = dict(conn.execute("SELECT id, status FROM outbox.tool_calls").fetchall())
    assert statuses[first[0]] == "succeeded" and statuses[first[1]] == "failed"
    assert statuses[first[2]] == "pending"
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 5
    assert (
        scalar(db_url, "SELECT error FROM outbox.tool_results WHERE tool_call_ref = %s", [first[1]])
        == "it broke"
    )
    # the fenced write: journaled, its result kept out of every context
    assert scalar(db_url, "SELECT reason FROM outbox.orphaned_results") == "fenced"
    # batch bookkeeping: the first batch waits for one result, the second is complete
    pending = "SELECT pending, status FROM outbox.tool_batches WHERE id = %s"
    batch_of = {o.row.tool_call_ref: o.row.batch_id for o in outcomes}
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(pending, [batch_of[first[0]]]).fetchone() == (1, "open")
        assert conn.execute(pending, [batch_of[second[0]]]).fetchone() == (0, "complete")
    deliveries = "SELECT batch_id FROM outbox.outbox WHERE kind = 'deliver_batch'"
    assert scalar(db_url, "SELECT count(*) FROM (" + deliveries + ") d") == 1
    assert scalar(db_url, deliveries) == batch_of[second[0]]
    seen = events(db_url)
    assert seen["tool_result.stored"] == 5
    assert seen["write.fenced"] == 1
    assert seen["batch.complete"] == 1
    complete = (
        "SELECT tool_call_id, attempt, worker FROM outbox.journal WHERE event = 'batch.complete'"
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(complete).fetchone() == ("call_2", 1, WORKER)

    # The rightful holder's late result for a batch that was closed meanwhile: orphaned.
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE outbox.outbox SET lease_owner = %s WHERE tool_call_ref = %s",
            [WORKER, first[2]],
        )
        conn.execute(
            "UPDATE outbox.tool_batches SET status = 'cancelled' WHERE id = %s",
            [batch_of[first[0]]],
        )
        conn.commit()
    again = [Outcome(claimed[first[2]], "result", "ok", {"on": "time"})]
    assert write(db_url, again) == ["result_orphaned"]
    assert events(db_url)["tool_result.orphaned"] == 1
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 5
    reasons = "SELECT array_agg(reason ORDER BY id) FROM outbox.orphaned_results"
    assert scalar(db_url, reasons) == ["fenced", "batch_closed"]
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'deliver_batch'") == 1


def register_tool_stub(conn: psycopg.Connection[Any]) -> None:
    from outbox import registry

    registry.register(
        conn, registry.ToolSpec(name="stub", executor="python", callable="tests.tooling:echo")
    )


def test_an_outcome_that_cannot_be_written_does_not_stop_the_others(db_url):
    import threading

    with psycopg.connect(db_url) as conn:
        from outbox import registry

        registry.register(
            conn,
            registry.ToolSpec(name="t", executor="http", endpoint="http://127.0.0.1:9/t"),
        )
        conn.commit()
    seed(db_url, ["t"], runs=1, calls_per_batch=2, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    link = worker.claim_link()
    bad, good = worker._claim(link, 10)
    outcomes = worker.outcomes[0]  # one completer, like a run's outcomes always share one
    outcomes.put(Outcome(bad, "result", "ok", object()))  # not JSON: cannot be written
    outcomes.put(Outcome(good, "result", "ok", {"fine": True}))
    completer = threading.Thread(target=worker.completer.loop, args=(outcomes,))
    completer.start()
    outcomes.join()  # the completer went through both, and is still alive
    assert completer.is_alive()
    worker.done.set()
    completer.join(timeout=10)
    link.close()
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 1
    leased = scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'leased'")
    assert leased == 1  # the bad one waits for its lease to expire and be rescued


def test_many_model_turns_in_one_transaction_are_recorded_together(db_url: str) -> None:
    """Model turns take the set-based path too: one statement records them all, each turn
    still fenced on its own lease (a turn whose row another worker holds is refused and
    journaled, and writes nothing), each recorded once with its calls and their rows."""
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        runs = [new_run(conn, tools=["lookup_order"]) for _ in range(6)]
        conn.commit()
    claimed = lease(db_url, WORKER, kind="model_turn")
    stolen, final = runs[0], runs[1]  # final: a turn without calls, which ends its run
    with psycopg.connect(db_url) as conn:  # another worker holds run 0's turn meanwhile
        conn.execute(
            "UPDATE outbox.outbox SET lease_owner = 'someone-else' WHERE id = %s",
            [claimed[stolen.id].id],
        )
        conn.commit()

    def answer(i: int, run: Any) -> Any:
        if run is final:
            return turn(run, 1, text="done")
        return turn(run, 1, *[(f"c{i}{x}", "lookup_order", {"order_id": x}) for x in "ab"])

    outcomes = [
        Outcome(claimed[run.id], "turn", output=answer(i, run)) for i, run in enumerate(runs)
    ]
    applied = write(db_url, outcomes)  # sorts outcomes as it writes them
    by_run = {o.row.run_id: what for o, what in zip(outcomes, applied, strict=True)}
    assert by_run[stolen.id] == "fenced"
    assert by_run[final.id] == "recorded_completed"
    assert {by_run[run.id] for run in runs[2:]} == {"recorded_in_progress"}
    assert events(db_url)["write.fenced"] == 1
    assert scalar(db_url, "SELECT count(*) FROM outbox.model_turns") == 5
    for i, run in enumerate(runs):  # each turn's calls on its own run
        ids = scalar(
            db_url,
            "SELECT coalesce(string_agg(tool_call_id, ',' ORDER BY position), '') "
            f"FROM outbox.tool_calls WHERE run_id = '{run.id}'",
        )
        assert ids == ("" if run in (stolen, final) else f"c{i}a,c{i}b")
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'") == 8
    # run 0's turn is still leased to the other worker; the others' rows are finished
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'model_turn'") == 1


def test_a_turn_that_cannot_be_recorded_does_not_stop_the_others(db_url: str) -> None:
    """A turn the database refuses (here: it names another tenant than its run's) fails
    the transaction it shares with others; the completer then writes each alone, so the
    others are recorded and the refused one stays leased, inspectable, for lease expiry."""
    import threading

    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        runs = [new_run(conn, tools=["lookup_order"]) for _ in range(3)]
        conn.commit()
    claimed = lease(db_url, WORKER, kind="model_turn")
    worker = Worker(config(db_url, worker_id=WORKER))
    outcomes = worker.outcomes[0]
    for i, run in enumerate(runs):
        answer = turn(run, 1, (f"c{i}", "lookup_order", {"order_id": "1"}))
        if i == 1:
            answer = answer.model_copy(update={"tenant_id": "someone-else"})
        outcomes.put(Outcome(claimed[run.id], "turn", output=answer))
    completer = threading.Thread(target=worker.completer.loop, args=(outcomes,))
    completer.start()
    outcomes.join()  # the completer went through all three, and is still alive
    assert completer.is_alive()
    worker.done.set()
    completer.join(timeout=10)
    recorded = "SELECT count(*) FROM outbox.model_turns WHERE run_id = %s"
    assert [scalar(db_url, recorded, (run.id,)) for run in runs] == [1, 0, 1]
    leased = "SELECT count(*) FROM outbox.outbox WHERE kind = 'model_turn' AND status = 'leased'"
    assert scalar(db_url, leased) == 1


def test_many_retries_in_one_transaction_keep_every_invariant(db_url: str) -> None:
    """Rows put back for a later attempt are written together (``retry_later_many``) and
    as the per-row path wrote them: each only for its lease holder (another's refused and
    journaled ``write.fenced``), one whose run is over dropped, a charged retry counted
    against the row's attempts and a defer not, each call back to ``pending`` with its own
    attempt's dispatch mark taken back only when that attempt never reached the tool, each
    row journaled ``retry_scheduled`` with its delay."""
    from outbox import lifecycle

    with psycopg.connect(db_url) as conn:
        register_tool_stub(conn)
        conn.commit()
    refs = seed(db_url, ["stub"], runs=3, calls_per_batch=2, args=lambda n: {"n": n})
    claimed = lease(db_url, WORKER)
    charged, unsent, deferred, elsewhere, over_1, over_2 = refs
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE outbox.tool_calls SET status = 'running', dispatched_attempt = 1,"
            " dispatched_at = now() WHERE id = ANY(%s)",
            [[charged, unsent]],
        )
        conn.execute(
            "UPDATE outbox.outbox SET lease_owner = 'someone-else' WHERE tool_call_ref = %s",
            [elsewhere],
        )
        lifecycle.cancel_run(conn, claimed[over_1].run_id, TENANT, actor="test")
        conn.commit()
    outcomes = [
        Outcome(claimed[charged], "retry", error="HTTP 500 from stub", delay_s=30.0),
        Outcome(claimed[unsent], "retry", error="refused", delay_s=30.0, unsent=True),
        Outcome(claimed[deferred], "defer", error="over its limit", delay_s=60.0),
        Outcome(claimed[elsewhere], "retry", error="HTTP 500 from stub", delay_s=30.0),
        Outcome(claimed[over_1], "retry", error="HTTP 500 from stub", delay_s=30.0),
        Outcome(claimed[over_2], "retry", error="HTTP 500 from stub", delay_s=30.0),
    ]
    applied = dict(zip(refs, write(db_url, outcomes), strict=True))

    assert [applied[r] for r in (charged, unsent, deferred)] == ["retry_scheduled"] * 3
    assert [applied[r] for r in (elsewhere, over_1, over_2)] == ["fenced"] * 3
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = {
            ref: (status, failures, round(delay))
            for ref, status, failures, delay in conn.execute(
                "SELECT tool_call_ref, status, failures,"
                " extract(epoch FROM available_at - now()) FROM outbox.outbox"
            ).fetchall()
        }
        calls = {
            ref: (status, dispatched)
            for ref, status, dispatched in conn.execute(
                "SELECT id, status, dispatched_attempt FROM outbox.tool_calls"
            ).fetchall()
        }
        retried = conn.execute(
            "SELECT tool_call_ref, attempt, worker, detail FROM outbox.journal"
            " WHERE event = 'tool_call.retry_scheduled' ORDER BY tool_call_ref"
        ).fetchall()
    assert rows[charged] == ("ready", 1, 30)
    assert rows[unsent] == ("ready", 1, 30)  # unsent, but no deadline: charged
    assert rows[deferred] == ("ready", 0, 60)
    assert rows[elsewhere][0] == "leased"
    assert over_1 not in rows and over_2 not in rows  # their run is over: dropped
    assert calls[charged] == ("pending", 1)  # the attempt may have reached the tool
    assert calls[unsent] == ("pending", None)  # it never did: its mark taken back
    assert calls[over_1][0] == calls[over_2][0] == "cancelled"
    assert retried == [
        (charged, 1, WORKER, {"error": "HTTP 500 from stub", "delay_s": 30.0}),
        (unsent, 1, WORKER, {"error": "refused", "delay_s": 30.0}),
        (deferred, 1, WORKER, {"error": "over its limit", "delay_s": 60.0}),
    ]
    seen = events(db_url)
    assert seen["write.fenced"] == 3 and seen["tool_call.dropped"] == 2
