"""The relay's hot path keeps its shape (docs/benchmarks.md says what each part bought).

- every statement of a claim and of a completion finds its rows by primary key, so its cost
  does not grow with the backlog or with the dead entries of the lease index;
- relay connections prepare their statements on generic plans, and those plans find rows
  by primary key (a fenced delete through the lease index grew with its dead entries);
- a result's status update on its call is a HOT update (no index entry written);
- rows claimed and not yet written never exceed the I/O slots (and a row waiting behind
  each) and in-process slots together; busy slots claim in gulps, not row by row.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from outbox import registry
from outbox.relay.outcomes import Outcome
from outbox.relay.worker import Link, Worker
from tests.relay_harness import config, scalar, seed


@pytest.fixture
def python_tool(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="echo", executor="python", callable="tests.tooling:echo")
        registry.register(conn, spec)
        conn.commit()
    return "echo"


def scans(plan: Any) -> set[tuple[str, str]]:
    """Every (node type, relation) of a JSON plan."""
    found: set[tuple[str, str]] = set()
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.add((plan["Node Type"], plan["Relation Name"]))
        for value in plan.values():
            found |= scans(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= scans(value)
    return found


def generic_plans(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The generic plan (JSON) of every statement prepared on ``conn``, by statement text.
    Under force_generic_plan the arguments cannot change a plan, so NULLs stand for them."""
    plans = {}
    prepared = conn.execute(
        "SELECT name, statement, cardinality(parameter_types) FROM pg_prepared_statements"
    ).fetchall()
    for name, statement, n in prepared:
        args = f"({', '.join(['NULL'] * n)})" if n else ""
        plan = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}{args}").fetchone()
        assert plan is not None
        plans[statement] = plan[0]
    return plans


def nested_plans(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """From now on, the plan (JSON) of every statement ``conn`` runs, by statement text,
    also those run inside SQL functions (``record_tool_results_v1``), which
    ``pg_prepared_statements`` does not list: auto_explain, sent back as notices."""
    plans: dict[str, Any] = {}

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        _, found, text = (diagnostic.message_primary or "").partition("plan:")
        if found:
            plan = json.loads(text)
            plans[plan["Query Text"]] = plan

    conn.add_notice_handler(keep)
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = json",
        "SET auto_explain.log_level = notice",
    ):
        conn.execute(setting, prepare=False)
    conn.commit()
    return plans


def drain(worker: Worker, claim_link: Link, completion_link: Link) -> None:
    """Claim and complete as the relay does: results, batch completions, deliveries."""
    while claimed := worker._claim(claim_link, 120):
        worker.completer.write(
            completion_link,
            [
                Outcome(row, "deliver")
                if row.kind == "deliver_batch"
                else Outcome(row, "result", "ok", {"n": row.id})
                for row in claimed
            ],
        )


def test_relay_statements_run_on_generic_plans_that_find_rows_by_primary_key(db_url, python_tool):
    worker = Worker(config(db_url))
    # Plans made with the statistics of nearly empty results, messages and journal, the
    # worst case: a generic plan keeps them while those tables grow by thousands a second.
    seed(db_url, [python_tool], runs=40, calls_per_batch=50, args=lambda n: {"n": n})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    claim_link, completion_link = worker.claim_link(), worker.completer.new_link()
    # Results are recorded inside record_tool_results_v1: its statements' plans (cached by
    # the function on the link's session, under its settings) are caught as they run.
    nested = nested_plans(completion_link.get())
    drain(worker, claim_link, completion_link)  # the links prepare every statement they run
    modes = {
        link.get()
        .execute("SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan')")
        .fetchone()
        for link in (claim_link, completion_link)
    }
    plans = nested | generic_plans(claim_link.get()) | generic_plans(completion_link.get())
    claim_link.close()
    completion_link.close()

    def plan_of(fragment: str) -> Any:
        found = [plan for statement, plan in plans.items() if fragment in statement]
        assert found, f"no prepared statement holds {fragment!r}"
        return found[0]

    assert modes == {("force_generic_plan", "off")}
    # The claim, the fence, the result write, the delivery enqueue and the tool messages of
    # a delivery were all prepared (or run inside record_tool_results_v1, on the link's
    # generic plans), so the loop below looks at the relay's own plans.
    for fragment in (
        "FOR UPDATE OF o SKIP LOCKED",
        "DELETE FROM",
        'INSERT INTO "outbox".tool_results',
        '"outbox".deliver_key_v1(',
        'INSERT INTO "outbox".messages',
    ):
        plan_of(fragment)
    for statement, plan in plans.items():
        full_scans = {rel for node, rel in scans(plan) if node == "Seq Scan"}
        assert not full_scans & {"outbox", "tool_calls", "tool_results", "messages", "journal"}, (
            statement
        )
    # The fence finds each row by primary key, not through the lease index: the planner's
    # statistics see that one nearly empty, while every finished row leaves a dead entry.
    # The fair claim walks the tenants through their ready rows' index, one probe each.
    claim = json.dumps(plan_of("FOR UPDATE OF o SKIP LOCKED"))
    assert '"outbox_ready_tenant"' in claim, claim
    fence = json.dumps(plan_of("DELETE FROM"))
    assert '"outbox_pkey"' in fence and "outbox_leased" not in fence, fence


