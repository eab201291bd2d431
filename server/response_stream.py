"""``stream=true`` for the Responses protocol: OpenAI's ``response.*`` events, each with
its ``sequence_number``, derived from the database so that a reconnect
(``GET /v1/responses/{id}?stream=true&starting_after=N``) gets the same events under the
same numbers, after a server or relay restart too.

The opening events (``response.created``, ``response.in_progress``) show the response as
it began; once its run settles (ends, or waits for the caller's function calls), each
output item follows (added, its text or arguments whole, done), then the closing event
(``response.completed``, ``.incomplete`` or ``.failed``). Text comes as one delta per
message: the relay records a model's answer whole, it does not stream tokens.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from outbox.server.wakeups import FALLBACK_S, Wakeups, Watch

Row = dict[str, Any]
SETTLED = ("completed", "failed", "cancelled", "incomplete")
POLL_S = (0.05, 1.0)  # first and longest wait between looks at a response still running
WAIT_S = 600.0  # how long a request waits for its response to settle
# A run's statuses after which its response has not settled: a notification of one of
# them wakes no request waiting for the response (it would read it for nothing).
UNSETTLING = frozenset({"queued", "in_progress"})


async def settled(read: Callable[[], Awaitable[Row]], watch: Watch, wait_s: float = WAIT_S) -> Row:
    """The response once it settled, or as it is after ``wait_s``. Read again when its run
    changed (``watch``: the run's notification), polling with a growing pause only when
    nobody listens (``server.wakeups``). A ``primed`` watch needs no read before its first
    change."""
    deadline, pause = time.monotonic() + wait_s, POLL_S[0]
    if watch.primed:
        await watch.changed(pause, listened_s=min(FALLBACK_S, wait_s))
    while True:
        watch.clear()  # before the read: a change during it wakes the wait below
        shown = await read()
        left = deadline - time.monotonic()
        if shown["status"] in SETTLED or left <= 0:
            return shown
        await watch.changed(min(pause, left), listened_s=min(FALLBACK_S, left))
        pause = min(POLL_S[1], pause * 2)


def opening(shown: Row) -> list[Row]:
    begun = {**shown, "status": "queued" if shown["background"] else "in_progress"}
    begun.update(output=[], error=None, incomplete_details=None)
    return [{"type": "response.created", "response": begun},
            {"type": "response.in_progress", "response": begun}]  # fmt: skip


def closing(shown: Row) -> list[Row]:
    events: list[Row] = []
    for index, item in enumerate(shown["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            start = {**item, "status": "in_progress", "content": []}
            at = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": start},
                {"type": "response.content_part.added", **at,
                 "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **at, "delta": part["text"],
                 "logprobs": []},
                {"type": "response.output_text.done", **at, "text": part["text"],
                 "logprobs": []},
                {"type": "response.content_part.done", **at, "part": part},
            ]  # fmt: skip
        else:
            start = {**item, "status": "in_progress", "arguments": ""}
            at = {"item_id": item["id"], "output_index": index}
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": start},
                {"type": "response.function_call_arguments.delta", **at,
                 "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **at,
                 "arguments": item["arguments"], "name": item["name"]},
            ]  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    last = {"completed": "response.completed", "incomplete": "response.incomplete"}
    events.append({"type": last.get(shown["status"], "response.failed"), "response": shown})
    return events


async def stream(
    read: Callable[[], Awaitable[Row]],
    hub: Wakeups,
    run_id: uuid.UUID,
    starting_after: int = -1,
) -> AsyncIterator[Row]:
    """The response's events after ``starting_after``, as SSE messages; woken by changes
    of its run (``run_id``) that can settle it: after the opening events (read at once),
    the stream has nothing to send until then (``UNSETTLING`` wakes nobody)."""
    with hub.watch(run_id, UNSETTLING) as watch:
        async for event in _events(read, watch, starting_after):
            yield event


async def _events(
    read: Callable[[], Awaitable[Row]], watch: Watch, starting_after: int
) -> AsyncIterator[Row]:
    first = await read()
    number = 0
    for event in opening(first):
        if number > starting_after:
            yield _sse(event, number)
        number += 1
    for event in closing(await settled(read, watch)):
        if number > starting_after:
            yield _sse(event, number)
        number += 1


def _sse(event: Row, number: int) -> Row:
    return {"event": event["type"], "data": json.dumps({**event, "sequence_number": number})}
