"""The I/O engine's tasks, without a database: what each effect's task holds, and what
its end hands to the worker (an outcome, a retry when its executor crashed, nothing when
it was cancelled at shutdown)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from outbox.relay.engine import Engine
from outbox.relay.outcomes import Claimed, Outcome


def row(n: int) -> Claimed:
    return Claimed(n, "webhook", "acme", None, None, None, None, None, 1, 0, 3, None, 0.0)


class Harness:
    """An engine whose webhook executor is ``executor``, recording what it finished."""

    def __init__(self, executor: Any) -> None:
        preparer: Any = SimpleNamespace(mark=None, turn=None, read=None, held_until={})
        self.ended: dict[int, Outcome | None] = {}
        self.all_ended = threading.Event()
        self.expected = 0
        self.engine = Engine(
            preparer,
            ThreadPoolExecutor(1),
            self.finished,
            lambda _row: True,
        )
        self.engine.executors["webhook"] = executor
        self.engine.start()

    def finished(self, claimed: Claimed, outcome: Outcome | None) -> None:
        self.ended[claimed.id] = outcome
        if len(self.ended) == self.expected:
            self.all_ended.set()

    def run(self, rows: list[Claimed]) -> dict[int, Outcome | None]:
        self.expected = len(rows)
        self.engine.submit(rows)
        assert self.all_ended.wait(10)
        return self.ended


def test_an_effect_ends_with_its_outcome_or_a_retry_when_its_executor_crashed():
    async def executor(claimed: Claimed) -> Outcome:
        if claimed.id == 2:
            raise RuntimeError("boom")
        return Outcome(claimed, "webhook", output=200)

    harness = Harness(executor)
    try:
        ended = harness.run([row(1), row(2)])
    finally:
        harness.engine.stop()
    first, second = ended[1], ended[2]
    assert first is not None and (first.action, first.output) == ("webhook", 200)
    assert second is not None and second.action == "retry"
    assert second.error == "executor crashed: RuntimeError: boom"
    assert not harness.engine.tasks


def test_a_waiting_effect_is_its_executors_coroutine_alone_and_cancelled_ends_unrun():
    """A task per effect in flight, thousands at once: no coroutine of the engine's own
    around the executor's (its frame would be kept by each)."""
    started = threading.Event()

    async def executor(claimed: Claimed) -> Outcome:
        started.set()
        await asyncio.Event().wait()  # an answer that never comes
        raise AssertionError("not reached")

    harness = Harness(executor)
    harness.expected = 1
    try:
        harness.engine.submit([row(7)])
        assert started.wait(10)
        (task,) = list(harness.engine.tasks)
        assert task.get_coro().cr_code is executor.__code__  # type: ignore[union-attr]
    finally:
        harness.engine.stop()  # cancels what still runs
    assert harness.all_ended.wait(10)
    assert harness.ended == {7: None}
