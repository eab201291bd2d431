"""One lock order (run, then batch) for every writer path, so they queue and never deadlock.

Found by the demo: a backend re-sending its client outputs while the relay delivered the
same batch deadlocked (delivery took the batch before the run, the SQL function the run
before the batch).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg

from outbox import lifecycle, registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn
from outbox.testing.tools import FakeToolService
from tests.helpers import new_run, turn
from tests.relay_harness import (
    all_settled,
    look,
    register_tool,
    relay_thread,
    scalar,
    seed,
    wait_until,
)

OUTPUTS = [{"tool_call_id": "c1", "output": {"ok": True}}]


def waiting_backends(db_url: str) -> int:
    return scalar(
        db_url,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )


def test_delivery_and_a_resent_submission_queue_behind_the_run_lock(db_url):
    with psycopg.connect(db_url) as conn:
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        thread = writer.create_thread(conn, "acme")
        run = writer.start_run(
            conn, StartRun(tenant_id="acme", thread_id=thread.id, model="m", tools=["approve"])
        )
        turn = writer.record_model_turn(
            conn,
            ModelTurnIn(
                tenant_id="acme",
                run_id=run.id,
                step_no=1,
                tool_calls=[ToolCallIn(tool_call_id="c1", name="approve", arguments="{}")],
            ),
        )
        assert lifecycle.submit_tool_outputs(conn, "acme", run.id, OUTPUTS) == "in_progress"
        conn.commit()
    errors: list[Any] = []
    results: dict[str, Any] = {}

    def deliver() -> None:
        with psycopg.connect(db_url) as conn:
            try:
                results["deliver"] = writer.deliver_batch(conn, turn.batch_id).outcome
                conn.commit()
            except Exception as err:
                errors.append(err)

    def resubmit() -> None:
        with psycopg.connect(db_url) as conn:
            try:
                results["resubmit"] = lifecycle.submit_tool_outputs(conn, "acme", run.id, OUTPUTS)
                conn.commit()
            except Exception as err:
                errors.append(err)

    with psycopg.connect(db_url) as blocker:
        writer.lock_run(blocker, run.id, None)
        # The resubmission queues for the run first; the delivery comes second. With
        # delivery locking its batch before the run, the two would deadlock on release.
        first = threading.Thread(target=resubmit)
        first.start()
        wait_until(lambda: waiting_backends(db_url) == 1, what="the resubmission to wait")
        second = threading.Thread(target=deliver)
        second.start()
        wait_until(lambda: waiting_backends(db_url) == 2, what="delivery to wait")
        blocker.rollback()
    first.join(timeout=30)
    second.join(timeout=30)
    assert errors == []
    assert results["deliver"] == "delivered"
    assert results["resubmit"] == "in_progress"  # a no-op that returns the run's status
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 1


def test_a_run_locked_by_an_open_transaction_holds_back_its_own_outcomes_only(db_url):
    """An application's transaction left open on a run (a submit before a slow call, a
    leaked session) must not stop the relay's completer, which writes the outcomes of many
    runs, of every tenant, in one transaction: the other runs' results are written while
    that run stays locked, and its own once the lock goes. One completer, so an outcome
    that waited for the lock would hold every other behind it."""
    with FakeToolService(standard_tools=False) as service:
        tool = service.add_tool("keyed", "key")
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "keyed", "key")
            conn.commit()
        seed(db_url, ["keyed"], runs=3, calls_per_batch=1, args=lambda n: {"n": n})
        locked, *free = [r for (r,) in look(db_url, RUNS_OF_CALLS)]
        with (
            psycopg.connect(db_url) as holder,
            relay_thread(db_url, completers=1) as worker,
        ):
            writer.lock_run(holder, locked, None)
            wait_until(
                lambda: results_of(db_url, free) == len(free),
                what="the results of the runs nobody holds",
            )
            wait_until(lambda: len(tool.deliveries) == 3, what="the locked run's call")
            # Its outcome waits, and says so to an operator's alert.
            wait_until(lambda: held_outcomes(worker) == 1, what="the outcome counted as held")
            assert results_of(db_url, [locked]) == 0
            holder.rollback()
            wait_until(lambda: all_settled(db_url), what="the locked run's result once let go")
            assert held_outcomes(worker) == 0
        assert results_of(db_url, [locked]) == 1
        assert len(tool.effects) == 3


RUNS_OF_CALLS = "SELECT run_id FROM outbox.tool_calls ORDER BY run_id"


def held_outcomes(worker: Any) -> float | None:
    return worker.metrics.registry.get_sample_value("outbox_relay_outcomes_held")


def results_of(db_url: str, runs: list[Any]) -> int:
    return scalar(
        db_url,
        "SELECT count(*) FROM outbox.tool_results r JOIN outbox.tool_calls c "
        "ON c.id = r.tool_call_ref WHERE c.run_id = ANY(%s)",
        [runs],
    )


def test_a_late_run_held_by_an_open_transaction_does_not_stop_the_heartbeats(db_url):
    """The relay's maintenance expires runs left waiting for client outputs past their
    deadline, in the transaction between two heartbeats. A late run held by another
    transaction must be skipped, not waited for: waiting stops every heartbeat of that
    relay, and its leases run out under calls still in flight."""
    with FakeToolService(standard_tools=False) as service:
        tool = service.add_tool("keyed", "key")
        tool.stall_after_commit(6.0, n=1)  # in flight all along: 4 s past the checks
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "keyed", "key", timeout_s=10)
            registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
            late = new_run(conn, tools=["approve"])
            writer.record_model_turn(conn, turn(late, 1, ("wait", "approve", {})))
            conn.execute(
                "UPDATE outbox.runs SET action_deadline = now() - interval '1 minute' "
                "WHERE id = %s",
                [late.id],
            )
            conn.commit()
        seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
        lease = "SELECT lease_expires_at FROM outbox.outbox WHERE kind = 'tool_call'"
        with relay_thread(db_url, lease_s=2.0):
            wait_until(lambda: len(tool.deliveries) == 1, what="the call at the tool")
            with psycopg.connect(db_url) as holder:
                writer.lock_run(holder, late.id, None)
                held_at = scalar(db_url, "SELECT now()")
                # A heartbeat 1.5 s after the hold, past several rounds of the sweep.
                wait_until(
                    lambda: (scalar(db_url, lease) or held_at) > held_at + timedelta(seconds=3.5),
                    what="a heartbeat well after the late run was held",
                )
                status = "SELECT status FROM outbox.runs WHERE id = %s"
                assert scalar(db_url, status, [late.id]) == "requires_action"
                holder.rollback()
            wait_until(
                lambda: scalar(db_url, status, [late.id]) == "expired",
                what="the late run expired once let go",
            )
            wait_until(lambda: all_settled(db_url), what="the call in flight to finish")
        assert scalar(db_url, "SELECT attempt FROM outbox.tool_results") == 1  # never rescued
        assert len(tool.effects) == 1


def test_a_sweep_blocked_by_an_open_transaction_does_not_stop_the_heartbeats(db_url):
    """A sweep of the maintenance that meets a lock (here the approval sweep, whose call's
    row an open transaction holds) gives up after a short wait (relay/maintenance.py), and
    tries again at the next round: waiting for it would stop every heartbeat of the relay,
    whose leases would run out under the calls in flight."""
    with FakeToolService(standard_tools=False) as service:
        tool = service.add_tool("keyed", "key")
        tool.stall_after_commit(6.0, n=1)  # in flight all along: 4 s past the checks
        risky = service.add_tool("risky", "key")
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "keyed", "key", timeout_s=10)
            register_tool(conn, service, "risky", "key", requires_approval=True)
            waiting = new_run(conn, tools=["risky"])
            writer.record_model_turn(conn, turn(waiting, 1, ("r1", "risky", {})))
            conn.commit()
        seed(db_url, ["keyed"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
        call_of_approval = "SELECT tool_call_ref FROM outbox.approvals"
        approval = "SELECT status FROM outbox.approvals"
        lease = "SELECT lease_expires_at FROM outbox.outbox WHERE kind = 'tool_call' AND "
        lease += "tool_name = 'keyed'"
        with relay_thread(db_url, lease_s=2.0) as worker:
            wait_until(lambda: len(tool.deliveries) == 1, what="the call at the tool")
            with psycopg.connect(db_url) as holder:
                holder.execute(
                    "SELECT 1 FROM outbox.tool_calls WHERE id = %s FOR UPDATE",
                    [scalar(db_url, call_of_approval)],
                )
                with psycopg.connect(db_url) as conn:  # due now: the next sweep takes it
                    conn.execute("UPDATE outbox.approvals SET deadline = now()")
                    conn.commit()
                held_at = scalar(db_url, "SELECT now()")
                wait_until(
                    lambda: (scalar(db_url, lease) or held_at) > held_at + timedelta(seconds=3.5),
                    what="a heartbeat well after the sweep met the lock",
                )
                assert scalar(db_url, approval) == "pending"
                deferred = worker.metrics.registry.get_sample_value(
                    "outbox_relay_sweeps_deferred_total", {"sweep": "expire_approvals"}
                )
                assert deferred is not None and deferred >= 1
                holder.rollback()
            wait_until(lambda: scalar(db_url, approval) == "expired", what="the sweep once let go")
            wait_until(lambda: len(tool.effects) == 1 and all_settled(db_url), what="the call")
        keyed = "SELECT r.attempt FROM outbox.tool_results r JOIN outbox.tool_calls c "
        keyed += "ON c.id = r.tool_call_ref WHERE c.tool_name = 'keyed'"
        assert scalar(db_url, keyed) == 1  # never rescued: its lease was kept all along
        assert risky.deliveries == []  # denied: nobody approved it in time
