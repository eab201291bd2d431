"""Compaction: the model turn that keeps a long run inside its model's window.

Before a turn's request, its size is estimated (``outbox.context.estimate``, and the
model's own count of the previous turn plus what came since, ``context.reported``; a
cheap bound first, so a run far inside its budget pays nothing). When it would pass the
run's budget, or when the model answers OpenAI's ``context_length_exceeded`` anyway, and
the run compacts (``outbox.context.mode``), the oldest turns are summarised by the run's own
model: a request with ``context.SUMMARY_INSTRUCTION`` as its instructions, the previous
summary and the turns to replace, and no tools. The turn's request then carries the run's
instructions, the new summary and the latest turns, cut at a turn boundary so a call and
its result stay together. A history too long for one summary request is summarised in
chunks, each summary folding in the one before.

The design choice: the compaction is part of the ``model_turn`` row whose request needed
it, not an outbox row of its own. That row is claimed and leased like any turn; the
summary is recorded by the completer in the transaction that records the turn
(``compactions``, unique per run and step), so a relay killed mid-way (the summary asked,
nothing recorded) asks again on the next attempt and exactly one summary is kept. The
summary's tokens are added to the turn's usage, so budgets, metrics and the turn's span
count them; the ``compactions`` row keeps them apart, with the estimates before and after.

A turn sent without a compaction keeps nothing of its request while it waits (seconds to
minutes, thousands of runs at once): after a context-length refusal its history is read
again (``again``: the preparer's batched read), which is what it would have kept. The
thread does not change meanwhile: its run is active and this turn's step not recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from outbox import context, failpoints, history, providers
from outbox.relay.preparer import Turn
from outbox.schemas import ModelTurnIn

CHUNK_SHARE = 0.6  # of the budget, the text of the turns one summary request replaces at most
KEEP_SHARE = 0.4  # of the budget, the text of the latest turns kept verbatim at most


@dataclass(frozen=True)
class Compacted:
    """A compaction made for a turn: to record with it (``row``)."""

    summary: str
    through_seq: int
    tokens_before: int
    tokens_after: int
    input_tokens: int
    output_tokens: int

    def row(self, run: dict[str, Any], step_no: int) -> dict[str, Any]:
        return {
            "tenant_id": run["tenant_id"],
            "thread_id": str(run["thread_id"]),
            "run_id": str(run["id"]),
            "step_no": step_no,
            "through_seq": self.through_seq,
            "summary": self.summary,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


def too_long(err: Exception) -> bool:
    """Whether a model's error answer is OpenAI's ``context_length_exceeded``."""
    response = getattr(err, "response", None)
    return (
        getattr(err, "status_code", None) == 400
        and response is not None
        and context.CONTEXT_LENGTH_EXCEEDED.encode() in response.content
    )


async def call(
    post: providers.Post,
    turn: Turn,
    step_no: int,
    again: Callable[[], Awaitable[Turn | str]],
) -> tuple[ModelTurnIn, Compacted | None]:
    """The turn's model call (``providers.call``), compacted first when it would pass its
    budget, or once when the model says it is too long (its history read again with
    ``again``); the compaction made.

    The turn's history and tools are taken out of ``turn`` (``Turn.take_request``) as its
    request is sent, so that nothing holds them while the answer is awaited (the largest
    part of what a run in flight would keep, for seconds to minutes)."""
    window = turn.window
    compacts = window is not None and window.mode == "compact"
    if window is not None and compacts:
        run, messages, tools = turn.run, turn.messages, turn.tools
        counted = context.reported(messages, window.last_input_tokens) or 0
        if counted > window.budget or not context.surely_within(messages, window.budget):
            body = providers.ADAPTERS[run["api"]].request(run, messages, tools)
            before = max(counted, context.estimate(body))
            if before > window.budget:
                return await _compacted_call(post, turn, step_no, before)
        del messages, tools
    del window
    try:
        return await providers.call(post, turn.run, step_no, *turn.take_request()), None
    except Exception as err:
        if not compacts or not too_long(err):
            raise
        read = await again()
        if isinstance(read, str) or read.window is None:  # the run ended meanwhile
            raise
        # The history as this turn's target takes it (a read routed elsewhere is not sent
        # there: the refusal came from here).
        chat = read.window.messages
        if read.window.summary is not None:
            chat = [context.summary_item(read.window.summary), *chat]
        messages, _ = history.for_provider(chat, turn.run["api"])
        turn = Turn(turn.run, messages, read.tools, turn.choice, read.window)
        request = providers.ADAPTERS[turn.run["api"]].request(turn.run, messages, read.tools)
        return await _compacted_call(post, turn, step_no, context.estimate(request), err)


async def _compacted_call(
    post: providers.Post,
    turn: Turn,
    step_no: int,
    before: int,
    refusal: Exception | None = None,
) -> tuple[ModelTurnIn, Compacted | None]:
    """The turn's call with its oldest turns summarised first, its usage counting the
    summary's; after a ``refusal``, that refusal again when there is nothing to summarise."""
    messages, compacted = await _compact(post, turn, step_no, before)
    if compacted is None and refusal is not None:  # nothing older than the latest turn
        raise refusal
    tools = turn.take_request()[1]
    answer = await providers.call(post, turn.run, step_no, messages, tools)
    if compacted is not None:
        answer = answer.model_copy(
            update={
                "input_tokens": answer.input_tokens + compacted.input_tokens,
                "output_tokens": answer.output_tokens + compacted.output_tokens,
            }
        )
    return answer, compacted


