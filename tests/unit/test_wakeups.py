"""Which notifications wake which watchers of a run (``server.wakeups``), without a
database: a request waiting for its response to settle is not woken (and reads nothing) at
a status that cannot settle it, and is at every other, or when the status is unknown."""

from __future__ import annotations

import asyncio
import json
import uuid

from outbox.server.response_stream import UNSETTLING
from outbox.server.wakeups import Wakeups, _run_of


def test_a_settling_waiter_wakes_only_at_a_status_that_can_settle_it():
    async def go() -> list[tuple[str | None, bool, bool]]:
        hub, run = Wakeups("postgresql://unused", listen=False), uuid.uuid4()
        seen = []
        with hub.watch(run, UNSETTLING) as waiting, hub.watch(run) as streaming:
            for status in ("queued", "in_progress", "requires_action", None, "completed"):
                waiting.clear()
                streaming.clear()
                hub.wake(run, status)
                seen.append((status, waiting.flag.is_set(), streaming.flag.is_set()))
            waiting.clear()
            hub.wake(uuid.uuid4(), "completed")  # another run's
            seen.append(("another run", waiting.flag.is_set(), False))
        return seen

    assert asyncio.run(go()) == [
        ("queued", False, True),
        ("in_progress", False, True),
        ("requires_action", True, True),
        (None, True, True),
        ("completed", True, True),
        ("another run", False, False),
    ]


def test_a_notification_names_its_run_and_status_or_wakes_everyone():
    run = uuid.uuid4()
    told = {"run_id": str(run), "status": "completed", "previous_status": "in_progress"}
    assert _run_of(json.dumps(told)) == (run, "completed")
    assert _run_of(json.dumps({"run_id": str(run)})) == (run, None)
    assert _run_of("not json") == (None, None)
    assert _run_of("[1]") == (None, None)
