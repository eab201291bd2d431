"""The relay's hot path keeps its shape (docs/benchmarks.md says what each part bought).

- every statement of a claim and of a completion finds its rows by primary key, so its cost
  does not grow with the backlog or with the dead entries of the lease index;
- relay connections prepare no statements (a prepared statement drifts to a generic plan
  that cannot see how many ids an array holds);
- a result's status update on its call is a HOT update (no index entry written);
- rows claimed and not yet written never exceed the I/O slots and in-process slots together.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from outbox import registry
from relay.outcomes import Outcome
from relay.worker import Link, Worker
from tests.relay_harness import config, scalar, seed

CLAIM = {"worker": "w", "lease_s": 30, "kinds": ["tool_call"]}


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


def explain(conn: psycopg.Connection[Any], query: Any, params: dict[str, Any]) -> set[Any]:
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
    assert plan is not None
    return scans(plan[0])


def test_claim_and_completion_find_rows_by_primary_key(db_url, python_tool):
    seed(db_url, [python_tool], runs=40, calls_per_batch=50, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    worker.http.close()
    q = worker.q
    with psycopg.connect(db_url) as conn:
        conn.execute("ANALYZE")
        claim_plan = explain(conn, q.claim, {"limit": 200, **CLAIM})
        rows = conn.execute(q.claim, {"limit": 200, **CLAIM}).fetchall()
        ids, refs = [r[0] for r in rows], [r[6] for r in rows]
        finish_plan = explain(
            conn, q.finish_many, {"ids": ids, "attempts": [1] * len(ids), "worker": "w"}
        )
        results = [{"ref": ref, "status": "ok", "source": "relay", "attempt": 1} for ref in refs]
        store_plan = explain(
            conn, q.store_results, {"results": Jsonb(results), "refs": refs, "worker": "w"}
        )
        conn.rollback()
    assert len(rows) == 200
    for plan in (claim_plan, finish_plan, store_plan):
        # The tables that grow with the backlog are never scanned (tiny ones, like the 40
        # runs here, may be: a seq scan of one page is the cheapest plan there).
        full_scans = {rel for node, rel in plan if node == "Seq Scan"}
        assert not full_scans & {"outbox", "tool_calls"}, plan


def test_completers_prepare_no_statements(db_url):
    worker = Worker(config(db_url))
    worker.http.close()
    link = worker.completion_link()
    conn = link.get()
    for _ in range(8):  # psycopg prepares a statement on its 5th execution by default
        with conn.transaction():
            conn.execute(worker.q.finish_many, {"ids": [1], "attempts": [1], "worker": "w"})
    prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    link.close()
    assert prepared == (0,)


def test_a_result_updates_its_call_without_writing_an_index_entry(db_url, python_tool):
    seed(db_url, [python_tool], runs=2, calls_per_batch=10, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    worker.http.close()
    link = Link(db_url, "claim")
    claimed = worker._claim(link, 20)
    link.close()
    outcomes = sorted(
        (Outcome(row, "result", "ok", {"n": row.id}) for row in claimed),
        key=lambda o: (o.row.batch_id or 0, o.row.id),
    )
    with psycopg.connect(db_url) as conn:
        applied = worker._apply_all(conn, outcomes)
        updated, hot = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('outbox.tool_calls'::regclass), "
            "pg_stat_get_xact_tuples_hot_updated('outbox.tool_calls'::regclass)"
        ).fetchone()  # type: ignore[misc]
        conn.commit()
    assert applied == ["result_stored"] * 20
    assert updated == 20
    assert hot == 20  # an index on a column the update changes would make this 0


def test_claims_never_hold_more_than_both_capacities(db_url, python_tool):
    seed(db_url, [python_tool], runs=3, calls_per_batch=10, args=lambda n: {"n": n})
    worker = Worker(config(db_url, concurrency=2, inprocess_slots=4))
    worker.http.close()
    link = Link(db_url, "claim")
    first = worker._claim(link, worker._free())  # before any in-process row: one per slot
    second = worker._claim(link, worker._free())  # in-process rows seen: the slots grow
    assert (len(first), len(second)) == (2, 4)
    assert worker._free() == 0  # 6 claimed, none written: 2 slots + 4 in-process slots
    # Three finish executing but are not written yet: still no room.
    worker._finished(3, 0)
    assert worker._free() == 0
    # Once written, they make room for three more.
    done = [Outcome(row, "result", "ok", {}) for row in first + second[:1]]
    worker._after_commit(done, ["result_stored"] * 3)
    assert worker._free() == 3
    third = worker._claim(link, worker._free())
    link.close()
    assert len(third) == 3
    leased = scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'leased'")
    assert leased == 9  # nothing was completed in the database: all still leased