def test_a_result_updates_its_call_without_writing_an_index_entry(db_url, python_tool):
    seed(db_url, [python_tool], runs=2, calls_per_batch=10, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    link = worker.claim_link()
    claimed = worker._claim(link, 20)
    link.close()
    outcomes = sorted(
        (Outcome(row, "result", "ok", {"n": row.id}) for row in claimed),
        key=lambda o: (o.row.batch_id or 0, o.row.id),
    )
    with psycopg.connect(db_url) as conn:
        applied = worker.completer.apply_all(conn, outcomes)
        updated, hot = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('outbox.tool_calls'::regclass), "
            "pg_stat_get_xact_tuples_hot_updated('outbox.tool_calls'::regclass)"
        ).fetchone()  # type: ignore[misc]
        conn.commit()
    assert applied == ["result_stored"] * 20
    assert updated == 20
    assert hot == 20  # an index on a column the update changes would make this 0


def test_claimed_rows_share_the_strings_of_few_values(db_url):
    """Every effect in flight keeps its claimed row, thousands at once: its kind, tenant,
    tool, mode, executor and endpoint are one string for all rows, not one a row."""
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="remote", executor="http", endpoint="http://127.0.0.1:9")
        registry.register(conn, spec)
        conn.commit()
    seed(db_url, ["remote"], runs=2, calls_per_batch=2, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    link = worker.claim_link()
    first, *others = worker._claim(link, 10)
    link.close()
    assert len(others) == 3
    for name in ("kind", "tenant_id", "tool_name", "idempotency_mode", "executor", "endpoint"):
        assert getattr(first, name) is not None
        assert all(getattr(row, name) is getattr(first, name) for row in others), name


def test_claims_never_hold_more_than_both_capacities(db_url, python_tool):
    seed(db_url, [python_tool], runs=3, calls_per_batch=10, args=lambda n: {"n": n})
    worker = Worker(config(db_url, concurrency=2, inprocess_slots=4))
    link = worker.claim_link()
    # Before any in-process row: one per I/O place.
    first = worker._claim(link, worker._free())
    second = worker._claim(link, worker._free())  # in-process rows seen: their slots too
    assert (len(first), len(second)) == (2, 4)
    assert worker._free() == 0  # 6 claimed, none written: 2 I/O places + 4 in-process slots
    # Three finish executing but are not written yet: still no room.
    worker._finished(3, 0)
    assert worker._free() == 0
    # Once written, they make room for three more.
    done = [Outcome(row, "result", "ok", {}) for row in second[:3]]
    worker._written(done)
    assert worker._free() == 3
    third = worker._claim(link, worker._free())
    link.close()
    assert len(third) == 3
    leased = scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'leased'")
    assert leased == 9  # nothing was completed in the database: all still leased


def test_busy_slots_claim_in_gulps_not_one_row_per_freed_slot(db_url):
    """A claim or a completion of one row costs nearly what one of ten does: while I/O rows
    are in flight, the claim waits until half the places' worth has room."""
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="remote", executor="http", endpoint="http://127.0.0.1:9")
        registry.register(conn, spec)
        conn.commit()
    seed(db_url, ["remote"], runs=2, calls_per_batch=10, args=lambda n: {"n": n})
    worker = Worker(config(db_url, concurrency=4))
    assert worker._free() == 4  # idle: every place
    link = worker.claim_link()
    assert len(worker._claim(link, worker._free())) == 4
    worker._finished(1, 1)  # one place frees: one row would be a claim too small
    assert worker._free() == 0
    worker._finished(1, 1)  # half the places' worth
    assert worker._free() == 2
    assert len(worker._claim(link, worker._free())) == 2
    link.close()


def test_a_delivery_never_waits_behind_a_busy_slot(db_url):
    """A delivery has no effect outside the database and must not wait for other runs'
    slow tool calls: it goes to its completer, whatever the engine holds."""
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(name="remote", executor="http", endpoint="http://127.0.0.1:9")
        registry.register(conn, spec)
        conn.commit()
    seed(db_url, ["remote"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id)"
            " SELECT tenant_id, 'deliver_batch', 'deliver:' || id, thread_id, run_id, id"
            " FROM outbox.tool_batches"
        )
        conn.commit()
    worker = Worker(config(db_url, concurrency=1, kinds=("deliver_batch",)))
    worker.executing = worker.io_executing = 1  # the only place is busy with a slow call
    assert worker._free() == 0
    link = worker.claim_link()
    try:
        (row,) = worker._claim(link, 1)
        worker._dispatch([row])
        queued = [q.get_nowait() for q in worker.outcomes if not q.empty()]
    finally:
        link.close()
    assert [(o.row.id, o.action) for o in queued] == [(row.id, "deliver")]


@pytest.mark.parametrize(
    "change",
    [
        "status = 'ready', lease_expires_at = NULL",  # released, the owner left behind
        "status = 'ready', lease_owner = NULL",  # released, the expiry left behind
    ],
)
def test_a_lease_owner_always_means_a_leased_row(db_url, python_tool, change):
    """The fences test the lease holder, not the status: the database must make the one
    imply the other (migration 0006), or a stale holder could finish a requeued row."""
    seed(db_url, [python_tool], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    link = worker.claim_link()
    (row,) = worker._claim(link, 1)
    link.close()
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE outbox.outbox SET {change} WHERE id = %s", (row.id,))
