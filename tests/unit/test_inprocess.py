"""In-process tool calls run in chunks (``relay.inprocess``): each call keeps its own timeout.

No database here: a chunk runner turns claimed rows into outcomes, and these tests check
that a call overrunning in the middle of a chunk ends ambiguous while the calls before it
keep their results and the calls after it still run, once each.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from outbox.relay import inprocess
from outbox.relay.outcomes import Claimed, Outcome
from tests import tooling
from tests.relay_harness import wait_until


def row(n: int, callable_path: str, arguments: dict[str, Any], **kw: Any) -> Claimed:
    values: dict[str, Any] = {
        "id": n,
        "kind": "tool_call",
        "tenant_id": "acme",
        "thread_id": None,
        "run_id": None,
        "batch_id": 1,
        "tool_call_ref": n,
        "correlation_id": None,
        "attempt": 1,
        "failures": 0,
        "max_attempts": 5,
        "payload": {},
        "lag_s": 0.0,
        "executor": "python",
        "idempotency_mode": "key",
        "callable": callable_path,
        "arguments": arguments,
        "timeout_s": 5.0,
    }
    values.update(kw)
    return Claimed(**values)


def by_id(outcomes: list[Outcome]) -> dict[int, Outcome]:
    return {o.row.id: o for o in outcomes}


@pytest.fixture(autouse=True)
def release_blocked_tools() -> Iterator[None]:
    tooling.RELEASE.clear()
    yield
    tooling.RELEASE.set()  # let any pool thread still waiting return
    wait_until(lambda: inprocess.overrunning() == 0, what="kept tool threads to return")


def test_every_call_of_a_chunk_gets_its_result(tmp_path: Path):
    evidence = tmp_path / "runs.txt"
    rows = [row(i, "tests.tooling:count_call", {"path": str(evidence)}) for i in range(50)]
    outcomes = by_id(inprocess.run_calls(rows))
    assert sorted(outcomes) == list(range(50))
    assert {o.action for o in outcomes.values()} == {"result"}
    assert {o.status for o in outcomes.values()} == {"ok"}
    assert len(evidence.read_text().splitlines()) == 50  # each ran exactly once


@pytest.mark.parametrize(("mode", "action"), [("key", "retry"), ("none", "unknown")])
def test_a_call_overrunning_mid_chunk_is_ambiguous_and_the_rest_still_run(
    tmp_path: Path, mode: str, action: str
):
    evidence = tmp_path / "runs.txt"
    counted = {"path": str(evidence)}
    rows = [row(i, "tests.tooling:count_call", counted) for i in range(3)]
    rows.append(row(3, "tests.tooling:block", {}, timeout_s=0.2, idempotency_mode=mode))
    rows += [row(i, "tests.tooling:count_call", counted) for i in range(4, 7)]
    outcomes = by_id(inprocess.run_calls(rows))
    assert sorted(outcomes) == list(range(7))
    overran = outcomes.pop(3)
    assert overran.action == action
    assert "did not return within 0.2s" in (overran.error or "")
    assert {o.status for o in outcomes.values()} == {"ok"}
    # The calls after the overrun ran in a new chunk, once each; none ran twice.
    assert len(evidence.read_text().splitlines()) == 6
    tooling.RELEASE.set()


def test_a_short_timeout_after_a_long_one_is_watched_from_its_own_start():
    # The chunk is watched against the first call's 60 s deadline while it runs; the next
    # call's 0.2 s deadline comes sooner and must be watched from when it starts. (Were it
    # not, ``block`` would answer after its 10 s and be stored as a result.)
    rows = [row(1, "tests.tooling:pause", {"seconds": 0.3}, timeout_s=60.0)]
    rows.append(row(2, "tests.tooling:block", {}, timeout_s=0.2))
    outcomes = by_id(inprocess.run_calls(rows))
    assert outcomes[1].output == {"paused": 0.3}
    assert outcomes[2].action == "retry"
    assert "did not return within 0.2s" in (outcomes[2].error or "")


def test_a_chunk_that_cannot_start_is_retried_without_running(tmp_path: Path, monkeypatch):
    stuck_pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(inprocess, "_pool", stuck_pool)
    stuck = stuck_pool.submit(tooling.block)  # the pool's only thread is stuck in a tool
    evidence = tmp_path / "runs.txt"
    rows = [
        row(i, "tests.tooling:count_call", {"path": str(evidence)}, timeout_s=0.2) for i in range(3)
    ]
    outcomes = inprocess.run_calls(rows)
    assert [o.action for o in outcomes] == ["retry"] * 3
    assert all("did not start within 0.2s" in (o.error or "") for o in outcomes)
    tooling.RELEASE.set()
    stuck.result(timeout=10)
    stuck_pool.shutdown(wait=True)
    assert not evidence.exists()  # the cancelled chunk never ran a call


def test_a_thread_kept_by_an_overrun_counts_until_its_call_returns(monkeypatch):
    """Every thread kept by a call that overran means a wedged pool, and only then."""
    pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(inprocess, "_pool", pool)
    monkeypatch.setattr(inprocess, "_pool_threads", 1)
    assert not inprocess.wedged()
    (outcome,) = inprocess.run_calls([row(1, "tests.tooling:block", {}, timeout_s=0.2)])
    assert outcome.action == "retry"
    assert (inprocess.overrunning(), inprocess.wedged()) == (1, True)
    tooling.RELEASE.set()  # the call returns at last: its thread is free again
    wait_until(lambda: inprocess.overrunning() == 0, what="the overrun to be released")
    assert not inprocess.wedged()
    pool.shutdown(wait=True)


EXIT_WITH_A_KEPT_THREAD = """
import sys
from outbox.relay import inprocess, worker
from tests.unit.test_inprocess import row
inprocess.run_calls([row(1, "tests.tooling:hang", {}, timeout_s=0.2)])
assert inprocess.overrunning() == 1
worker.leave_process(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 75])
def test_a_process_leaves_even_with_a_tool_thread_kept_for_good(code):
    """The interpreter joins pool threads at exit: one kept by a call that never returns
    would hold a stopped worker process forever (after SIGTERM, code 0, or wedged, 75)."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_A_KEPT_THREAD, str(code)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=60,  # a hang fails here
    )
    assert done.returncode == code, done.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    ("callable_path", "expected"),
    [
        ("tests.no_such_module:fn", "cannot load python tool"),
        ("tests.tooling:boom", "ValueError: boom"),
        ("tests.tooling:exits", "SystemExit: 3"),
        ("tests.tooling:too_big", "over the cap"),
        ("tests.tooling:not_json", "not JSON"),
    ],
)
def test_failures_in_a_chunk_are_error_results_beside_good_ones(callable_path, expected):
    rows = [row(1, "tests.tooling:echo", {"n": 1}), row(2, callable_path, {"n": 2})]
    rows.append(row(3, "tests.tooling:echo", {"n": 3}))
    outcomes = by_id(inprocess.run_calls(rows))
    assert outcomes[1].output == {"echo": {"n": 1}} and outcomes[3].status == "ok"
    assert outcomes[2].action == "result" and outcomes[2].status == "error"
    assert expected in (outcomes[2].error or "")
