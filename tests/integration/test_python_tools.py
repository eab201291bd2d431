"""In-process (python) tools: errors, timeouts, size caps and crashes mid-call.

A python tool is called as ``function(**arguments)`` inside the relay. Whatever it does
must end as one of the outcomes an HTTP tool can have: an error result the model sees
(import errors, exceptions, results that are not JSON or over the cap), or, when the
outcome is ambiguous (a timeout, a crash of the relay mid-call), the tool's idempotency
mode decides: ``key`` retries, ``none`` goes to ``outcome_unknown`` and is never re-run.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import registry
from outbox.relay import inprocess
from tests import tooling
from tests.relay_harness import (
    all_settled,
    relay_thread,
    scalar,
    seed,
    start_relay_process,
    tool_call_states,
    wait_until,
)

FAST = ["--lease", "2", "--rescue-interval", "0.3", "--retry-base", "0.05"]
FAST += ["--poll-interval", "0.2"]


def register(db_url: str, name: str, callable_path: str, **kw: Any) -> None:
    spec: dict[str, Any] = {"name": name, "executor": "python", "callable": callable_path}
    spec.update(kw)
    with psycopg.connect(db_url) as conn:
        registry.register(conn, registry.ToolSpec(**spec))
        conn.commit()


@pytest.fixture(autouse=True)
def release_blocked_tools() -> Iterator[None]:
    tooling.RELEASE.clear()
    yield
    tooling.RELEASE.set()  # let any pool thread still waiting return
    wait_until(lambda: inprocess.overrunning() == 0, what="kept tool threads to return")


def error_of_the_result(db_url: str) -> str:
    return str(scalar(db_url, "SELECT error FROM outbox.tool_results"))


def test_python_tool_result_is_stored_and_delivered(db_url):
    register(db_url, "echo", "tests.tooling:echo")
    seed(db_url, ["echo"], runs=2, calls_per_batch=3, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    assert tool_call_states(db_url) == {"succeeded": 6}
    outputs = scalar(
        db_url, "SELECT array_agg(output ORDER BY tool_call_ref) FROM outbox.tool_results"
    )
    assert outputs[0] == {"echo": {"n": 0}}
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 2


@pytest.mark.parametrize(
    ("callable_path", "expected"),
    [
        ("tests.no_such_module:fn", "cannot load python tool"),
        ("tests.tooling:no_such_function", "cannot load python tool"),
        ("tests.tooling:boom", "ValueError: boom with ['n']"),
        ("tests.tooling:exits", "SystemExit: 3"),
        ("tests.tooling:too_big", "over the cap"),
        ("tests.tooling:not_json", "not JSON"),
    ],
)
def test_failures_become_error_results_the_model_sees(db_url, callable_path, expected):
    register(db_url, "tool", callable_path)
    seed(db_url, ["tool"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url))
    assert tool_call_states(db_url) == {"failed": 1}
    assert expected in error_of_the_result(db_url)
    content = scalar(db_url, "SELECT content FROM outbox.messages WHERE role = 'tool'")
    assert expected.split(" ")[0] in content


def test_timeout_of_a_key_tool_is_retried_then_quarantined(db_url):
    register(db_url, "slow", "tests.tooling:block", timeout_s=0.2, max_attempts=2)
    seed(db_url, ["slow"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert tool_call_states(db_url) == {"quarantined": 1}
    assert "did not return within 0.2s" in scalar(
        db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'"
    )
    retries = "SELECT count(*) FROM outbox.journal WHERE event = 'tool_call.retry_scheduled'"
    assert scalar(db_url, retries) == 1


def test_a_worker_whose_tool_threads_are_all_kept_stops_to_be_restarted(db_url, monkeypatch):
    """Python cannot stop a thread: once every in-process tool thread has stayed kept by a
    call that overran (for ``WEDGED_FOR_S``), no python tool can run in this process. The
    worker stops as on SIGTERM (the call's retry written, nothing lost) and returns the
    exit code that asks for a fresh process."""
    from outbox.relay import worker
    from tests.relay_harness import config

    pool = ThreadPoolExecutor(1)
    monkeypatch.setattr(inprocess, "_pool", pool)
    monkeypatch.setattr(inprocess, "_pool_threads", 1)
    monkeypatch.setattr(worker, "WEDGED_FOR_S", 0.5)
    register(db_url, "stuck", "tests.tooling:block", timeout_s=0.2)
    seed(db_url, ["stuck"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    relay = worker.Worker(config(db_url, inprocess_threads=1))
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(relay.run()))
    thread.start()
    thread.join(timeout=60)
    stopped = not thread.is_alive()
    if not stopped:
        relay.stop()
        thread.join(timeout=30)
    tooling.RELEASE.set()
    pool.shutdown(wait=True)
    assert stopped, "the wedged worker did not stop by itself"
    assert codes == [worker.WEDGED_EXIT_CODE]
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT status, lease_owner, last_error FROM outbox.outbox WHERE kind = 'tool_call'"
        ).fetchone()
    assert row is not None
    assert row[:2] == ("ready", None)  # the retry was written; nothing is left leased
    assert "tests.tooling:block did not" in row[2]  # return, or start while wedged


def test_timeout_of_a_none_tool_is_outcome_unknown_and_not_repeated(db_url):
    register(db_url, "slow", "tests.tooling:block", timeout_s=0.2, idempotency_mode="none")
    seed(db_url, ["slow"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert tool_call_states(db_url) == {"outcome_unknown": 1}
    assert scalar(db_url, "SELECT dispatched_attempt FROM outbox.tool_calls") == 1
    assert "outcome unknown" in scalar(
        db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'"
    )


@pytest.mark.parametrize(
    ("mode", "state", "runs"), [("key", "succeeded", 2), ("none", "outcome_unknown", 1)]
)
def test_crash_mid_call_follows_the_idempotency_mode(db_url, tmp_path, mode, state, runs):
    evidence = tmp_path / "runs.txt"
    register(db_url, "crashy", "tests.tooling:record_run", idempotency_mode=mode)
    seed(db_url, ["crashy"], runs=1, calls_per_batch=1, args=lambda n: {"path": str(evidence)})
    log = tmp_path / "relay.log"
    first = start_relay_process(db_url, log, *FAST)
    try:
        wait_until(lambda: evidence.exists(), what="the tool to be mid-call")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    # The relay that takes over runs in a thread: only the killed one must be a process.
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.tool_calls WHERE status = %s", [state]
            ),
            what=f"the call to end {state}",
        )
    assert len(evidence.read_text().splitlines()) == runs
    assert tool_call_states(db_url) == {state: 1}
    if mode == "none":
        assert "may have reached the tool" in scalar(
            db_url, "SELECT last_error FROM outbox.outbox WHERE kind = 'tool_call'"
        )
    else:
        assert scalar(db_url, "SELECT output FROM outbox.tool_results") == {"runs": 2}
    assert Path(log).exists()


def test_lookup_mode_needs_somewhere_to_look_in_the_registry_and_the_database(db_url):
    """Without a lookup endpoint, "lookup" would mean "call again after a crash": a python
    tool in that mode is refused by the registry and by the database's constraint."""
    with pytest.raises(ValueError, match="'lookup' needs a lookup_endpoint"):
        registry.ToolSpec(
            name="py", executor="python", callable="tests.tooling:echo", idempotency_mode="lookup"
        )
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO outbox.tools (name, version, executor, callable, idempotency_mode) "
            "VALUES ('py', 1, 'python', 'tests.tooling:echo', 'lookup')"
        )


