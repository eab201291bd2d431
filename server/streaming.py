"""``stream=true``: a run's progress as OpenAI's ``thread.*`` Server-Sent Events.

The run advances in other processes (the relay), so the stream is read from the database:
every poll reads the run, its steps and its messages in one transaction and sends what
changed since the last poll, as OpenAI named it: ``thread.run.<status>`` when the status
changes, ``thread.run.step.created`` / ``.completed`` for each model turn,
``thread.message.created`` / ``.delta`` (the whole text in one delta) / ``.completed`` for
each assistant message. The stream ends with ``done`` once the run ends or waits in
``requires_action`` (the caller then submits outputs, with ``stream=true`` again). Every
event carries the whole object, so a client that reconnects and polls the run loses
nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from outbox.constants import ENDED
from outbox.server import actions
from outbox.server.db_pool import Store
from outbox.server.thread_pool import in_thread
from outbox.server.wakeups import Wakeups, Watch

POLL_S = 0.2  # seconds between two reads of the run
# A stream ends when the run waits for the client or is over ("incomplete" is OpenAI's word
# for a run that hit a limit, shapes.run_status).
STOPS = ("requires_action", *ENDED, "incomplete")
Row = dict[str, Any]


def sse(event: str, data: Row | str) -> Row:
    return {"event": event, "data": data if isinstance(data, str) else json.dumps(data)}


def message_events(message: Row) -> list[Row]:
    """An assistant message as OpenAI streamed one: created empty, one delta, completed."""
    text = message["content"][0]["text"]["value"]
    created = {**message, "status": "in_progress", "content": [], "completed_at": None}
    delta = {
        "id": message["id"],
        "object": "thread.message.delta",
        "delta": {
            "content": [{"index": 0, "type": "text", "text": {"value": text, "annotations": []}}]
        },
    }
    return [
        sse("thread.message.created", created),
        sse("thread.message.in_progress", created),
        sse("thread.message.delta", delta),
        sse("thread.message.completed", message),
    ]


async def stream(
    store: Store,
    tenant: str,
    thread_id: uuid.UUID,
    run_id: uuid.UUID,
    opening: list[Row],
    status: str | None,
    hub: Wakeups,
) -> AsyncIterator[Row]:
    """The events of a run from now on, after ``opening`` (e.g. ``thread.run.created``);
    ``status``: the run's status the caller already announced. Reads again every
    ``POLL_S``, at once when the run's status changes (``hub``, server.wakeups)."""
    for event in opening:
        yield event
    with hub.watch(run_id) as watch:
        async for event in _changes(store, tenant, thread_id, run_id, status, watch):
            yield event


async def _changes(
    store: Store,
    tenant: str,
    thread_id: uuid.UUID,
    run_id: uuid.UUID,
    status: str | None,
    watch: Watch,
) -> AsyncIterator[Row]:
    steps_done: dict[str, str] = {}
    messages_sent: set[str] = set()
    while True:
        watch.clear()  # before the read: a change during it wakes the wait below
        run, steps, messages = await in_thread(actions.run_state, store, tenant, thread_id, run_id)
        for step in steps:
            before = steps_done.get(step["id"])
            if before is None:
                yield sse("thread.run.step.created", {**step, "status": "in_progress"})
            if step["status"] != "in_progress" and before != step["status"]:
                yield sse(f"thread.run.step.{step['status']}", step)
            steps_done[step["id"]] = step["status"]
        for message in messages:
            if message["id"] not in messages_sent:
                messages_sent.add(message["id"])
                for event in message_events(message):
                    yield event
        if run["status"] != status:
            status = run["status"]
            yield sse(f"thread.run.{status}", run)
        if status in STOPS:
            yield sse("done", "[DONE]")
            return
        await watch.changed(POLL_S)