async def _compact(
    post: providers.Post, turn: Turn, step_no: int, before: int
) -> tuple[list[dict[str, Any]], Compacted | None]:
    """The turn's messages with its oldest turns summarised, and the compaction; the
    messages unchanged (and None) when there is no turn but the latest."""
    window = turn.window
    assert window is not None
    chars = window.budget * context.CHARS_PER_TOKEN
    chat = window.messages
    end = context.cut(chat, int(chars * KEEP_SHARE))
    if end == 0:
        return turn.messages, None
    summary = window.summary
    input_tokens = output_tokens = 0
    start = 0
    while start < end:
        stop = _chunk_end(chat, start, end, int(chars * CHUNK_SHARE))
        answer = await _summarise(post, turn, step_no, summary, chat[start:stop])
        summary = answer.content or ""
        input_tokens += answer.input_tokens
        output_tokens += answer.output_tokens
        start = stop
    if not summary:
        raise ValueError("the model answered the summary request without text")
    failpoints.hit("compaction.after_summary")
    api = turn.run["api"]
    messages, _ = history.for_provider([context.summary_item(summary), *chat[end:]], api)
    after = context.estimate(providers.ADAPTERS[api].request(turn.run, messages, turn.tools))
    compacted = Compacted(
        summary=summary,
        through_seq=window.seqs[end - 1],
        tokens_before=before,
        tokens_after=after,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
    return messages, compacted


def _chunk_end(chat: list[dict[str, Any]], start: int, end: int, most_chars: int) -> int:
    """Where one summary request's turns end: the furthest turn boundary up to ``end``
    whose turns since ``start`` hold at most ``most_chars`` of text, at least one turn."""
    chosen, chars = 0, 0
    for i in range(start, end):
        if i > start and chat[i].get("role") != "tool":
            if chosen and chars > most_chars:
                break
            chosen = i
        chars += context.text_chars([chat[i]])
    return end if chars <= most_chars or not chosen else chosen


async def _summarise(
    post: providers.Post,
    turn: Turn,
    step_no: int,
    summary: str | None,
    chunk: list[dict[str, Any]],
) -> ModelTurnIn:
    """Ask the run's model for a summary of ``chunk`` after the previous ``summary``."""
    earlier = [context.summary_item(summary)] if summary else []
    asked = [*earlier, *chunk, {"role": "user", "content": context.SUMMARY_REQUEST}]
    run = {**turn.run, "instructions": context.SUMMARY_INSTRUCTION, "model_options": {}}
    messages, _ = history.for_provider(asked, run["api"])
    return await providers.call(post, run, step_no, messages, {})