def test_a_call_planned_in_lookup_mode_without_a_lookup_is_never_called_again(db_url, tmp_path):
    """A call planned as 'lookup' before the registry refused it (its tool has nowhere to
    look): after an ambiguous attempt it is outcome_unknown, never called on a guess."""
    evidence = tmp_path / "runs.txt"
    register(db_url, "crashy", "tests.tooling:record_run", idempotency_mode="none")
    seed(db_url, ["crashy"], runs=1, calls_per_batch=1, args=lambda n: {"path": str(evidence)})
    with psycopg.connect(db_url) as conn:
        # What a relay that died mid-call leaves of such a call.
        conn.execute(
            "UPDATE outbox.tool_calls SET idempotency_mode = 'lookup', dispatched_attempt = 1, "
            "dispatched_at = now() - interval '1 hour', status = 'running'"
        )
        conn.execute(
            "UPDATE outbox.outbox SET status = 'leased', attempts = 1, lease_owner = 'dead', "
            "lease_expires_at = now() - interval '1 second' WHERE kind = 'tool_call'"
        )
        conn.commit()
    with relay_thread(db_url):
        wait_until(
            lambda: scalar(
                db_url, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'"
            )
        )
    assert not evidence.exists()  # the function was not called again
    assert tool_call_states(db_url) == {"outcome_unknown": 1}
