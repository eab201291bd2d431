"""Model turns: build the thread's history, call the model, hand back the turn to record.

The relay owns the agent loop. A ``model_turn`` row carries a step number; its executor
reads the run and the thread's history (replayed so every call has its result), calls an
OpenAI-compatible server through the ``openai`` SDK with the run's tools, and returns the
response as a ``ModelTurnIn``. The completer records it with ``writer.record_model_turn``
in a fenced transaction, with the batch of tool-call intents and their outbox rows. Only
one response is ever recorded per (run, step) (a unique constraint): a crash before the
record may call the model again, never record twice; a turn already recorded is reused.

The call is a coroutine on the relay's event loop (``relay.engine``) through ``AsyncOpenAI``:
a turn waiting seconds for its model holds no thread and no database connection. The two
provider adapters, chosen per run (``api``), live in ``outbox.providers``: the Responses
API (``function_call`` and ``function_call_output`` items) and chat completions
(``tool_calls``), with the history and tool-list conversions. 429, 5xx, timeouts
and connection errors retry with backoff, or after what a ``Retry-After`` header asks;
other 4xx answers fail the run with reason ``model_error`` (sending the same request
again would not help).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import openai
from pydantic import ValidationError

from outbox import providers
from outbox.errors import OutboxError
from relay import failpoints
from relay.outcomes import Claimed, Outcome, retry, retry_after_s
from relay.preparer import Turn, step_of

MODEL_TIMEOUT_S = float(os.environ.get("OUTBOX_MODEL_TIMEOUT_S", "120"))  # per request
RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APIConnectionError,
    openai.APITimeoutError,
)


def retry_after(err: Exception) -> float | None:
    """What the ``Retry-After`` header of a failed model call asks, if anything."""
    response = getattr(err, "response", None)
    return retry_after_s(response.headers.get("retry-after") if response is not None else None)


class ModelExecutor:
    """Runs ``model_turn`` rows on the engine's event loop.

    ``prepare`` reads what the call needs (batched with other turns', ``relay.preparer``);
    ``clients`` lends an ``AsyncOpenAI`` for a base URL (``relay.engine``: a place on one
    of many small pools, so thousands of requests in flight never share one pool's scan).
    """

    def __init__(
        self,
        prepare: Callable[[Claimed], Awaitable[Turn | str]],
        clients: Callable[[str | None], AbstractAsyncContextManager[openai.AsyncOpenAI]],
    ) -> None:
        self.prepare = prepare
        self.clients = clients
        # Base URLs whose server asked, with Retry-After, that nobody call before a moment
        # (monotonic seconds): their turns wait without calling, and without a charge.
        self.held_until: dict[str | None, float] = {}

    async def run(self, row: Claimed) -> Outcome:
        step_no = step_of(row)
        prepared = await self.prepare(row)
        if isinstance(prepared, str):
            return Outcome(row, "skip", error=prepared)
        run, messages, tools = prepared.run, prepared.messages, prepared.tools
        base_url = run["base_url"]
        hold = self.held_until.get(base_url, 0.0) - time.monotonic()
        if hold > 0:
            return Outcome(
                row, "defer", error=f"{base_url} asked to wait (Retry-After)", delay_s=hold
            )
        try:
            async with self.clients(base_url) as client:
                turn = await providers.call(client, run, step_no, messages, tools)
        except RETRYABLE as err:
            error = f"model call failed: {type(err).__name__}: {err}"
            return self._retry(row, base_url, error, err)
        except openai.APIStatusError as err:
            if err.status_code >= 500:
                return self._retry(
                    row, base_url, f"model answered HTTP {err.status_code}: {err.message}", err
                )
            return Outcome(row, "fail_run", error=f"model refused the request: {err.message}")
        except (ValidationError, OutboxError, KeyError, TypeError, ValueError) as err:
            error = f"model response cannot be recorded: {type(err).__name__}: {err}"
            return Outcome(row, "fail_run", error=error)
        failpoints.hit("model.after_call")
        return Outcome(row, "turn", output=turn)

    def _retry(self, row: Claimed, base_url: str | None, error: str, err: Exception) -> Outcome:
        """Try the turn again later; when the server said how long to wait, every turn of
        that base URL waits as long."""
        delay = retry_after(err)
        if delay:
            self.held_until[base_url] = max(
                self.held_until.get(base_url, 0.0), time.monotonic() + delay
            )
        return retry(row, error, delay)
